#pragma once
// V:N:M SpMM on the GPU, as nm24_spmm.hpp's 2:4 SpMM with a V:N:M weight run as a 2:4 matrix:
//   DeviceVnm a = DeviceVnm::upload(pack_vnm(compress_vnm(w, mask, 128, 2, 8)));  // once per weight
//   VnmSpmmPlan::create(desc, a.v(), a.m()).run(stream, a, b, c, d, bias);        // desc.b_layout: as packed
#include <optional>
#include "nmkit/format/vnm.hpp"
#include "nmkit/gpu/detail/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
inline constexpr int32_t kNoBRow = -1;       // gather entry of a condensed column that reads no row of B
bool vnm_kernel_supports_v(int v) noexcept;  // condensed-form V: 32, 64 or a multiple of 128
// condensed: the R x 4 ceil(K / M) 2:4 matrix over the selected columns, B's rows gathered through a table.
// full_2_4: the R x K weight as plain 2:4 (M % 4 == 0). automatic: the faster for the B layout (docs/formats.md).
enum class VnmForm : uint8_t { automatic, condensed, full_2_4 };
// automatic -> the concrete form for a B in `b_layout`; throws Error for full_2_4 with M % 4 != 0.
VnmForm resolve_vnm_form(VnmForm form, int v, int m, Layout b_layout = Layout::col_major);
const char* vnm_form_name(VnmForm form) noexcept;
struct PackedVnm {
  int64_t rows = 0, cols = 0;  // logical R, K
  int v = 128, n = 2, m = 8;
  VnmForm form = VnmForm::condensed;
  PackedNm24 condensed;  // condensed: R x 4 ceil(K / M); full_2_4: R x K
  // condensed: (row_blocks_padded, condensed.cols_padded) rows of B in [0, K) or kNoBRow; full_2_4: empty
  std::vector<int32_t> gather;
  int64_t gather_row_blocks() const noexcept;
};
// Validates and packs a V:N:M matrix (f16 or bf16, N in {1, 2}) in `form` (automatic: for `b_layout`). Throws Error
// naming what is wrong, or unsupported for a condensed form whose V fails vnm_kernel_supports_v.
PackedVnm pack_vnm(const VnmMatrix& a, VnmForm form = VnmForm::automatic, Layout b_layout = Layout::col_major);
VnmMatrix unpack_vnm(const PackedVnm& p);  // the inverse (tests, inspection); N = 1 comes back as N = 2
// A packed V:N:M weight in device memory (owning; move-only). Throws Error on invalid parts, or cuda_error.
class DeviceVnm {
 public:
  static DeviceVnm upload(const PackedVnm& packed);
  // A condensed weight already on the device; `gather` as pack_vnm writes it (validated).
  static DeviceVnm from_parts(DeviceNm24 condensed, const std::vector<int32_t>& gather, int64_t cols, int v, int m);
  static DeviceVnm from_full_2_4(DeviceNm24 full, int v, int m);  // a full_2_4 weight's R x K 2:4 packing
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int v() const noexcept { return v_; }
  int m() const noexcept { return m_; }
  VnmForm form() const noexcept { return form_; }
  DType dtype() const noexcept { return condensed_.dtype(); }
  const DeviceNm24& condensed() const noexcept { return condensed_; }  // full_2_4: the whole R x K weight
  const int32_t* gather() const noexcept { return static_cast<const int32_t*>(gather_.data()); }
  int64_t gather_stride() const noexcept { return condensed_.cols_padded(); }

 private:
  DeviceVnm(DeviceNm24 condensed, DeviceBuffer gather) : condensed_(std::move(condensed)), gather_(std::move(gather)) {}
  DeviceNm24 condensed_;
  DeviceBuffer gather_;
  int64_t rows_ = 0, cols_ = 0;
  int v_ = 0, m_ = 0;
  VnmForm form_ = VnmForm::condensed;
};

class VnmSpmmPlan {
 public:
  // desc: the logical R x K x C product; v, m: the pattern. `form` pins the weight's form; an automatic plan runs
  // either (pinned options must suit both). Throws Error (invalid_argument, unsupported).
  static VnmSpmmPlan create(const SpmmDesc& desc, int v, int m, const Nm24Options& options = {},
                            VnmForm form = VnmForm::automatic);
  VnmSpmmPlan for_tokens(int64_t n, int64_t ldb = 0) const;  // as Nm24SpmmPlan::for_tokens
  // Whether an automatic plan on this device runs the condensed form of an R x K weight of M-groups for n tokens and
  // B in b_layout on the skinny kernel, which reads B in either layout and at any leading dimension in place (x as a
  // layer holds it). Where a plan for B row-major takes it, a plan for B col-major does too.
  static bool takes_skinny_kernel(int64_t rows, int64_t cols, int m, int64_t n, Layout b_layout);
  // Same contract as Nm24SpmmPlan::run; `a` must match the plan's shape, dtype, V and M.
  void run(Stream stream, const DeviceVnm& a, const void* b, const void* c, void* d, const float* bias = nullptr) const;
  const SpmmDesc& desc() const noexcept { return desc_; }
  const KernelConfig& config() const noexcept { return config_; }  // of the form pack_vnm picks for desc.b_layout
  const KernelConfig& config_for(const DeviceVnm& a) const;        // what run() launches for `a`'s form
  int v() const noexcept { return v_; }
  int m() const noexcept { return m_; }
  VnmForm form() const noexcept { return form_; }  // automatic: either form

 private:
  SpmmDesc desc_;
  KernelConfig config_;
  int v_ = 0, m_ = 0;
  VnmForm form_ = VnmForm::condensed;
  std::optional<KernelConfig> gather_;  // the condensed form's kernel
  std::optional<Nm24SpmmPlan> full_;    // the full_2_4 form's plan
};
}  // namespace nmkit::gpu
