#include "nmkit/format/tile.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "nmkit/error.hpp"

namespace nmkit {
namespace {

std::string tile_name(int64_t tile_row, int64_t tile_col) {
  return "tile (" + std::to_string(tile_row) + ", " + std::to_string(tile_col) + ")";
}

// Copies tile (tr, tc) of `dense` into slot `slot` of `data`, zero past the matrix edge.
void copy_tile_in(const DenseMatrix& dense, int64_t tr, int64_t tc, int tile_rows, int tile_cols, TypedBuffer& data,
                  int64_t slot) {
  const int64_t base = slot * tile_rows * tile_cols;
  for (int i = 0; i < tile_rows; ++i) {
    const int64_t r = tr * tile_rows + i;
    if (r >= dense.rows) break;
    for (int j = 0; j < tile_cols; ++j) {
      const int64_t c = tc * tile_cols + j;
      if (c >= dense.cols) break;
      data.set(static_cast<std::size_t>(base + i * tile_cols + j), dense.at(r, c));
    }
  }
}

}  // namespace

double TileMatrix::density() const noexcept {
  const int64_t total = grid_rows() * grid_cols();
  return total == 0 ? 0.0 : static_cast<double>(nnz_tiles()) / static_cast<double>(total);
}

void check_tile_shape(int tile_rows, int tile_cols) {
  require(tile_rows >= 1 && tile_rows <= kMaxTileSide && tile_cols >= 1 && tile_cols <= kMaxTileSide,
          ErrorCode::invalid_argument,
          "tile sides must be in [1, " + std::to_string(kMaxTileSide) + "], got " + std::to_string(tile_rows) + "x" +
              std::to_string(tile_cols));
}

TileMatrix compress_tiles(const DenseMatrix& dense, int tile_rows, int tile_cols) {
  check_tile_shape(tile_rows, tile_cols);
  TileMask mask{ceil_div(dense.rows, tile_rows), ceil_div(dense.cols, tile_cols), {}};
  mask.keep.assign(static_cast<std::size_t>(mask.grid_rows * mask.grid_cols), 0);
  for (int64_t r = 0; r < dense.rows; ++r)
    for (int64_t c = 0; c < dense.cols; ++c)
      if (dense.at(r, c) != 0.0f)
        mask.keep[static_cast<std::size_t>((r / tile_rows) * mask.grid_cols + c / tile_cols)] = 1;
  return compress_tiles(dense, mask, tile_rows, tile_cols);
}

TileMatrix compress_tiles(const DenseMatrix& dense, const TileMask& mask, int tile_rows, int tile_cols) {
  check_tile_shape(tile_rows, tile_cols);
  TileMatrix out;
  out.rows = dense.rows;
  out.cols = dense.cols;
  out.tile_rows = tile_rows;
  out.tile_cols = tile_cols;
  require(mask.grid_rows == out.grid_rows() && mask.grid_cols == out.grid_cols() &&
              mask.keep.size() == static_cast<std::size_t>(mask.grid_rows * mask.grid_cols),
          ErrorCode::invalid_argument, "compress_tiles: tile mask grid differs from the matrix's tile grid");
  const auto kept = static_cast<int64_t>(std::count(mask.keep.begin(), mask.keep.end(), uint8_t{1}));
  require(kept <= std::numeric_limits<int32_t>::max(), ErrorCode::unsupported,
          "tile-sparse: more than 2^31-1 non-zero tiles");
  out.ptr.assign(static_cast<std::size_t>(out.grid_cols() + 1), 0);
  out.indices.reserve(static_cast<std::size_t>(kept));
  out.data = TypedBuffer(dense.dtype(), static_cast<std::size_t>(kept * out.tile_elems()));
  for (int64_t tc = 0; tc < out.grid_cols(); ++tc) {
    for (int64_t tr = 0; tr < out.grid_rows(); ++tr) {
      if (!mask.at(tr, tc)) continue;
      copy_tile_in(dense, tr, tc, tile_rows, tile_cols, out.data, out.nnz_tiles());
      out.indices.push_back(static_cast<int32_t>(tr));
    }
    out.ptr[static_cast<std::size_t>(tc + 1)] = static_cast<int32_t>(out.indices.size());
  }
  return out;
}

DenseMatrix decompress(const TileMatrix& a) {
  validate(a);
  DenseMatrix out = DenseMatrix::zeros(a.rows, a.cols, a.dtype());
  for (int64_t tc = 0; tc < a.grid_cols(); ++tc)
    for (int32_t t = a.ptr[tc]; t < a.ptr[tc + 1]; ++t) {
      const int64_t tr = a.indices[t];
      for (int i = 0; i < a.tile_rows; ++i)
        for (int j = 0; j < a.tile_cols; ++j) {
          const int64_t r = tr * a.tile_rows + i, c = tc * a.tile_cols + j;
          if (r < a.rows && c < a.cols)
            out.set(r, c, a.data.get(static_cast<std::size_t>(t * a.tile_elems() + i * a.tile_cols + j)));
        }
    }
  return out;
}

void validate(const TileMatrix& a) {
  check_tile_shape(a.tile_rows, a.tile_cols);
  require(a.rows >= 0 && a.cols >= 0, ErrorCode::invalid_argument, "tile-sparse matrix has a negative shape");
  require(a.ptr.size() == static_cast<std::size_t>(a.grid_cols() + 1), ErrorCode::invalid_argument,
          "tile-sparse ptr holds " + std::to_string(a.ptr.size()) + " entries, expected " +
              std::to_string(a.grid_cols() + 1));
  require(a.ptr.front() == 0, ErrorCode::invalid_argument, "tile-sparse ptr[0] must be 0");
  for (int64_t tc = 0; tc < a.grid_cols(); ++tc)
    require(a.ptr[tc + 1] >= a.ptr[tc], ErrorCode::invalid_argument,
            "tile-sparse ptr decreases at tile column " + std::to_string(tc));
  require(a.ptr.back() == a.nnz_tiles(), ErrorCode::invalid_argument,
          "tile-sparse ptr ends at " + std::to_string(a.ptr.back()) + " but indices hold " +
              std::to_string(a.nnz_tiles()) + " tiles");
  require(a.data.size() == static_cast<std::size_t>(a.nnz_tiles() * a.tile_elems()), ErrorCode::invalid_argument,
          "tile-sparse data holds " + std::to_string(a.data.size()) + " elements, expected " +
              std::to_string(a.nnz_tiles() * a.tile_elems()));
  for (int64_t tc = 0; tc < a.grid_cols(); ++tc) {
    int64_t previous = -1;
    for (int32_t t = a.ptr[tc]; t < a.ptr[tc + 1]; ++t) {
      const int64_t tr = a.indices[t];
      require(tr >= 0 && tr < a.grid_rows(), ErrorCode::pattern_violation, [&] {
        return "tile-sparse index " + std::to_string(tr) + " out of range [0, " + std::to_string(a.grid_rows()) +
               ") in tile column " + std::to_string(tc);
      });
      require(tr > previous, ErrorCode::pattern_violation, [&] {
        return "tile-sparse indices not strictly ascending (unsorted or duplicate) in tile column " +
               std::to_string(tc);
      });
      previous = tr;
      for (int i = 0; i < a.tile_rows; ++i)
        for (int j = 0; j < a.tile_cols; ++j) {
          const int64_t r = tr * a.tile_rows + i, c = tc * a.tile_cols + j;
          if (r >= a.rows || c >= a.cols)
            require(a.data.get(static_cast<std::size_t>(t * a.tile_elems() + i * a.tile_cols + j)) == 0.0f,
                    ErrorCode::pattern_violation,
                    [&] { return "tile-sparse non-zero value in the padding of " + tile_name(tr, tc); });
        }
    }
  }
}

std::size_t storage_bytes(const TileMatrix& a) noexcept {
  return a.data.size_bytes() + (a.ptr.size() + a.indices.size()) * sizeof(int32_t);
}

Mask expand(const TileMask& mask, int64_t rows, int64_t cols, int tile_rows, int tile_cols) {
  Mask out = Mask::none(rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.set(r, c, mask.at(r / tile_rows, c / tile_cols));
  return out;
}

}  // namespace nmkit
