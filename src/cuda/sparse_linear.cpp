// SparseLinear: one device weight of any GPU format and a plan per token bucket, behind y = act(x W^T + bias).
// Host code only: it packs, uploads and dispatches to the families' plan/run APIs (the 8-bit 2:4 one after the
// per-token quantizer).
#include "nmkit/gpu/sparse_linear.hpp"

#include <algorithm>
#include <deque>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <variant>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_8bit_spmm.hpp"
#include "nmkit/gpu/detail/quantize_tokens.hpp"
#include "nmkit/gpu/detail/token_buckets.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/util/overloaded.hpp"
#include "transpose.hpp"

namespace nmkit::gpu {

using detail::DeviceNm24x8;
using detail::Nm24x8SpmmPlan;

namespace {

// The 8-bit kernel reads x's codes by TMA, whose rows are 16-byte strides (the 8-bit plan's rule, checked before
// upload so that a machine without a GPU names it too).
constexpr int64_t kQuantizedColumnAlign = 16;

// The 8-bit plan has no for_tokens: a run with fewer tokens than its bucket's plan remakes that plan for its T with
// the bucket's choices pinned (kernel, tile, split-K, overlap; the sm90 kernel's schedule and raster), which is what
// for_tokens keeps.
Nm24Options pinned_choices(const KernelConfig& c) {
  Nm24Options o;
  o.kernel = c.kernel, o.block_n = c.block_n, o.split = c.split, o.overlap_launch = c.overlap_launch;
  if (c.kernel == Nm24Kernel::sm80_mma_sp_skinny) {
    o.block_m = c.block_m;
    return o;
  }
  o.raster_rows = c.raster_rows;
  o.schedule = c.split > 1 || !c.register_epilogue ? Sm90Schedule::staged
               : c.persistent_ctas > 0             ? Sm90Schedule::persistent
                                                   : Sm90Schedule::registers;
  return o;
}

// The product's D for y in `layout`: token-major y[T, R] is D (R x T) col-major, feature-major y^T is D row-major.
Layout d_layout_of(ActivationLayout y) {
  return y == ActivationLayout::token_major ? Layout::col_major : Layout::row_major;
}

// The 8-bit product y^T (R x T) = W (R x K) x^T, x as codes and per-token scales, y in x's dtype.
detail::QuantizedSpmmDesc quantized_desc(int64_t rows, int64_t cols, int64_t tokens, QuantType type, DType dtype,
                                         bool bias, Activation activation, Layout d_layout) {
  detail::QuantizedSpmmDesc d;
  d.rows = rows, d.cols = cols, d.n = tokens;
  d.type = type, d.out_dtype = dtype, d.d_layout = d_layout;
  d.bias = bias, d.activation = activation;
  return d;
}

// An 8-bit bucket: the plan made for its largest T and the plan of the last T run in it (kept, so that a run
// repeating its T makes nothing; one per bucket, so that a serving loop's plans stay bounded).
struct Nm24x8Plans {
  Nm24x8SpmmPlan bucket;
  std::optional<Nm24x8SpmmPlan> last;

  const Nm24x8SpmmPlan& for_tokens(int64_t tokens) {
    if (bucket.desc().n == tokens) return bucket;
    if (last && last->desc().n == tokens) return *last;
    detail::QuantizedSpmmDesc d = bucket.desc();
    d.n = tokens;
    last = Nm24x8SpmmPlan::create(d, pinned_choices(bucket.config()));
    return *last;
  }
};

}  // namespace

using DeviceWeight = std::variant<DeviceNm24, DeviceVnm, DeviceTiles, DeviceNm24x8>;
using Plan = std::variant<Nm24SpmmPlan, VnmSpmmPlan, TileSpmmPlan, Nm24x8Plans>;

namespace {

// A condensed V:N:M weight gathers its B rows: from x[T, K] (B col-major) element by element along K, which reads
// all of x whatever the sparsity (0.05-0.93x cuBLAS at T = 4096, 0.72x at T = 16), or from x^T (B row-major) by
// 16-byte copies of rows (2.16x at 128:2:8 and T = 4096, 1.70x at T = 16: H100). So the layer always transposes x
// first (a T x K copy, a few per cent of the product), each row of x^T padded with zeros to a multiple of 8 tokens
// (the copies' 16-byte alignment: B's leading dimension, the product still T tokens wide).
constexpr int64_t kRowCopyTokens = 8;          // x^T's rows: whole 16-byte pieces for the row gather
constexpr uintptr_t kWorkspaceAlignment = 16;  // x^T's rows and the codes are read by 16-byte copies and TMA

}  // namespace

struct SparseLinear::Impl {
  DeviceWeight weight;
  std::string format;
  DType dtype = DType::f16;  // x's and y's
  Activation activation = Activation::none;
  bool bias = false;
  // By token bucket (detail::token_bucket; tiles by token count), times 4, + 2 where D is row-major (y
  // feature-major), + 1 where B is row-major (x transposed, or feature-major).
  std::unordered_map<int64_t, Plan> plans;
  // Tile plans are made per token count. Those without a workspace (every T past the stream kernels' 32) hold only
  // host state, so beyond kKeptTilePlans the least recently used is dropped and remade if its T comes back. Plans
  // with a workspace are kept, as a CUDA graph captured with one may still replay it; they are at most one per
  // T <= 32 and layout pair.
  static constexpr std::size_t kKeptTilePlans = 32;
  std::deque<int64_t> droppable_tile_plans;  // their keys, least recently used first
  // x^T for the row gather, or x's 8-bit codes and scales, grown to the largest T seen. A buffer once used stays
  // allocated while the layer lives, so that CUDA graphs captured with it stay valid.
  std::vector<DeviceBuffer> workspaces;

