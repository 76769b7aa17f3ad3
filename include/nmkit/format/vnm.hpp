#pragma once
// V:N:M (VENOM, seed 000 §3): the matrix is cut into V x M blocks. Each block keeps 4 of its M
// columns (column_loc); inside those 4, every row keeps N <= 2 values addressed by 2-bit m-indices,
// which is exactly the 2:4 pattern the sparse tensor cores execute. Byte layout: docs/formats.md.
#include <cstdint>
#include <vector>

#include "nmkit/matrix.hpp"

namespace nmkit {

// Columns a V x M block keeps; the 2:4 unit of the sparse tensor cores.
inline constexpr int kVnmSelectedColumns = 4;
inline constexpr int kVnmMIndexBits = 2;
inline constexpr int kVnmMaxM = 256;  // column_loc entries are uint8

struct VnmMatrix {
  int64_t rows = 0;  // R; the last row block may hold fewer than V rows
  int64_t cols = 0;  // K; the last column group may hold fewer than M columns
  int v = 64;
  int n = 2;
  int m = 8;
  TypedBuffer values;               // (R, groups, N), by ascending m-index
  std::vector<uint8_t> m_indices;   // (R, groups, N) in [0, 4), 2 bits each, bit-packed
  std::vector<uint8_t> column_loc;  // (row_blocks, groups, 4) ascending column offsets in [0, M)

  int64_t groups() const noexcept { return ceil_div(cols, m); }
  int64_t row_blocks() const noexcept { return ceil_div(rows, v); }
  int64_t value_count() const noexcept { return rows * groups() * n; }
  unsigned m_index(int64_t value_index) const noexcept;
  // Dense column of value `value_index` (row r, group g, slot s).
  int64_t column_of(int64_t r, int64_t g, int s) const noexcept;
  DType dtype() const noexcept { return values.dtype(); }
};

// Checks V >= 1, N in {1, 2}, 4 <= M <= 256; throws Error otherwise.
void check_vnm_pattern(int v, int n, int m);

// Compresses a matrix that already satisfies V:N:M: at most 4 non-zero columns per V x M block
// and at most N non-zeros per row inside them. Throws pattern_violation naming the block/row.
VnmMatrix compress_vnm(const DenseMatrix& dense, int v, int n, int m);
// Compresses the entries of `mask`, which must satisfy V:N:M; others are dropped.
VnmMatrix compress_vnm(const DenseMatrix& dense, const Mask& mask, int v, int n, int m);

DenseMatrix decompress(const VnmMatrix& a);
void validate(const VnmMatrix& a);
std::size_t storage_bytes(const VnmMatrix& a) noexcept;
// Compressed over dense size for `value_bits`-bit values and whole blocks: per V x M block,
// V*N values and m-indices plus 4 bytes of column_loc.
double vnm_storage_ratio(int v, int n, int m, int value_bits);

}  // namespace nmkit
