#include "nmkit/format/spec.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/util/overloaded.hpp"

namespace nmkit {
namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= text.size(); ++i)
    if (i == text.size() || text[i] == sep) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  return parts;
}

int parse_int(std::string_view token, std::string_view spec) {
  int value = 0;
  const auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), value);
  require(ec == std::errc{} && end == token.data() + token.size() && !token.empty(), ErrorCode::invalid_argument,
          "format '" + std::string(spec) + "': '" + std::string(token) + "' is not an integer");
  return value;
}

double parse_density(std::string_view token, std::string_view spec) {
  std::string s(token);
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  require(!s.empty() && end == s.c_str() + s.size(), ErrorCode::invalid_argument,
          "format '" + std::string(spec) + "': density '" + s + "' is not a number");
  require(value > 0.0 && value <= 1.0, ErrorCode::invalid_argument,
          "format '" + std::string(spec) + "': density must be in (0, 1], got " + s);
  return value;
}

}  // namespace

FormatSpec parse_format_spec(std::string_view text) {
  const auto parts = split(text, ':');
  const std::string usage =
      "' (expected N:M (or nm:N:M), vnm:V:N:M, tile:RxC:DENSITY or tile:S:DENSITY for S x S tiles)";
  if (parts.size() == 2 || (parts.size() == 3 && parts[0] == "nm")) {
    NmSpec spec{parse_int(parts[parts.size() - 2], text), parse_int(parts.back(), text)};
    check_nm_pattern(spec.n, spec.m);
    return spec;
  }
  if (parts.size() == 4 && parts[0] == "vnm") {
    VnmSpec spec{parse_int(parts[1], text), parse_int(parts[2], text), parse_int(parts[3], text)};
    check_vnm_pattern(spec.v, spec.n, spec.m);
    return spec;
  }
  if (parts.size() == 3 && parts[0] == "tile") {
    const auto sides = split(parts[1], 'x');
    require(sides.size() == 1 || sides.size() == 2, ErrorCode::invalid_argument,
            "unknown format '" + std::string(text) + usage);
    TileSpec spec{parse_int(sides[0], text), parse_int(sides.back(), text), parse_density(parts[2], text)};
    check_tile_shape(spec.tile_rows, spec.tile_cols);
    return spec;
  }
  throw Error(ErrorCode::invalid_argument, "unknown format '" + std::string(text) + usage);
}

namespace {

// The one spelling of each pattern, shared by specs (to_string) and matrices (format_name).
std::string pattern_name(const NmSpec& s) { return std::to_string(s.n) + ":" + std::to_string(s.m); }
std::string pattern_name(const VnmSpec& s) {
  return "vnm:" + std::to_string(s.v) + ":" + std::to_string(s.n) + ":" + std::to_string(s.m);
}
std::string tile_pattern_name(int tile_rows, int tile_cols) {
  return "tile:" + std::to_string(tile_rows) + "x" + std::to_string(tile_cols);
}

}  // namespace

std::string to_string(const FormatSpec& spec) {
  return std::visit(overloaded{
                        [](const NmSpec& s) { return pattern_name(s); },
                        [](const VnmSpec& s) { return pattern_name(s); },
                        [](const TileSpec& s) {
                          char density[32];
                          std::snprintf(density, sizeof density, "%g", s.density);
                          return tile_pattern_name(s.tile_rows, s.tile_cols) + ":" + density;
                        },
                    },
                    spec);
}

int group_width(const FormatSpec& spec) noexcept {
  return std::visit(overloaded{[](const NmSpec& s) { return s.m; }, [](const VnmSpec& s) { return s.m; },
                               [](const TileSpec& s) { return s.tile_cols; }},
                    spec);
}

std::string format_name(const SparseMatrix& a) {
  return std::visit(overloaded{
                        [](const NmMatrix& x) {
                          return pattern_name(NmSpec{x.n, x.m});
                        },
                        [](const VnmMatrix& x) {
                          return pattern_name(VnmSpec{x.v, x.n, x.m});
                        },
                        [](const TileMatrix& x) { return tile_pattern_name(x.tile_rows, x.tile_cols); },
                    },
                    a);
}

