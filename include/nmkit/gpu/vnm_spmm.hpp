#pragma once
// V:N:M SpMM on the GPU (VENOM's Spatha, on the 2:4 kernels): D = act(alpha * A * B + beta * C + bias).
//
// A V:N:M weight is a 2:4 matrix over its selected columns: each V x M block keeps 4 of its M columns and
// each row at most 2 values among those 4. pack_vnm writes that "condensed" R x (4 * ceil(K / M)) 2:4
// matrix in the nm24 packed layout, plus a gather table naming, for every row block and condensed column,
// the row of B it multiplies. The kernels read B through that table while staging it (no gathered copy of B).
//
//   PackedVnm p = pack_vnm(compress_vnm(w, mask, 128, 2, 8));   // once per weight, host side
//   DeviceVnm a = DeviceVnm::upload(p);                          // once per weight
//   VnmSpmmPlan plan = VnmSpmmPlan::create(desc, a.v(), a.m());  // once per shape (desc.b_layout: as packed)
//   plan.run(stream, a, b, c, d, bias);                          // one launch: no allocation, search or sync
#include <cstdint>
#include <optional>
#include <vector>

#include "nmkit/format/vnm.hpp"
#include "nmkit/gpu/device_buffer.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {

// Gather-table entry for condensed columns that read no row of B (K padding, the last group's tail).
inline constexpr int32_t kNoBRow = -1;

// V values the gathering (condensed-form) kernels run: 32 and 64 (several row blocks per 128-row tile) and
// multiples of 128. The full_2_4 form takes any V.
bool vnm_kernel_supports_v(int v) noexcept;

// How a V:N:M weight reaches the tensor cores.
//   condensed: the 2:4 matrix over the selected columns (K' = 4 ceil(K/M)) and B gathered through a table: M/2
//              times less math than dense, but B's rows are gathered.
//   full_2_4:  when M % 4 == 0 every aligned 4 columns of a V:N:M row hold at most 2 non-zeros, so the weight
//              is also a plain 2:4 matrix over all of K: the nm24 kernels run it at 2:4 speed with B read by TMA.
//   automatic: the form measured faster for the layout of the B the weight will be multiplied with (H200, f16):
//              - M % 4 != 0: condensed, the only form;
//              - B col-major (x[T, K] row-major, SpmmDesc's default): full_2_4. The condensed kernel must gather x
//                element by element along K (0.05-0.93x cuBLAS against 1.3-1.7x for full_2_4);
//              - B row-major (K x C): full_2_4 for M = 4 and for M = 8 with V = 64, condensed otherwise (128:2:8
//                condensed 1.6-2.4x against full_2_4 1.3-1.7x);
//              - V that the gathering kernels do not run (vnm_kernel_supports_v): full_2_4 where M % 4 == 0.
enum class VnmForm : uint8_t { automatic, condensed, full_2_4 };
// automatic -> the concrete form for a B in `b_layout`; throws for full_2_4 with M % 4 != 0.
VnmForm resolve_vnm_form(VnmForm form, int v, int m, Layout b_layout = Layout::col_major);
const char* vnm_form_name(VnmForm form) noexcept;

struct PackedVnm {
  int64_t rows = 0, cols = 0;  // logical R, K
  int v = 128, n = 2, m = 8;
  VnmForm form = VnmForm::condensed;
  // condensed: R x (4 * ceil(K / M)), the 2:4 matrix over the selected columns; full_2_4: R x K, the whole weight.
  PackedNm24 condensed;
  // condensed form: (row_blocks_padded, condensed.cols_padded), row_blocks_padded = condensed.rows_padded /
  // min(V, 128); entry = the row of B, in [0, K), or kNoBRow. Empty in the full_2_4 form.
  std::vector<int32_t> gather;
  int64_t gather_row_blocks() const noexcept;
};

// Packs a V:N:M matrix (f16 or bf16, N in {1, 2}, any R and K); validates it first (column_loc in range,
// strictly ascending; m-indices ascending). `b_layout` is the layout of the B the weight will meet, which
// `automatic` chooses the form by. Throws Error naming what is wrong, or unsupported for a condensed form with
// a V the kernels do not run (vnm_kernel_supports_v).
PackedVnm pack_vnm(const VnmMatrix& a, VnmForm form = VnmForm::automatic, Layout b_layout = Layout::col_major);
// The inverse (for tests and inspection); N = 1 weights come back with N = 2 and explicit zeros unless
// `n` asks for 1.
VnmMatrix unpack_vnm(const PackedVnm& p);

class DeviceVnm {
 public:
  static DeviceVnm upload(const PackedVnm& packed);
  // A weight whose condensed R x 4*ceil(K/M) matrix is already on the device (written by a GPU producer);
  // `gather` is the table pack_vnm writes for it, validated here (size, entries in [0, K) or kNoBRow).
  static DeviceVnm from_parts(DeviceNm24 condensed, const std::vector<int32_t>& gather, int64_t cols, int v, int m);
  // A weight in the full_2_4 form: its R x K 2:4 packing.
  static DeviceVnm from_full_2_4(DeviceNm24 full, int v, int m);
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int v() const noexcept { return v_; }
  int m() const noexcept { return m_; }
  VnmForm form() const noexcept { return form_; }
  DType dtype() const noexcept { return condensed_.dtype(); }
  // The packed 2:4 matrix: condensed (R x K') or, in the full_2_4 form, the whole R x K weight.
  const DeviceNm24& condensed() const noexcept { return condensed_; }
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
  // desc describes the logical product (R x K x C); v and m the weight's pattern. Validates and picks the
  // kernel: sm90 wgmma.sp with B gathered while staged (sm_90a, V = 64 or a multiple of 128, 16-byte
  // aligned B rows), else the portable mma.sp kernel. block_n = 0 lets the heuristic choose.
  // `form` pins the weight's form; an automatic plan runs a weight in either form (M % 4 == 0 for full_2_4,
  // a V the gathering kernels run for condensed; a given kernel or block_n must suit both) and reports in
  // config() the form pack_vnm picks for desc.b_layout. The full_2_4 form runs the nm24 plan.
  static VnmSpmmPlan create(const SpmmDesc& desc, int v, int m, Nm24Kernel kernel = Nm24Kernel::automatic,
                            int block_n = 0, VnmForm form = VnmForm::automatic);
  // Same contract as Nm24SpmmPlan::run; the weight must match the plan's shape, dtype, V and M.
  void run(Stream stream, const DeviceVnm& a, const void* b, const void* c, void* d, const float* bias = nullptr) const;

  const SpmmDesc& desc() const noexcept { return desc_; }
  const KernelConfig& config() const noexcept { return config_; }
  int v() const noexcept { return v_; }
  int m() const noexcept { return m_; }
  VnmForm form() const noexcept { return form_; }  // automatic: either form

 private:
  SpmmDesc desc_;
  KernelConfig config_;
  int v_ = 0, m_ = 0;
  VnmForm form_ = VnmForm::condensed;
  std::optional<KernelConfig> gather_;  // the condensed form's kernel
  int gather_group_rows_ = 0;           // its raster on sm90: row tiles per group (0: the kernel's default)
  std::optional<Nm24SpmmPlan> full_;    // the plan of the full_2_4 form
};

}  // namespace nmkit::gpu
