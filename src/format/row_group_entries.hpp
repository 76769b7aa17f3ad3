#pragma once
// N:M and V:N:M share one shape: N stored values per (row, group), value (r, g, s) at index
// (r * groups + g) * N + s, each mapping to a dense column through the format's column_of().
#include <cstddef>
#include <cstdint>

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

}  // namespace nmkit::detail