  // The product y^T (R x T) = W (R x K) x^T (K x T): x token-major (B col-major) or x^T (B row-major: x
  // transposed, its rows padded to a multiple of 8 tokens, or feature-major); D col-major for token-major y,
  // row-major for feature-major y.
  SpmmDesc desc(int64_t tokens, Layout b_layout, Layout d_layout) const {
    SpmmDesc d;
    d.rows = rows(), d.cols = cols(), d.n = tokens;
    d.dtype = d.out_dtype = dtype;
    d.b_layout = b_layout, d.d_layout = d_layout;
    d.bias = bias, d.activation = activation;
    if (b_layout == Layout::row_major) d.ldb = round_up(tokens, kRowCopyTokens);
    return d;
  }
  int64_t rows() const noexcept {
    return std::visit([](const auto& w) { return w.rows(); }, weight);
  }
  int64_t cols() const noexcept {
    return std::visit([](const auto& w) { return w.cols(); }, weight);
  }
  const DeviceNm24x8* quantized() const noexcept { return std::get_if<DeviceNm24x8>(&weight); }

  // The plan made for `tokens`' bucket (detail::token_bucket; tiles plan per token count: their schedules and
  // workspace are made for their C), made on first use; run() gives B's leading dimension for its T.
  Plan& bucket_plan(int64_t tokens, Layout b_layout, Layout d_layout) {
    const int64_t planned = std::holds_alternative<DeviceTiles>(weight) ? tokens : detail::token_bucket(tokens);
    const int64_t key = 4 * planned + (d_layout == Layout::row_major ? 2 : 0) + (b_layout == Layout::row_major ? 1 : 0);
    if (auto it = plans.find(key); it != plans.end()) {
      if (auto used = std::find(droppable_tile_plans.begin(), droppable_tile_plans.end(), key);
          used != droppable_tile_plans.end()) {
        droppable_tile_plans.erase(used);
        droppable_tile_plans.push_back(key);
      }
      return it->second;
    }
    const SpmmDesc d = desc(planned, b_layout, d_layout);
    Plan made = std::visit(
        overloaded{
            [&](const DeviceNm24&) -> Plan { return Nm24SpmmPlan::create(d); },
            [&](const DeviceVnm& w) -> Plan { return VnmSpmmPlan::create(d, w.v(), w.m()); },
            [&](const DeviceTiles& w) -> Plan { return TileSpmmPlan::create(d, w.tile_rows(), w.tile_cols()); },
            [&](const DeviceNm24x8& w) -> Plan {
              return Nm24x8Plans{Nm24x8SpmmPlan::create(quantized_desc(rows(), cols(), planned, w.type(), dtype, bias,
                                                                       activation, d_layout)),
                                 std::nullopt};
            },
        },
        weight);
    const auto* tiles = std::get_if<TileSpmmPlan>(&made);
    const bool droppable = tiles != nullptr && tiles->workspace_bytes() == 0;
    if (droppable && droppable_tile_plans.size() == kKeptTilePlans) {
      plans.erase(droppable_tile_plans.front());
      droppable_tile_plans.pop_front();
    }
    Plan& kept = plans.emplace(key, std::move(made)).first->second;
    if (droppable) droppable_tile_plans.push_back(key);
    return kept;
  }

