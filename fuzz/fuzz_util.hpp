#pragma once
// Shared by the harnesses: a failed property aborts (libFuzzer records it as a crash, with the input that caused it).
// nmkit::Error from the parser or loader under test is the expected outcome of a bad input, and each harness catches
// exactly that type; an Error from using what was accepted is a failed property. Any other exception (bad_alloc,
// out_of_range, ...) leaves LLVMFuzzerTestOneInput and ends in std::terminate: a crash too.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/matrix.hpp"

namespace nmkit::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "nmkit fuzz: property violated: %s\n", what.c_str());
  std::abort();
}

inline void check(bool condition, const char* what) {
  if (!condition) fail(what);
}

// Runs `load`; an nmkit::Error there is a rejected input, the expected outcome of most. What it accepted goes to
// `use`, where an Error is a failed property: what a reader accepts must be usable.
template <class Load, class Use>
void accept_then_use(Load&& load, Use&& use) {
  std::optional<decltype(load())> loaded;
  try {
    loaded.emplace(load());
  } catch (const nmkit::Error&) {
    return;
  }
  try {
    use(*loaded);
  } catch (const nmkit::Error& e) {
    fail(std::string("an accepted file failed later: ") + e.what());
  }
}

// Dense matrices the harnesses decompress stay below this many elements (64 MiB in f32): a valid compressed
// matrix may describe a dense one of any size (a tile matrix of empty tiles stores only its ptr), and building
// that is the caller's choice, not something a file may force on a harness.
inline constexpr int64_t kMaxDenseElements = int64_t{1} << 24;

inline bool dense_fits(int64_t rows, int64_t cols) {
  return rows >= 0 && cols >= 0 && (rows == 0 || cols <= kMaxDenseElements / rows);
}

// Same shape, dtype and values (NaN equal to NaN, -0 equal to +0: compression keeps non-zeros only).
inline void check_same_dense(const DenseMatrix& a, const DenseMatrix& b, const char* what) {
  check(a.rows == b.rows && a.cols == b.cols && a.dtype() == b.dtype(), what);
  check(a.values.size() == b.values.size(), what);
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    const float x = a.values.get(i), y = b.values.get(i);
    check(x == y || (std::isnan(x) && std::isnan(y)), what);
  }
}

}  // namespace nmkit::fuzz
