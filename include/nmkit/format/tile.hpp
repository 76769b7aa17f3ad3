#pragma once
// Tile-sparse (seed 003): the matrix is a grid of tile_rows x tile_cols tiles; only non-zero tiles
// are stored, dense inside, in a CSC-like encoding over tile columns (ptr / indices / data).
// Byte layout: docs/formats.md, "Tile-sparse".
#include <cstdint>
#include <vector>

#include "nmkit/matrix.hpp"

namespace nmkit {

inline constexpr int kMaxTileSide = 1024;

// Which tiles of the grid are kept, row-major over (tile_row, tile_col).
struct TileMask {
  int64_t grid_rows = 0;
  int64_t grid_cols = 0;
  std::vector<uint8_t> keep;
  bool at(int64_t tr, int64_t tc) const noexcept { return keep[static_cast<std::size_t>(tr * grid_cols + tc)] != 0; }
};

struct TileMatrix {
  int64_t rows = 0;
  int64_t cols = 0;
  int tile_rows = 64;
  int tile_cols = 64;
  std::vector<int32_t> ptr;      // (grid_cols + 1): ptr[j+1] - ptr[j] = stored tiles of tile column j
  std::vector<int32_t> indices;  // (nnz_tiles): tile-row index, strictly ascending within a column
  TypedBuffer data;              // (nnz_tiles, tile_rows, tile_cols), each tile row-major, zero past the edge

  int64_t grid_rows() const noexcept { return ceil_div(rows, tile_rows); }
  int64_t grid_cols() const noexcept { return ceil_div(cols, tile_cols); }
  int64_t nnz_tiles() const noexcept { return static_cast<int64_t>(indices.size()); }
  int64_t tile_elems() const noexcept { return int64_t{tile_rows} * tile_cols; }
  double density() const noexcept;  // stored tiles / tiles in the grid
  DType dtype() const noexcept { return data.dtype(); }
};

void check_tile_shape(int tile_rows, int tile_cols);

// Keeps every tile that holds a non-zero.
TileMatrix compress_tiles(const DenseMatrix& dense, int tile_rows, int tile_cols);
// Keeps the tiles of `mask` (entries of other tiles are dropped).
TileMatrix compress_tiles(const DenseMatrix& dense, const TileMask& mask, int tile_rows, int tile_cols);

DenseMatrix decompress(const TileMatrix& a);
void validate(const TileMatrix& a);
std::size_t storage_bytes(const TileMatrix& a) noexcept;

// The element mask of the kept tiles, cropped to rows x cols.
Mask expand(const TileMask& mask, int64_t rows, int64_t cols, int tile_rows, int tile_cols);

}  // namespace nmkit