  // Runs y = the product for `tokens` with its bucket's plan (the 2:4 and V:N:M plans take any C: for_tokens), B
  // with leading dimension ldb (0: x as it is, dense).
  void run(int64_t tokens, Layout b_layout, Layout d_layout, Stream stream, const void* x, void* y, const float* bias,
           int64_t ldb = 0) {
    const Plan& plan = bucket_plan(tokens, b_layout, d_layout);
    // The bucket's plan where it was made for this T and ldb, else its for_tokens.
    const auto run_plan = [&](const auto& p, const auto& w) {
      if (p.desc().n == tokens && p.desc().ldb == ldb)
        p.run(stream, w, x, nullptr, y, bias);
      else
        p.for_tokens(tokens, ldb).run(stream, w, x, nullptr, y, bias);
    };
    std::visit(overloaded{
                   [&](const Nm24SpmmPlan& p) { run_plan(p, std::get<DeviceNm24>(weight)); },
                   [&](const VnmSpmmPlan& p) { run_plan(p, std::get<DeviceVnm>(weight)); },
                   [&](const TileSpmmPlan& p) { p.run(stream, std::get<DeviceTiles>(weight), x, nullptr, y, bias); },
                   [&](const Nm24x8Plans&) {
                     throw Error(ErrorCode::invalid_argument, "SparseLinear: an 8-bit weight runs on 8-bit x");
                   },
               },
               plan);
  }

  // Runs y = the 8-bit product for `tokens` of x's codes and scales with its bucket's choices.
  void run_quantized(int64_t tokens, Layout d_layout, Stream stream, const uint8_t* codes, const float* scales, void* y,
                     const float* bias) {
    auto& bucket = std::get<Nm24x8Plans>(bucket_plan(tokens, Layout::col_major, d_layout));
    bucket.for_tokens(tokens).run(stream, std::get<DeviceNm24x8>(weight), codes, scales, nullptr, y, bias);
  }

  bool gathers_rows() const {
    const auto* vnm = std::get_if<DeviceVnm>(&weight);
    return vnm != nullptr && vnm->form() == VnmForm::condensed;
  }
  static int64_t feature_ld(int64_t tokens, const RunLayout& layout) { return layout.ldx > 0 ? layout.ldx : tokens; }

  // How a run gets the B it reads from x (B col-major is x token-major, B row-major is x^T):
  enum class XPath {
    as_given,      // token-major x as B col-major, or feature-major x as the row gather's B (ldx % 8 == 0)
    transposed,    // token-major x into x^T for the row gather (its rows padded to a multiple of 8 tokens)
    repadded,      // feature-major x into x^T with rows padded to a multiple of 8 tokens, for the row gather
    untransposed,  // feature-major x into token-major x for the other kernels: B row-major lacks their narrow
                   // n-tiles and split-K (2:4 read x^T in place at 0.73x its speed at T = 16, 0.94x at 4096: H100)
  };
  XPath x_path(int64_t tokens, const RunLayout& layout) const {
    const bool token_major = layout.x == ActivationLayout::token_major;
    if (!gathers_rows()) return token_major ? XPath::as_given : XPath::untransposed;
    // Where the skinny kernel beats the row gather on x^T (decode sizes, small weights), it gathers x's elements in
    // place in either layout.
    const auto& w = std::get<DeviceVnm>(weight);
    if (VnmSpmmPlan::takes_skinny_kernel(w.rows(), w.cols(), w.m(), tokens, Layout::row_major)) return XPath::as_given;
    if (token_major) return XPath::transposed;
    return feature_ld(tokens, layout) % kRowCopyTokens == 0 ? XPath::as_given : XPath::repadded;
  }
  // B's leading dimension for the row gather (its x^T rows), 0 where the product reads token-major x; path is
  // x_path(tokens, layout), asked once per call (it may query the device).
  static int64_t b_ld(int64_t tokens, const RunLayout& layout, XPath path) {
    switch (path) {
      case XPath::transposed:
      case XPath::repadded:
        return round_up(tokens, kRowCopyTokens);
      case XPath::as_given:
        return layout.x == ActivationLayout::feature_major ? feature_ld(tokens, layout) : 0;
      case XPath::untransposed:
        return 0;
    }
    return 0;
  }
  std::size_t workspace_bytes(int64_t tokens, const RunLayout& layout) const {
    // x's codes, then its scales: K % 16 == 0 keeps the scales 16-byte aligned behind T * K bytes of codes.
    if (quantized()) return static_cast<std::size_t>(tokens * cols()) + tokens * sizeof(float);
    const XPath path = x_path(tokens, layout);
    if (path == XPath::as_given) return 0;
    const int64_t tokens_stored = path == XPath::untransposed ? tokens : b_ld(tokens, layout, path);
    return static_cast<std::size_t>(tokens_stored * cols()) * dtype_size(dtype);
  }

