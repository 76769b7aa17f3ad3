// pack_vnm / unpack_vnm: a V:N:M matrix <-> its condensed 2:4 matrix (nm24 packed) and the B gather table.
// Host code only (no CUDA), so that CI tests it.
#include <algorithm>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/format/bit_packing.hpp"
#include "nmkit/format/nm.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"

namespace nmkit::gpu {
namespace {

constexpr int kSelected = kVnmSelectedColumns;  // condensed columns per group: the 2:4 unit

// The 2:4 index pair of a row's kept values inside its group's 4 selected columns. N = 1 pads with an
// explicit zero at another index, so that every group holds the ordered pair the instruction reads.
struct IndexPair {
  unsigned first, second;
  bool value_in_second;  // N = 1: which slot carries the real value
};
IndexPair pair_for_single(unsigned index) { return index == 0 ? IndexPair{0, 1, false} : IndexPair{0, index, true}; }

}  // namespace

bool vnm_kernel_supports_v(int v) noexcept { return v == 32 || v == 64 || (v > 0 && v % kPackRowAlign == 0); }

// B row-major: the largest M that `automatic` runs in the full 2:4 form, by V: up to it the gather costs more than
// the condensed form's smaller math saves.
// 8192^3 f16: 128:2:8 condensed 2.41x cuBLAS, 64:2:8 1.30x, full_2_4 1.66x; 128:2:4 condensed 1.31x.
constexpr int kFullFormMaxMRowMajorV64 = 8;
constexpr int kFullFormMaxMRowMajor = 4;
// Below this V only the portable mma.sp kernel gathers, while the full_2_4 form runs on the Hopper kernel.
constexpr int kHopperGatherMinV = 64;

VnmForm resolve_vnm_form(VnmForm form, int v, int m, Layout b_layout) {
  const bool aligned = m % kSelected == 0;
  if (form == VnmForm::automatic) {
    if (!aligned) return VnmForm::condensed;
    if (b_layout == Layout::col_major || !vnm_kernel_supports_v(v) || v < kHopperGatherMinV) return VnmForm::full_2_4;
    const int full_max_m = v < kPackRowAlign ? kFullFormMaxMRowMajorV64 : kFullFormMaxMRowMajor;
    return m <= full_max_m ? VnmForm::full_2_4 : VnmForm::condensed;
  }
  require(
      form != VnmForm::full_2_4 || aligned, ErrorCode::invalid_argument,
      "the full_2_4 form needs M % 4 == 0 (groups of M must not straddle the 2:4 groups), got M=" + std::to_string(m));
  return form;
}

const char* vnm_form_name(VnmForm form) noexcept {
  switch (form) {
    case VnmForm::automatic:
      return "automatic";
    case VnmForm::condensed:
      return "condensed";
    case VnmForm::full_2_4:
      return "full_2_4";
  }
  return "?";
}

int64_t PackedVnm::gather_row_blocks() const noexcept { return condensed.rows_padded / std::min(v, kPackRowAlign); }

PackedVnm pack_vnm(const VnmMatrix& a, VnmForm form, Layout b_layout) {
  validate(a);
  require(a.dtype() == DType::f16 || a.dtype() == DType::bf16, ErrorCode::unsupported,
          std::string("pack_vnm needs f16 or bf16 values, got ") + dtype_name(a.dtype()));
  if (resolve_vnm_form(form, a.v, a.m, b_layout) ==
      VnmForm::full_2_4) {  // any V: the 2:4 kernels do not see the row blocks
    PackedVnm p;
    p.rows = a.rows, p.cols = a.cols, p.v = a.v, p.n = a.n, p.m = a.m, p.form = VnmForm::full_2_4;
    p.condensed = pack_nm24(compress_nm(decompress(a), 2, kSelected));  // at most 2 per aligned 4: M % 4 == 0
    return p;
  }
  require(vnm_kernel_supports_v(a.v), ErrorCode::unsupported,
          "pack_vnm: the gathering kernels run V = 32, 64 or a multiple of 128, got V=" + std::to_string(a.v));
  const int64_t groups = a.groups();

  NmMatrix condensed;
  condensed.rows = a.rows, condensed.cols = groups * kSelected, condensed.n = 2, condensed.m = kSelected;
  condensed.values = TypedBuffer(a.dtype(), static_cast<std::size_t>(condensed.value_count()));
  condensed.indices.assign(packed_bytes(static_cast<std::size_t>(condensed.value_count()), 2), 0);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t in = (r * groups + g) * a.n, out = (r * groups + g) * 2;
      unsigned index[2];
      float value[2];
      if (a.n == 2) {
        for (int s = 0; s < 2; ++s)
          index[s] = a.m_index(in + s), value[s] = a.values.get(static_cast<std::size_t>(in + s));
      } else {
        const IndexPair p = pair_for_single(a.m_index(in));
        const float v = a.values.get(static_cast<std::size_t>(in));
        index[0] = p.first, index[1] = p.second;
        value[0] = p.value_in_second ? 0.0f : v, value[1] = p.value_in_second ? v : 0.0f;
      }
      for (int s = 0; s < 2; ++s) {
        // Values are copied bit for bit: set() of an f16/bf16 value read as float is exact.
        condensed.values.set(static_cast<std::size_t>(out + s), value[s]);
        write_packed(condensed.indices, static_cast<std::size_t>(out + s), 2, index[s]);
      }
    }

