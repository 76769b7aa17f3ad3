#include "nmkit/format/nm.hpp"

#include <string>

#include "nmkit/error.hpp"
#include "nmkit/format/bit_packing.hpp"
#include "row_group_entries.hpp"
#include "slots.hpp"

namespace nmkit {
namespace {

std::string where(int64_t row, int64_t group) {
  return "row " + std::to_string(row) + ", group " + std::to_string(group);
}

}  // namespace

static_assert(index_bits_for(32) <= kMaxPackedBits, "N:M indices (M <= 32) are read two bytes at a time");

void check_nm_pattern(int n, int m) {
  require(m >= 2 && m <= 32, ErrorCode::invalid_argument, "N:M needs 2 <= M <= 32, got M=" + std::to_string(m));
  require(n >= 1 && n < m, ErrorCode::invalid_argument,
          "N:M needs 1 <= N < M, got " + std::to_string(n) + ":" + std::to_string(m));
}

NmMatrix compress_nm(const DenseMatrix& dense, int n, int m) { return compress_nm(dense, nonzero_mask(dense), n, m); }

NmMatrix compress_nm(const DenseMatrix& dense, const Mask& mask, int n, int m) {
  check_nm_pattern(n, m);
  require(mask.rows == dense.rows && mask.cols == dense.cols, ErrorCode::invalid_argument,
          "compress_nm: mask shape differs from the matrix shape");
  NmMatrix out;
  out.rows = dense.rows;
  out.cols = dense.cols;
  out.n = n;
  out.m = m;
  out.values = TypedBuffer(dense.dtype(), static_cast<std::size_t>(out.value_count()));
  out.indices.assign(packed_bytes(static_cast<std::size_t>(out.value_count()), out.index_bits()), 0);

  const int64_t groups = out.groups();
  for (int64_t r = 0; r < dense.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      bool kept[32] = {};
      for (int j = 0; j < m; ++j) {
        const int64_t c = g * m + j;
        kept[j] = c < dense.cols && mask.at(r, c);
      }
      int chosen[32];
      require(detail::choose_slots(kept, m, n, chosen), ErrorCode::pattern_violation, [&] {
        return "N:M " + std::to_string(n) + ":" + std::to_string(m) + " violated at " + where(r, g) + ": more than " +
               std::to_string(n) + " kept entries";
      });
      for (int s = 0; s < n; ++s) {
        const std::size_t vi = static_cast<std::size_t>((r * groups + g) * n + s);
        write_packed(out.indices, vi, out.index_bits(), static_cast<unsigned>(chosen[s]));
        if (kept[chosen[s]]) out.values.set(vi, dense.at(r, g * m + chosen[s]));
      }
    }
  }
  return out;
}

DenseMatrix decompress(const NmMatrix& a) { return detail::decompress_row_groups(a); }

void validate(const NmMatrix& a) {
  check_nm_pattern(a.n, a.m);
  require(a.rows >= 0 && a.cols >= 0, ErrorCode::invalid_argument, "N:M matrix has a negative shape");
  const auto count = static_cast<std::size_t>(a.value_count());
  require(a.values.size() == count, ErrorCode::invalid_argument,
          "N:M values hold " + std::to_string(a.values.size()) + " elements, expected " + std::to_string(count));
  require(a.indices.size() == packed_bytes(count, a.index_bits()), ErrorCode::invalid_argument,
          "N:M indices hold " + std::to_string(a.indices.size()) + " bytes, expected " +
              std::to_string(packed_bytes(count, a.index_bits())));
  require(padding_is_zero(a.indices, count, a.index_bits()), ErrorCode::invalid_argument,
          "N:M indices: the unused high bits of the last byte are not zero");
  detail::check_row_group_slots(a, a.m, {"N:M", "indices", "M"}, [&](int64_t vi) { return a.index(vi); });
}

std::size_t storage_bytes(const NmMatrix& a) noexcept { return a.values.size_bytes() + a.indices.size(); }

double nm_storage_ratio(int n, int m, int value_bits) {
  check_nm_pattern(n, m);
  require(value_bits > 0, ErrorCode::invalid_argument, "value_bits must be positive");
  return static_cast<double>(n) * (value_bits + index_bits_for(m)) / (static_cast<double>(m) * value_bits);
}

}  // namespace nmkit