  // One run on `scratch` (workspace_bytes of the tokens and layout): x quantized into it (8-bit), or x^T or x made
  // in it as x_path says.
  void run_on(Stream stream, const void* x, void* y, int64_t tokens, const float* bias, void* scratch,
              const RunLayout& layout) {
    const Layout d_layout = d_layout_of(layout.y);
    if (const DeviceNm24x8* w = quantized()) {
      const auto code_bytes = static_cast<std::size_t>(tokens * cols());
      auto* codes = static_cast<uint8_t*>(scratch);
      auto* scales = reinterpret_cast<float*>(codes + code_bytes);
      detail::quantize_tokens(stream, x, dtype, tokens, cols(), w->type(), codes, scales);
      return run_quantized(tokens, d_layout, stream, codes, scales, y, bias);
    }
    const XPath path = x_path(tokens, layout);
    const int64_t ldb = b_ld(tokens, layout, path);
    switch (path) {
      case XPath::as_given:
        return run(tokens, ldb > 0 ? Layout::row_major : Layout::col_major, d_layout, stream, x, y, bias, ldb);
      case XPath::transposed:
        transpose_16bit(stream, x, cols(), scratch, tokens, cols(), ldb);
        break;
      case XPath::repadded:
        copy_rows_16bit(stream, x, feature_ld(tokens, layout), scratch, ldb, cols(), tokens);
        break;
      case XPath::untransposed:
        transpose_16bit(stream, x, feature_ld(tokens, layout), scratch, cols(), tokens, cols());
        return run(tokens, Layout::col_major, d_layout, stream, scratch, y, bias);
    }
    run(tokens, Layout::row_major, d_layout, stream, scratch, y, bias, ldb);
  }

  void* workspace(std::size_t bytes) {
    if (workspaces.empty() || workspaces.back().size() < bytes) {
      const std::size_t grown = workspaces.empty() ? 0 : 2 * workspaces.back().size();
      workspaces.emplace_back(std::max(bytes, grown));
    }
    return workspaces.back().data();
  }

