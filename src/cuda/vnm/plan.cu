// Host side of the V:N:M SpMM: device weights, plan creation (validation, kernel choice) and run().
// The kernels are the nm24 ones run on the condensed 2:4 weight with B read through the gather table.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "../common/check.cuh"
#include "../nm24/nm24_common.cuh"
#include "nmkit/gpu/vnm_spmm.hpp"

namespace nmkit::gpu {
namespace {

int gather_block_rows(int v) { return std::min(v, kPackRowAlign); }
int b_tiles_per_stage(int v) { return kPackRowAlign / gather_block_rows(v); }
int64_t condensed_width(int64_t cols, int m) { return 4 * ceil_div(cols, int64_t{m}); }  // K'

}  // namespace

DeviceVnm DeviceVnm::from_parts(DeviceNm24 condensed, const std::vector<int32_t>& gather, int64_t cols, int v, int m) {
  check_vnm_pattern(v, 2, m);
  require(vnm_kernel_supports_v(v), ErrorCode::unsupported, [&] {
    return "DeviceVnm: the gathering kernels run V = 32, 64 or a multiple of 128, got V=" + std::to_string(v);
  });
  const int64_t table_blocks = condensed.rows_padded() / gather_block_rows(v);
  require(cols >= 1 && condensed.cols() == 4 * ceil_div(cols, m) &&
              gather.size() == static_cast<std::size_t>(table_blocks * condensed.cols_padded()),
          ErrorCode::invalid_argument, "DeviceVnm: condensed matrix or gather table does not match R x K");
  for (const int32_t k : gather)
    require(k == kNoBRow || (k >= 0 && k < cols), ErrorCode::invalid_argument, [&] {
      return "DeviceVnm: gather table entry " + std::to_string(k) + " is not a row of B (K=" + std::to_string(cols) +
             ")";
    });
  DeviceBuffer table(gather.size() * sizeof(int32_t));
  table.copy_from_host(gather.data(), table.size());
  const int64_t rows = condensed.rows();
  DeviceVnm w(std::move(condensed), std::move(table));
  w.rows_ = rows, w.cols_ = cols, w.v_ = v, w.m_ = m;
  return w;
}

DeviceVnm DeviceVnm::from_full_2_4(DeviceNm24 full, int v, int m) {
  check_vnm_pattern(v, 2, m);
  resolve_vnm_form(VnmForm::full_2_4, v, m);  // M % 4 == 0
  const int64_t rows = full.rows(), cols = full.cols();
  DeviceVnm w(std::move(full), DeviceBuffer());
  w.rows_ = rows, w.cols_ = cols, w.v_ = v, w.m_ = m, w.form_ = VnmForm::full_2_4;
  return w;
}

DeviceVnm DeviceVnm::upload(const PackedVnm& packed) {
  require(packed.condensed.rows == packed.rows, ErrorCode::invalid_argument,
          "DeviceVnm::upload: condensed matrix does not match R");
  if (packed.form == VnmForm::full_2_4) {
    require(packed.condensed.cols == packed.cols && packed.gather.empty(), ErrorCode::invalid_argument,
            "DeviceVnm::upload: a full_2_4 weight is an R x K 2:4 matrix without a gather table");
    return from_full_2_4(DeviceNm24::upload(packed.condensed), packed.v, packed.m);
  }
  return from_parts(DeviceNm24::upload(packed.condensed), packed.gather, packed.cols, packed.v, packed.m);
}

namespace {

// Whether an automatic plan takes the skinny kernel: on Hopper at decode sizes, unless a choice of the sm90 kernel
// was pinned.
bool takes_skinny(const SpmmDesc& desc, int m, const Nm24Options& options, bool sm90_device) {
  return options.kernel == Nm24Kernel::automatic && sm90_device && !nm24::sm90_choice_pinned(options) &&
         nm24::vnm_skinny_takes(desc.rows, condensed_width(desc.cols, m), desc.n, desc.b_layout == Layout::col_major);
}

// The condensed form's kernel: sm90 wgmma.sp gathering B while staging it, the skinny kernel gathering B's elements
// at decode sizes, or the portable mma.sp kernel.
KernelConfig gather_config(const SpmmDesc& desc, int v, int m, const Nm24Options& options) {
  require(vnm_kernel_supports_v(v), ErrorCode::unsupported, [&] {
    return "vnm plan: the gathering kernels run V = 32, 64 or a multiple of 128, got V=" + std::to_string(v);
  });
  const int64_t condensed_cols = condensed_width(desc.cols, m);
  const bool sm90_device = nm24::sm90_compiled() && nm24::device_is_sm90();
  if (options.kernel == Nm24Kernel::sm80_mma_sp_skinny || takes_skinny(desc, m, options, sm90_device)) {
    const KernelConfig config = nm24::skinny_config(desc, condensed_cols, options, sm90_device, "vnm plan");
    require(config.block_n <= nm24::kSkinnyMaxGatheredBlockN, ErrorCode::invalid_argument, [&] {
      return "vnm plan: the skinny kernel gathers B with block_n 8 or 16, got " + std::to_string(config.block_n);
    });
    return config;
  }
  const int b_tiles = b_tiles_per_stage(v);
  // sm90: one or two gathered B tiles per stage (the wgmma's 64 rows must share their B rows, so V >= 64);
  // B row-major is copied in 16-byte pieces of rows (ldb % 8 == 0), B col-major element by element.
  const bool sm90_possible = nm24::sm90_compiled() && nm24::device_is_sm90() && b_tiles <= 2 &&
                             (desc.b_layout == Layout::col_major || nm24::b_leading_dim(desc) % 8 == 0);
  Nm24Kernel kernel = options.kernel;
  if (kernel == Nm24Kernel::automatic) kernel = sm90_possible ? Nm24Kernel::sm90_wgmma_sp : Nm24Kernel::sm80_mma_sp;
  require(kernel != Nm24Kernel::sm90_wgmma_sp || sm90_possible, ErrorCode::unsupported,
          "vnm plan: the sm90 wgmma.sp kernel needs an sm_90 device, a build with sm_90a, V >= 64 and, for B "
          "row-major, its leading dimension (ldb, else C) a multiple of 8");
  nm24::TileShape t = nm24::sm80_tile_shape();
  // Split-K is built for the row gather's n-tiles of 64 with one B tile per stage (decode-sized C).
  const bool split_k_built = kernel == Nm24Kernel::sm90_wgmma_sp && desc.b_layout == Layout::row_major && b_tiles == 1;
  if (kernel == Nm24Kernel::sm90_wgmma_sp) {
    const auto choices = b_tiles == 1 ? std::span<const nm24::BlockNChoice>(nm24::kGatherOneTileBlockN)
                                      : std::span<const nm24::BlockNChoice>(nm24::kGatherTwoTilesBlockN);
    const bool split_by_shape = split_k_built && options.schedule == Sm90Schedule::automatic;
    const int block_n = options.block_n != 0
                            ? options.block_n
                            : nm24::sm90_block_n(desc.rows, condensed_cols, desc.n, nm24::device_facts().sm_count,
                                                 choices, split_by_shape ? nm24::SplitK::by_shape : nm24::SplitK::off);
    t = nm24::sm90_gather_tile_shape(block_n, b_tiles);
  } else {
    t.smem_bytes *= b_tiles;  // one gathered B tile per row block of the CTA
  }
  KernelConfig config = nm24::config_of(kernel, t);
  nm24::choose_sm90_schedule(desc, options, ceil_div(condensed_cols, int64_t{kPackKAlign}),
                             split_k_built && t.block_n <= nm24::kMaxSplitBlockN, config);
  if (config.split > 1)
    nm24::take_tile_shape(nm24::sm90_gather_tile_shape(t.block_n, b_tiles, /*split_k=*/true), config);
  // The gathering kernel's own raster where none was pinned.
  if (kernel == Nm24Kernel::sm90_wgmma_sp && config.raster_rows == 0)
    config.raster_rows = nm24::sm90_gather_group_rows(condensed_cols, nm24::device_facts().l2_bytes);
  return config;
}

}  // namespace

VnmSpmmPlan VnmSpmmPlan::create(const SpmmDesc& desc, int v, int m, const Nm24Options& options, VnmForm form) {
  nm24::check_desc(desc, "vnm plan");
  nm24::check_options(options, "vnm plan");
  check_vnm_pattern(v, 2, m);
  const VnmForm preferred = resolve_vnm_form(form, v, m, desc.b_layout);  // throws for full_2_4 with M % 4 != 0
  // An automatic plan also takes the other form where it exists: the weight's form was fixed at pack time.
  const bool automatic = form == VnmForm::automatic;
  const bool full = preferred == VnmForm::full_2_4 || (automatic && m % 4 == 0);
  const bool condensed = preferred == VnmForm::condensed || (automatic && vnm_kernel_supports_v(v));

  VnmSpmmPlan plan;
  plan.desc_ = desc, plan.v_ = v, plan.m_ = m, plan.form_ = automatic ? VnmForm::automatic : preferred;
  if (full) plan.full_ = Nm24SpmmPlan::create(desc, options);  // a plain 2:4 product over all of K, any V
  if (condensed) plan.gather_ = gather_config(desc, v, m, options);
  plan.config_ = preferred == VnmForm::full_2_4 ? plan.full_->config() : *plan.gather_;
  return plan;
}

VnmSpmmPlan VnmSpmmPlan::for_tokens(int64_t n, int64_t ldb) const {
  require(n >= 0, ErrorCode::invalid_argument, [&] { return "vnm plan: C must be >= 0, got " + std::to_string(n); });
  VnmSpmmPlan plan = *this;
  plan.desc_.n = n, plan.desc_.ldb = ldb;
  nm24::check_b_shape(plan.desc_, "vnm plan");
  if (plan.full_) plan.full_ = plan.full_->for_tokens(n, ldb);
  const bool element_gather = desc_.b_layout == Layout::col_major;
  if (plan.gather_ && !nm24::sm90_config_takes_tokens(plan.desc_, *plan.gather_, element_gather)) {
    nm24::TileShape t = nm24::sm80_tile_shape();
    t.smem_bytes *= b_tiles_per_stage(v_);  // one gathered B tile per row block of the CTA
    plan.gather_ = nm24::config_of(Nm24Kernel::sm80_mma_sp, t);
  }
  // As create(): the form pack_vnm picks for this B layout.
  const bool full_form = resolve_vnm_form(form_, v_, m_, desc_.b_layout) == VnmForm::full_2_4;
  plan.config_ = full_form ? plan.full_->config() : *plan.gather_;
  return plan;
}

bool VnmSpmmPlan::takes_skinny_kernel(int64_t rows, int64_t cols, int m, int64_t n, Layout b_layout) {
  // The shape first: a layer asks on every run, and past decode sizes without a device query.
  return nm24::vnm_skinny_takes(rows, condensed_width(cols, m), n, b_layout == Layout::col_major) &&
         nm24::sm90_compiled() && nm24::device_is_sm90();
}

const KernelConfig& VnmSpmmPlan::config_for(const DeviceVnm& a) const {
  if (a.form() == VnmForm::full_2_4) {
    require(full_.has_value(), ErrorCode::invalid_argument, "vnm plan: a full_2_4 weight needs M % 4 == 0");
    return full_->config();
  }
  require(gather_.has_value(), ErrorCode::invalid_argument, "vnm plan: the gathering kernels do not run this V");
  return *gather_;
}

void VnmSpmmPlan::run(Stream stream, const DeviceVnm& a, const void* b, const void* c, void* d,
                      const float* bias) const {
  require(a.rows() == desc_.rows && a.cols() == desc_.cols && a.dtype() == desc_.dtype && a.v() == v_ && a.m() == m_,
          ErrorCode::invalid_argument, [&] {
            return "vnm run: weight is " + std::to_string(a.rows()) + "x" + std::to_string(a.cols()) + " " +
                   dtype_name(a.dtype()) + " " + std::to_string(a.v()) + ":2:" + std::to_string(a.m()) +
                   ", the plan was made for " + std::to_string(desc_.rows) + "x" + std::to_string(desc_.cols) + " " +
                   dtype_name(desc_.dtype) + " " + std::to_string(v_) + ":2:" + std::to_string(m_);
          });
  require(a.form() == form_ || form_ == VnmForm::automatic, ErrorCode::invalid_argument, [&] {
    return std::string("vnm run: the weight is in the ") + vnm_form_name(a.form()) +
           " form, the plan was made for the " + vnm_form_name(form_) + " form";
  });
  if (a.form() == VnmForm::full_2_4) {
    require(full_.has_value(), ErrorCode::invalid_argument, "vnm run: a full_2_4 weight needs M % 4 == 0");
    return full_->run(stream, a.condensed(), b, c, d, bias);
  }
  require(gather_.has_value(), ErrorCode::invalid_argument,
          "vnm run: the gathering kernels do not run this weight's V");
  if (desc_.n == 0) return;
  nm24::check_operands(desc_, b, c, d, bias, "vnm run");

  nm24::Params p = nm24::make_params(desc_, a.condensed(), b, c, d, bias);
  p.b_gather = a.gather(), p.gather_stride = a.gather_stride(), p.gather_block_rows = gather_block_rows(v_);
  nm24::apply_sm90_schedule(*gather_, d, p);
  const bool vector_b = nm24::b_vector_loads(desc_, b);
  // Row-major B is gathered by 16-byte copies: an unaligned B takes the portable kernel.
  const bool sm90 = gather_->kernel == Nm24Kernel::sm90_wgmma_sp && (desc_.b_layout == Layout::col_major || vector_b);
  const bool skinny = gather_->kernel == Nm24Kernel::sm80_mma_sp_skinny;
  nm24::dispatch_types(desc_, [&]<class Element, class Out>() {
    if (sm90)
      nm24::launch_sm90_gather<Element, Out>(p, gather_->block_n, desc_.b_layout, nm24::launch_on(*gather_, stream));
    else if (skinny)  // B staged element by element through the table, any layout
      nm24::launch_skinny<Element, Out>(p, gather_->block_m, gather_->block_n, nm24::SkinnyB::gathered,
                                        nm24::launch_on(*gather_, stream));
    else
      nm24::launch_sm80<Element, Out>(p, desc_.b_layout, vector_b, stream);
  });
}

}  // namespace nmkit::gpu
