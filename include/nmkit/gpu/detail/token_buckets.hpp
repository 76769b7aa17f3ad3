#pragma once
// The token counts a SparseLinear makes plans for. A serving loop sees thousands of distinct token counts T, so a
// layer plans once per bucket and runs that plan with the actual T (Nm24SpmmPlan::for_tokens): every T up to
// kExactTokens has its own plan (decode, where the n-tile tracks T closely), and above it each power-of-two octave
// is cut into kBucketsPerOctave buckets, so a plan's T is at most 25 % above the one it runs.
#include <bit>
#include <cstdint>

namespace nmkit::gpu::detail {

inline constexpr int64_t kExactTokens = 16;
inline constexpr int kBucketsPerOctave = 4;

// The largest T of the bucket that holds `tokens` (>= 1): the T its plan is made for.
constexpr int64_t token_bucket(int64_t tokens) noexcept {
  if (tokens <= kExactTokens) return tokens;
  // tokens in (2^e, 2^(e+1)]: buckets of width 2^e / kBucketsPerOctave.
  const int e = std::bit_width(static_cast<uint64_t>(tokens - 1)) - 1;
  const int64_t width = (int64_t{1} << e) / kBucketsPerOctave;
  return (tokens + width - 1) / width * width;
}

}  // namespace nmkit::gpu::detail