  // The checks every run makes before it reads a pointer.
  void check_layout(int64_t tokens, const RunLayout& layout, const char* who) const {
    require(layout.x == ActivationLayout::token_major || !quantized(), ErrorCode::unsupported, [&] {
      return std::string(who) + ": an 8-bit weight (" + format + ") quantizes token-major x only (x[T, K] row-major)";
    });
    require(layout.x == ActivationLayout::token_major || layout.ldx == 0 || layout.ldx >= tokens,
            ErrorCode::invalid_argument, [&] {
              return std::string(who) + ": feature-major x needs ldx >= tokens (" + std::to_string(tokens) + "), got " +
                     std::to_string(layout.ldx);
            });
  }
  void check_run(const void* x, const void* y, const float* given_bias, const char* who) const {
    require(x != nullptr && y != nullptr, ErrorCode::invalid_argument,
            [&] { return std::string(who) + ": x and y must not be null"; });
    require(bias == (given_bias != nullptr), ErrorCode::invalid_argument, [&] {
      return bias ? std::string(who) + ": the layer has a bias, but none was given"
                  : std::string(who) + ": a bias was given to a layer made without one";
    });
  }
};

namespace {

DeviceWeight upload(const SparseMatrix& weight) {
  return std::visit(
      overloaded{
          [](const NmMatrix& a) -> DeviceWeight {
            require(a.n == 2 && a.m == 4, ErrorCode::unsupported, [&] {
              return "SparseLinear: an " + std::to_string(a.n) + ":" + std::to_string(a.m) +
                     " weight has no GPU kernel; the sparse tensor cores take 2:4 (or vnm:V:2:M for sparser "
                     "patterns)";
            });
            return DeviceNm24::upload(pack_nm24(a));
          },
          [](const VnmMatrix& a) -> DeviceWeight {
            // The form that pays with x transposed (B row-major): condensed where the row gather beats full 2:4.
            return DeviceVnm::upload(pack_vnm(a, VnmForm::automatic, Layout::row_major));
          },
          [](const TileMatrix& a) -> DeviceWeight { return DeviceTiles::upload(pack_tiles(a)); },
      },
      weight);
}

}  // namespace

SparseLinear::SparseLinear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SparseLinear::SparseLinear(SparseLinear&&) noexcept = default;
SparseLinear& SparseLinear::operator=(SparseLinear&&) noexcept = default;
SparseLinear::~SparseLinear() = default;

SparseLinear SparseLinear::create(const SparseMatrix& weight, Activation activation, bool bias) {
  const DType dtype = dtype_of(weight);
  require(dtype == DType::f16 || dtype == DType::bf16, ErrorCode::unsupported, [&] {
    return std::string("SparseLinear: the GPU kernels take f16 or bf16 weights, got ") + dtype_name(dtype);
  });
  auto impl = std::make_unique<Impl>(Impl{upload(weight), format_name(weight), dtype, activation, bias, {}, {}, {}});
  return SparseLinear(std::move(impl));
}

SparseLinear SparseLinear::create(const QuantizedNmMatrix& weight, DType dtype, Activation activation, bool bias) {
  const std::string type = quant_type_name(weight.type());
  require(weight.n == 2 && weight.m == 4, ErrorCode::unsupported, [&] {
    return "SparseLinear: an 8-bit (" + type + ") " + std::to_string(weight.n) + ":" + std::to_string(weight.m) +
           " weight has no GPU kernel; the 8-bit kernel takes 2:4";
  });
  require(dtype == DType::f16 || dtype == DType::bf16, ErrorCode::unsupported, [&] {
    return std::string("SparseLinear: an 8-bit weight runs on f16 or bf16 x and y, got ") + dtype_name(dtype);
  });
  require(weight.cols % kQuantizedColumnAlign == 0, ErrorCode::unsupported, [&] {
    return "SparseLinear: an 8-bit weight needs in_features (K) a multiple of 16 (the 8-bit kernel reads x's codes "
           "by TMA rows), got " +
           std::to_string(weight.cols);
  });
  const PackedNm24x8 packed = pack_nm24(weight);  // validates the weight, on the host
  // The plan for one token before the upload: a code type, device or build the kernel lacks is named here.
  Nm24x8Plans first{Nm24x8SpmmPlan::create(quantized_desc(weight.rows, weight.cols, 1, weight.type(), dtype, bias,
                                                          activation, Layout::col_major)),
                    std::nullopt};
  auto impl = std::make_unique<Impl>(
      Impl{DeviceNm24x8::upload(packed), format_name(weight) + " " + type, dtype, activation, bias, {}, {}, {}});
  impl->plans.emplace(4 * detail::token_bucket(1), std::move(first));
  return SparseLinear(std::move(impl));
}

std::size_t SparseLinear::workspace_bytes(int64_t tokens, RunLayout layout) const {
  require(tokens >= 0, ErrorCode::invalid_argument,
          [&] { return "SparseLinear::workspace_bytes: tokens must be >= 0, got " + std::to_string(tokens); });
  return impl_->workspace_bytes(tokens, layout);
}

void SparseLinear::run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias) {
  require(tokens >= 0, ErrorCode::invalid_argument,
          [&] { return "SparseLinear::run: tokens must be >= 0, got " + std::to_string(tokens); });
  if (tokens == 0) return;
  impl_->check_run(x, y, bias, "SparseLinear::run");
  const std::size_t bytes = workspace_bytes(tokens);
  impl_->run_on(stream, x, y, tokens, bias, bytes > 0 ? impl_->workspace(bytes) : nullptr, {});
}

void SparseLinear::run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias, Workspace workspace,
                       RunLayout layout) {
  require(tokens >= 0, ErrorCode::invalid_argument,
          [&] { return "SparseLinear::run: tokens must be >= 0, got " + std::to_string(tokens); });
  if (tokens == 0) return;
  impl_->check_layout(tokens, layout, "SparseLinear::run");
  impl_->check_run(x, y, bias, "SparseLinear::run");
  const std::size_t bytes = workspace_bytes(tokens, layout);
  require(workspace.bytes >= bytes && (bytes == 0 || workspace.data != nullptr), ErrorCode::invalid_argument, [&] {
    return "SparseLinear::run: " + std::to_string(tokens) + " tokens need a workspace of " + std::to_string(bytes) +
           " bytes, got " + std::to_string(workspace.bytes) + (workspace.data ? "" : " at null");
  });
  require(bytes == 0 || reinterpret_cast<uintptr_t>(workspace.data) % kWorkspaceAlignment == 0,
          ErrorCode::invalid_argument, "SparseLinear::run: the workspace must be 16-byte aligned");
  impl_->run_on(stream, x, y, tokens, bias, bytes > 0 ? workspace.data : nullptr, layout);
}

