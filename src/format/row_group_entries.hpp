#pragma once
// N:M and V:N:M share one shape: N stored values per (row, group), value (r, g, s) at index
// (r * groups + g) * N + s, each mapping to a dense column through the format's column_of().
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::detail {

// Calls fn(row, column, value_index) for every stored value that lies inside the matrix (not in the K padding).
template <class RowGroupFormat, class Fn>
void for_each_stored_value(const RowGroupFormat& a, Fn&& fn) {
  const int64_t groups = a.groups();
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g)
      for (int s = 0; s < a.n; ++s) {
        const int64_t c = a.column_of(r, g, s);
        if (c < a.cols) fn(r, c, static_cast<std::size_t>((r * groups + g) * a.n + s));
      }
}

// The dense matrix of a row-group format, after validating it. Values and output share the dtype, so each stored
// value's bytes are copied as they are: no rounding, and no conversion per element.
template <class RowGroupFormat>
DenseMatrix decompress_row_groups(const RowGroupFormat& a) {
  validate(a);
  DenseMatrix out = DenseMatrix::zeros(a.rows, a.cols, a.dtype());
  const auto copy = [&]<std::size_t kBytes>() {
    const std::byte* from = a.values.data();
    std::byte* to = out.values.data();
    for_each_stored_value(a, [&](int64_t r, int64_t c, std::size_t vi) {
      std::memcpy(to + static_cast<std::size_t>(r * a.cols + c) * kBytes, from + vi * kBytes, kBytes);
    });
  };
  if (dtype_size(a.dtype()) == 4)
    copy.template operator()<4>();
  else
    copy.template operator()<2>();
  return out;
}

// The names check_row_group_slots puts in its messages: the format, its indices, and their bound.
struct SlotNames {
  const char* format;   // "N:M"
  const char* indices;  // "indices"
  const char* limit;    // "M"
};

// Checks the slots of every (row, group): `index_of(value_index)` below `limit` and strictly ascending, and a zero
// value wherever a slot lands in the K padding.
template <class RowGroupFormat, class IndexOf>
void check_row_group_slots(const RowGroupFormat& a, int limit, const SlotNames& names, IndexOf&& index_of) {
  const int64_t groups = a.groups();
  const auto where = [](int64_t r, int64_t g) { return "row " + std::to_string(r) + ", group " + std::to_string(g); };
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      int previous = -1;
      for (int s = 0; s < a.n; ++s) {
        const int64_t vi = (r * groups + g) * a.n + s;
        const int j = static_cast<int>(index_of(vi));
        require(j < limit, ErrorCode::pattern_violation, [&] {
          return std::string(names.format) + " index " + std::to_string(j) + " >= " + names.limit + "=" +
                 std::to_string(limit) + " at " + where(r, g);
        });
        require(j > previous, ErrorCode::pattern_violation, [&] {
          return std::string(names.format) + " " + names.indices + " not strictly ascending at " + where(r, g);
        });
        require(a.column_of(r, g, s) < a.cols || a.values.get(static_cast<std::size_t>(vi)) == 0.0f,
                ErrorCode::pattern_violation,
                [&] { return std::string(names.format) + " non-zero value in the K padding at " + where(r, g); });
        previous = j;
      }
    }
}

}  // namespace nmkit::detail