  PackedVnm p;
  p.rows = a.rows, p.cols = a.cols, p.v = a.v, p.n = a.n, p.m = a.m;
  p.condensed = pack_nm24(condensed);
  const int64_t stride = p.condensed.cols_padded, blocks = p.gather_row_blocks();
  p.gather.assign(static_cast<std::size_t>(blocks * stride), kNoBRow);
  // Row blocks of the table are min(V, 128) rows: for V >= 128 a 128-row tile reads its V-block's entries.
  const int table_rows = std::min(a.v, kPackRowAlign);
  for (int64_t tb = 0; tb < blocks; ++tb) {
    const int64_t rb = tb * table_rows / a.v;
    if (rb >= a.row_blocks()) break;  // padding rows: no B rows
    for (int64_t g = 0; g < groups; ++g)
      for (int s = 0; s < kSelected; ++s) {
        const int64_t k = g * a.m + a.column_loc[static_cast<std::size_t>((rb * groups + g) * kSelected + s)];
        p.gather[static_cast<std::size_t>(tb * stride + g * kSelected + s)] =
            k < a.cols ? static_cast<int32_t>(k) : kNoBRow;
      }
  }
  return p;
}

VnmMatrix unpack_vnm(const PackedVnm& p) {
  check_vnm_pattern(p.v, p.n, p.m);
  if (p.form == VnmForm::full_2_4) return compress_vnm(decompress(unpack_nm24(p.condensed)), p.v, p.n, p.m);
  const NmMatrix condensed = unpack_nm24(p.condensed);
  const int64_t groups = ceil_div(p.cols, p.m);
  const int table_rows = std::min(p.v, kPackRowAlign);
  require(condensed.rows == p.rows && condensed.cols == groups * kSelected &&
              p.gather.size() == static_cast<std::size_t>(p.gather_row_blocks() * p.condensed.cols_padded),
          ErrorCode::invalid_argument, "unpack_vnm: condensed matrix or gather table does not match R x K");
  VnmMatrix a;
  a.rows = p.rows, a.cols = p.cols, a.v = p.v, a.n = p.n, a.m = p.m;
  a.values = TypedBuffer(condensed.dtype(), static_cast<std::size_t>(a.value_count()));
  a.m_indices.assign(packed_bytes(static_cast<std::size_t>(a.value_count()), kVnmMIndexBits), 0);
  a.column_loc.assign(static_cast<std::size_t>(a.row_blocks() * groups * kSelected), 0);
  for (int64_t rb = 0; rb < a.row_blocks(); ++rb) {
    const int64_t tb = rb * a.v / table_rows;
    for (int64_t g = 0; g < groups; ++g)
      for (int s = 0; s < kSelected; ++s) {
        const int32_t k = p.gather[static_cast<std::size_t>(tb * p.condensed.cols_padded + g * kSelected + s)];
        // Columns past K (kNoBRow) were dropped by pack_vnm; they follow the last real one in ascending order.
        const int64_t prev =
            s == 0 ? -1 : a.column_loc[static_cast<std::size_t>((rb * groups + g) * kSelected + s - 1)];
        a.column_loc[static_cast<std::size_t>((rb * groups + g) * kSelected + s)] =
            static_cast<uint8_t>(k == kNoBRow ? prev + 1 : k - g * a.m);
      }
  }
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t in = (r * groups + g) * 2, out = (r * groups + g) * a.n;
      if (a.n == 2) {
        for (int s = 0; s < 2; ++s) {
          a.values.set(static_cast<std::size_t>(out + s), condensed.values.get(static_cast<std::size_t>(in + s)));
          write_packed(a.m_indices, static_cast<std::size_t>(out + s), kVnmMIndexBits, condensed.index(in + s));
        }
      } else {
        const bool second = condensed.values.get(static_cast<std::size_t>(in + 1)) != 0.0f;
        a.values.set(static_cast<std::size_t>(out),
                     condensed.values.get(static_cast<std::size_t>(in + (second ? 1 : 0))));
        write_packed(a.m_indices, static_cast<std::size_t>(out), kVnmMIndexBits,
                     condensed.index(in + (second ? 1 : 0)));
      }
    }
  validate(a);
  return a;
}

}  // namespace nmkit::gpu
