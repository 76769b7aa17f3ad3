#pragma once
// N:M sparsity along K, row-wise: in every group of M consecutive columns of a row at most N
// entries are non-zero. Stored as N values per group plus one ceil(log2 M)-bit index per value.
// 2:4 is the pattern of the sparse tensor cores. Byte layout: docs/formats.md, "N:M".
#include <cstdint>
#include <vector>

#include "nmkit/format/bit_packing.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit {

struct NmMatrix {
  int64_t rows = 0;  // R
  int64_t cols = 0;  // K, the dense width before padding to a multiple of M
  int n = 2;
  int m = 4;
  TypedBuffer values;            // (R, groups, N): kept values of each group, by ascending index
  std::vector<uint8_t> indices;  // (R, groups, N) indices in [0, M), index_bits() each, bit-packed

  int64_t groups() const noexcept { return ceil_div(cols, m); }
  int64_t value_count() const noexcept { return rows * groups() * n; }
  int index_bits() const noexcept { return index_bits_for(m); }
  unsigned index(int64_t value_index) const noexcept {
    return read_packed(indices, static_cast<std::size_t>(value_index), index_bits());
  }
  // Dense column of value (row r, group g, slot s); >= cols in the K padding.
  int64_t column_of(int64_t r, int64_t g, int s) const noexcept { return g * m + index((r * groups() + g) * n + s); }
  DType dtype() const noexcept { return values.dtype(); }
};

// Checks 0 < N < M <= 32 (the logical format's range); throws Error otherwise.
void check_nm_pattern(int n, int m);

// Compresses a matrix that already satisfies N:M (at most N non-zeros per group).
// Throws pattern_violation naming the first offending row and group.
NmMatrix compress_nm(const DenseMatrix& dense, int n, int m);
// Compresses the entries of `mask` (at most N per group); others are dropped.
NmMatrix compress_nm(const DenseMatrix& dense, const Mask& mask, int n, int m);

DenseMatrix decompress(const NmMatrix& a);
// Throws Error naming the first violation (sizes, index range/order, non-zero padding).
void validate(const NmMatrix& a);
// Exact bytes of the compressed arrays (values + packed indices).
std::size_t storage_bytes(const NmMatrix& a) noexcept;
// Compressed over dense size for `value_bits`-bit values, K a multiple of M (the seed lecture's
// arithmetic: 2:4 is 56.25 % of dense at 16 bits, 62.5 % at 8 bits).
double nm_storage_ratio(int n, int m, int value_bits);

}  // namespace nmkit
