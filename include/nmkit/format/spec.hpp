#pragma once
// Format specifications as users write them ("2:4", "vnm:128:2:8", "tile:64x64:0.25") and the
// sum type of the three compressed formats.
#include <string>
#include <string_view>
#include <variant>

#include "nmkit/format/nm.hpp"
#include "nmkit/format/tile.hpp"
#include "nmkit/format/vnm.hpp"

namespace nmkit {

struct NmSpec {
  int n = 2;
  int m = 4;
};
struct VnmSpec {
  int v = 64;
  int n = 2;
  int m = 8;
};
struct TileSpec {
  int tile_rows = 64;
  int tile_cols = 64;
  double density = 0.25;  // fraction of tiles kept
};
using FormatSpec = std::variant<NmSpec, VnmSpec, TileSpec>;

// Accepts "N:M" (or "nm:N:M"), "vnm:V:N:M", "tile:RxC:DENSITY" (or "tile:S:DENSITY" for square).
FormatSpec parse_format_spec(std::string_view text);
std::string to_string(const FormatSpec& spec);

using SparseMatrix = std::variant<NmMatrix, VnmMatrix, TileMatrix>;

// The columns a format decides together: M for N:M and V:N:M, the tile width for tiles.
int group_width(const FormatSpec& spec) noexcept;

std::string format_name(const SparseMatrix& a);  // "2:4", "vnm:128:2:8", "tile:64x64"
DenseMatrix decompress(const SparseMatrix& a);
void validate(const SparseMatrix& a);
std::size_t storage_bytes(const SparseMatrix& a) noexcept;
int64_t rows_of(const SparseMatrix& a) noexcept;
int64_t cols_of(const SparseMatrix& a) noexcept;
DType dtype_of(const SparseMatrix& a) noexcept;
// Compresses a matrix that already satisfies `spec` (a tile spec's density is not used: every tile holding a
// non-zero is kept). Throws pattern_violation naming the first offending row and group.
SparseMatrix compress(const DenseMatrix& dense, const FormatSpec& spec);
// The same weight with its stored values rounded to `dtype` (the pattern and indices unchanged). Throws Error
// when a finite value would round to infinity.
SparseMatrix convert_values(const SparseMatrix& a, DType dtype);
// The density everywhere nmkit prints one: the fraction of the matrix's entries the compressed form keeps
// (N/M for whole groups; a tail group keeps at most its real columns, an edge tile only its part inside).
double format_density(const SparseMatrix& a) noexcept;

}  // namespace nmkit
