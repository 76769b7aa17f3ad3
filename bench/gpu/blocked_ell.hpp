#pragma once
// The Blocked-ELL form of a packed tile matrix, for the tile suite's cuSPARSE baseline (host only).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::bench {

// cuSPARSE Blocked-ELL (cusparseSpMM, BLOCKED_ELL_ALG1, tensor cores) on the same pattern, where the pattern
// allows: square tiles, R and K whole tiles, and rows even enough that padding every tile row to the longest adds
// at most kMaxEllPadding of the stored tiles. The ELL: per tile row `width` column indices (-1: an empty slot) and
// the values as an R x (width * side) row-major matrix, slot j of a tile row in columns [j * side, (j + 1) * side).
struct BlockedEll {
  static constexpr double kMaxEllPadding = 0.25;
  int64_t width = 0;  // slots per tile row: the longest tile row's tiles
  std::vector<int32_t> columns;
  std::vector<uint16_t> values;

  static bool applies(const gpu::PackedTiles& p) {
    if (p.tile_rows != p.tile_cols || p.rows % p.tile_rows != 0 || p.cols % p.tile_cols != 0 || p.nnz_tiles() == 0)
      return false;
    return static_cast<double>(longest_row(p) * p.grid_rows()) <=
           (1.0 + kMaxEllPadding) * static_cast<double>(p.nnz_tiles());
  }
  static int64_t longest_row(const gpu::PackedTiles& p) {
    int64_t longest = 0;
    for (std::size_t i = 0; i + 1 < p.row_ptr.size(); ++i)
      longest = std::max<int64_t>(longest, p.row_ptr[i + 1] - p.row_ptr[i]);
    return longest;
  }
  explicit BlockedEll(const gpu::PackedTiles& p) : width(longest_row(p)) {
    const int64_t side = p.tile_rows, grid_rows = p.grid_rows(), ell_cols = width * side;
    columns.assign(static_cast<std::size_t>(grid_rows * width), -1);
    values.assign(static_cast<std::size_t>(p.rows * ell_cols), 0);
    for (int64_t i = 0; i < grid_rows; ++i)
      for (int64_t t = p.row_ptr[i], slot = 0; t < p.row_ptr[i + 1]; ++t, ++slot) {
        columns[static_cast<std::size_t>(i * width + slot)] = p.col_index[static_cast<std::size_t>(t)];
        for (int64_t r = 0; r < side; ++r)
          std::copy_n(p.data.begin() + (t * side + r) * side, side,
                      values.begin() + (i * side + r) * ell_cols + slot * side);
      }
  }
};

}  // namespace nmkit::bench