bool SparseLinear::reads_feature_major_in_place() const noexcept { return impl_->gathers_rows(); }

void SparseLinear::run_quantized(Stream stream, const uint8_t* x_codes, const float* x_scales, void* y, int64_t tokens,
                                 const float* bias) {
  require(impl_->quantized() != nullptr, ErrorCode::invalid_argument, [&] {
    return "SparseLinear::run_quantized: the layer's weight is " + impl_->format + ", not 8-bit; run() takes its x";
  });
  require(tokens >= 0, ErrorCode::invalid_argument,
          [&] { return "SparseLinear::run_quantized: tokens must be >= 0, got " + std::to_string(tokens); });
  if (tokens == 0) return;
  impl_->check_run(x_codes, y, bias, "SparseLinear::run_quantized");
  impl_->run_quantized(tokens, Layout::col_major, stream, x_codes, x_scales, y, bias);
}

std::string SparseLinear::kernel(int64_t tokens, RunLayout layout) {
  require(tokens > 0, ErrorCode::invalid_argument,
          [&] { return "SparseLinear::kernel: tokens must be > 0, got " + std::to_string(tokens); });
  impl_->check_layout(tokens, layout, "SparseLinear::kernel");
  const Layout d_layout = d_layout_of(layout.y);
  std::ostringstream os;
  if (layout.y == ActivationLayout::feature_major) os << "y feature-major, ";
  if (const DeviceNm24x8* w = impl_->quantized()) {
    auto& bucket = std::get<Nm24x8Plans>(impl_->bucket_plan(tokens, Layout::col_major, d_layout));
    os << "x quantized per token to " << quant_type_name(w->type()) << ", 8-bit 2:4 "
       << bucket.for_tokens(tokens).config();
    return os.str();
  }
  const Impl::XPath path = impl_->x_path(tokens, layout);
  const int64_t ldb = Impl::b_ld(tokens, layout, path);
  const Plan& plan = impl_->bucket_plan(tokens, ldb > 0 ? Layout::row_major : Layout::col_major, d_layout);
  const std::string padded = ldb > tokens ? " (rows padded to " + std::to_string(ldb) + " tokens)" : "";
  switch (path) {
    case Impl::XPath::as_given:
      if (layout.x == ActivationLayout::feature_major) os << "x feature-major, ";
      break;
    case Impl::XPath::transposed:
      os << "x transposed" << padded << ", ";
      break;
    case Impl::XPath::repadded:
      os << "x^T copied" << padded << ", ";
      break;
    case Impl::XPath::untransposed:
      os << "x^T transposed to x, ";
      break;
  }
  std::visit(overloaded{
                 [&](const Nm24SpmmPlan& p) { os << p.for_tokens(tokens, ldb).config(); },
                 [&](const VnmSpmmPlan& p) {
                   const DeviceVnm& w = std::get<DeviceVnm>(impl_->weight);
                   os << vnm_form_name(w.form()) << " " << p.for_tokens(tokens, ldb).config_for(w);
                 },
                 [&](const TileSpmmPlan& p) { os << kernel_name(p.kernel_for(std::get<DeviceTiles>(impl_->weight))); },
                 [&](const Nm24x8Plans&) {},  // taken above
             },
             plan);
  return os.str();
}

int64_t SparseLinear::in_features() const noexcept { return impl_->cols(); }
int64_t SparseLinear::out_features() const noexcept { return impl_->rows(); }
DType SparseLinear::dtype() const noexcept { return impl_->dtype; }
std::optional<QuantType> SparseLinear::quantized() const noexcept {
  if (const DeviceNm24x8* w = impl_->quantized()) return w->type();
  return std::nullopt;
}
Activation SparseLinear::activation() const noexcept { return impl_->activation; }
bool SparseLinear::has_bias() const noexcept { return impl_->bias; }
const std::string& SparseLinear::format() const noexcept { return impl_->format; }
std::size_t SparseLinear::plans() const noexcept { return impl_->plans.size(); }

}  // namespace nmkit::gpu
