#include "nmkit/format/vnm.hpp"

#include <algorithm>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/format/bit_packing.hpp"
#include "row_group_entries.hpp"
#include "slots.hpp"

namespace nmkit {
static_assert(kVnmMIndexBits <= kMaxPackedBits, "read_packed reads at most two bytes a value");
namespace {

std::string block_name(int64_t row_block, int64_t group) {
  return "block (row block " + std::to_string(row_block) + ", group " + std::to_string(group) + ")";
}

std::string pattern_name(int v, int n, int m) {
  return std::to_string(v) + ":" + std::to_string(n) + ":" + std::to_string(m);
}

}  // namespace

unsigned VnmMatrix::m_index(int64_t value_index) const noexcept {
  return read_packed(m_indices, static_cast<std::size_t>(value_index), kVnmMIndexBits);
}

int64_t VnmMatrix::column_of(int64_t r, int64_t g, int s) const noexcept {
  const int64_t vi = (r * groups() + g) * n + s;
  const int64_t loc = ((r / v) * groups() + g) * kVnmSelectedColumns + m_index(vi);
  return g * m + column_loc[static_cast<std::size_t>(loc)];
}

void check_vnm_pattern(int v, int n, int m) {
  require(v >= 1, ErrorCode::invalid_argument, "V:N:M needs V >= 1, got V=" + std::to_string(v));
  require(n == 1 || n == 2, ErrorCode::invalid_argument, "V:N:M needs N in {1, 2}, got N=" + std::to_string(n));
  require(m >= kVnmSelectedColumns && m <= kVnmMaxM, ErrorCode::invalid_argument,
          "V:N:M needs 4 <= M <= 256, got M=" + std::to_string(m));
}

VnmMatrix compress_vnm(const DenseMatrix& dense, int v, int n, int m) {
  return compress_vnm(dense, nonzero_mask(dense), v, n, m);
}

VnmMatrix compress_vnm(const DenseMatrix& dense, const Mask& mask, int v, int n, int m) {
  check_vnm_pattern(v, n, m);
  require(mask.rows == dense.rows && mask.cols == dense.cols, ErrorCode::invalid_argument,
          "compress_vnm: mask shape differs from the matrix shape");
  VnmMatrix out;
  out.rows = dense.rows;
  out.cols = dense.cols;
  out.v = v;
  out.n = n;
  out.m = m;
  const int64_t groups = out.groups();
  out.values = TypedBuffer(dense.dtype(), static_cast<std::size_t>(out.value_count()));
  out.m_indices.assign(packed_bytes(static_cast<std::size_t>(out.value_count()), kVnmMIndexBits), 0);
  out.column_loc.assign(static_cast<std::size_t>(out.row_blocks() * groups * kVnmSelectedColumns), 0);

  bool column_kept[kVnmMaxM];
  for (int64_t rb = 0; rb < out.row_blocks(); ++rb) {
    const int64_t r0 = rb * v;
    const int64_t r1 = std::min<int64_t>(r0 + v, dense.rows);
    for (int64_t g = 0; g < groups; ++g) {
      // 1. The block's columns holding a kept entry (at most 4), padded with the smallest unused.
      for (int j = 0; j < m; ++j) {
        const int64_t c = g * m + j;
        column_kept[j] = false;
        for (int64_t r = r0; r < r1 && c < dense.cols && !column_kept[j]; ++r) column_kept[j] = mask.at(r, c);
      }
      int selected[kVnmSelectedColumns];
      require(detail::choose_slots(column_kept, m, kVnmSelectedColumns, selected), ErrorCode::pattern_violation, [&] {
        return "V:N:M " + pattern_name(v, n, m) + " violated in " + block_name(rb, g) +
               ": more than 4 columns hold kept entries";
      });
      for (int s = 0; s < kVnmSelectedColumns; ++s)
        out.column_loc[static_cast<std::size_t>((rb * groups + g) * kVnmSelectedColumns + s)] =
            static_cast<uint8_t>(selected[s]);

      // 2. Each row keeps at most N of the 4 selected columns (2:4 inside the block).
      for (int64_t r = r0; r < r1; ++r) {
        bool kept[kVnmSelectedColumns];
        for (int s = 0; s < kVnmSelectedColumns; ++s) {
          const int64_t c = g * m + selected[s];
          kept[s] = c < dense.cols && mask.at(r, c);
        }
        int chosen[kVnmSelectedColumns];
        require(detail::choose_slots(kept, kVnmSelectedColumns, n, chosen), ErrorCode::pattern_violation, [&] {
          return "V:N:M " + pattern_name(v, n, m) + " violated at row " + std::to_string(r) + ", group " +
                 std::to_string(g) + ": more than " + std::to_string(n) + " kept entries";
        });
        for (int s = 0; s < n; ++s) {
          const std::size_t vi = static_cast<std::size_t>((r * groups + g) * n + s);
          write_packed(out.m_indices, vi, kVnmMIndexBits, static_cast<unsigned>(chosen[s]));
          if (kept[chosen[s]]) out.values.set(vi, dense.at(r, g * m + selected[chosen[s]]));
        }
      }
    }
  }
  return out;
}

DenseMatrix decompress(const VnmMatrix& a) { return detail::decompress_row_groups(a); }

void validate(const VnmMatrix& a) {
  check_vnm_pattern(a.v, a.n, a.m);
  require(a.rows >= 0 && a.cols >= 0, ErrorCode::invalid_argument, "V:N:M matrix has a negative shape");
  const int64_t groups = a.groups();
  const auto count = static_cast<std::size_t>(a.value_count());
  require(a.values.size() == count, ErrorCode::invalid_argument,
          "V:N:M values hold " + std::to_string(a.values.size()) + " elements, expected " + std::to_string(count));
  require(a.m_indices.size() == packed_bytes(count, kVnmMIndexBits), ErrorCode::invalid_argument,
          "V:N:M m_indices hold " + std::to_string(a.m_indices.size()) + " bytes, expected " +
              std::to_string(packed_bytes(count, kVnmMIndexBits)));
  require(padding_is_zero(a.m_indices, count, kVnmMIndexBits), ErrorCode::invalid_argument,
          "V:N:M m_indices: the unused high bits of the last byte are not zero");
  const auto loc_count = static_cast<std::size_t>(a.row_blocks() * groups * kVnmSelectedColumns);
  require(a.column_loc.size() == loc_count, ErrorCode::invalid_argument,
          "V:N:M column_loc holds " + std::to_string(a.column_loc.size()) + " bytes, expected " +
              std::to_string(loc_count));
  for (int64_t rb = 0; rb < a.row_blocks(); ++rb)
    for (int64_t g = 0; g < groups; ++g) {
      int previous = -1;
      for (int s = 0; s < kVnmSelectedColumns; ++s) {
        const int j = a.column_loc[static_cast<std::size_t>((rb * groups + g) * kVnmSelectedColumns + s)];
        require(j < a.m, ErrorCode::pattern_violation, [&] {
          return "V:N:M column_loc " + std::to_string(j) + " >= M=" + std::to_string(a.m) + " in " + block_name(rb, g);
        });
        require(j > previous, ErrorCode::pattern_violation, [&] {
          return "V:N:M column_loc not strictly ascending (unsorted or duplicate) in " + block_name(rb, g);
        });
        previous = j;
      }
    }
  detail::check_row_group_slots(a, kVnmSelectedColumns, {"V:N:M", "m-indices", "the selected columns"},
                                [&](int64_t vi) { return a.m_index(vi); });
}

std::size_t storage_bytes(const VnmMatrix& a) noexcept {
  return a.values.size_bytes() + a.m_indices.size() + a.column_loc.size();
}

double vnm_storage_ratio(int v, int n, int m, int value_bits) {
  check_vnm_pattern(v, n, m);
  require(value_bits > 0, ErrorCode::invalid_argument, "value_bits must be positive");
  constexpr int kColumnLocBits = 8;
  const double block_bits =
      static_cast<double>(v) * n * (value_bits + kVnmMIndexBits) + kVnmSelectedColumns * kColumnLocBits;
  return block_bits / (static_cast<double>(v) * m * value_bits);
}

}  // namespace nmkit