DenseMatrix decompress(const SparseMatrix& a) {
  return std::visit([](const auto& x) { return decompress(x); }, a);
}
void validate(const SparseMatrix& a) {
  std::visit([](const auto& x) { validate(x); }, a);
}
std::size_t storage_bytes(const SparseMatrix& a) noexcept {
  return std::visit([](const auto& x) { return storage_bytes(x); }, a);
}
int64_t rows_of(const SparseMatrix& a) noexcept {
  return std::visit([](const auto& x) { return x.rows; }, a);
}
int64_t cols_of(const SparseMatrix& a) noexcept {
  return std::visit([](const auto& x) { return x.cols; }, a);
}
DType dtype_of(const SparseMatrix& a) noexcept {
  return std::visit([](const auto& x) { return x.dtype(); }, a);
}

namespace {
TypedBuffer converted(const TypedBuffer& values, DType dtype) {
  TypedBuffer out(dtype, values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    out.set(i, values.get(i));
    require(!std::isinf(out.get(i)) || std::isinf(values.get(i)), ErrorCode::invalid_argument, [&] {
      return "stored value " + std::to_string(i) + " (" + std::to_string(values.get(i)) + ") overflows " +
             dtype_name(dtype) + " (it would be stored as infinity); keep the weight in f32 or scale it";
    });
  }
  return out;
}
}  // namespace

SparseMatrix compress(const DenseMatrix& dense, const FormatSpec& spec) {
  return std::visit(
      overloaded{
          [&](const NmSpec& s) -> SparseMatrix { return compress_nm(dense, s.n, s.m); },
          [&](const VnmSpec& s) -> SparseMatrix { return compress_vnm(dense, s.v, s.n, s.m); },
          [&](const TileSpec& s) -> SparseMatrix { return compress_tiles(dense, s.tile_rows, s.tile_cols); },
      },
      spec);
}

SparseMatrix convert_values(const SparseMatrix& a, DType dtype) {
  SparseMatrix out = a;
  std::visit(overloaded{
                 [&](NmMatrix& m) { m.values = converted(m.values, dtype); },
                 [&](VnmMatrix& m) { m.values = converted(m.values, dtype); },
                 [&](TileMatrix& m) { m.data = converted(m.data, dtype); },
             },
             out);
  return out;
}

namespace {

// Slots of a row-wise N:M or V:N:M matrix that land inside the matrix (a tail group's padding columns do not).
template <class RowWise>
int64_t kept_slots(const RowWise& a) noexcept {
  int64_t kept = 0;
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < a.groups(); ++g)
      for (int s = 0; s < a.n; ++s) kept += a.column_of(r, g, s) < a.cols ? 1 : 0;
  return kept;
}

int64_t kept_entries(const TileMatrix& a) noexcept {
  int64_t kept = 0;
  for (int64_t c = 0; c < a.grid_cols(); ++c) {
    const int64_t width = std::min<int64_t>(a.tile_cols, a.cols - c * a.tile_cols);
    for (int32_t i = a.ptr[c]; i < a.ptr[c + 1]; ++i)
      kept += width * std::min<int64_t>(a.tile_rows, a.rows - int64_t{a.indices[i]} * a.tile_rows);
  }
  return kept;
}

}  // namespace

double format_density(const SparseMatrix& a) noexcept {
  const int64_t entries = rows_of(a) * cols_of(a);
  if (entries == 0) return 1.0;
  const int64_t kept = std::visit(overloaded{
                                      [](const NmMatrix& m) { return kept_slots(m); },
                                      [](const VnmMatrix& m) { return kept_slots(m); },
                                      [](const TileMatrix& m) { return kept_entries(m); },
                                  },
                                  a);
  return static_cast<double>(kept) / static_cast<double>(entries);
}

}  // namespace nmkit
