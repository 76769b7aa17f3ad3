// The fused DFSS kernel's packed 2:4 rule (src/cuda/attention/keep_two_of_four_x2.cuh, compiled here by the host
// compiler with the CUDA headers, so only where CUDA is built) against the fp32 rule the CPU tests prove.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "../../src/cuda/attention/keep_two_of_four.cuh"
#include "../../src/cuda/attention/keep_two_of_four_x2.cuh"

namespace nmkit {
namespace {

// The fused kernel's packed rule (keep_two_of_four_x2: two groups in the lanes of f16x2 registers) against the fp32
// rule on every group of the same values (all exact in f16), each lane paired with a different group in the other.
TEST(DfssRule, ThePackedRuleDecidesAsTheScalarRule) {
  const float values[] = {-INFINITY, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  constexpr int kValues = 6, kGroups = kValues * kValues * kValues * kValues;
  const auto group = [&](int index, int key) {
    for (int i = 0; i < key; ++i) index /= kValues;
    return values[index % kValues];
  };
  const auto lane = [](uint32_t bits, int l) {
    const uint16_t half_bits = static_cast<uint16_t>(bits >> (16 * l));
    __half h;
    std::memcpy(&h, &half_bits, sizeof h);
    return __half2float(h);
  };
  for (int index = 0; index < kGroups; ++index) {
    const int partner = (7 * index + 3) % kGroups;  // 7 is coprime with 1296: lane 1 also sees every group
    __half2 x[4];
    for (int key = 0; key < 4; ++key) x[key] = __floats2half2_rn(group(index, key), group(partner, key));
    const cuda::attention::KeptPairs packed = cuda::attention::keep_two_of_four_x2(x[0], x[1], x[2], x[3]);
    for (int l = 0; l < 2; ++l) {
      const int g = l == 0 ? index : partner;
      const float x0 = group(g, 0), x1 = group(g, 1), x2 = group(g, 2), x3 = group(g, 3);
      const cuda::attention::KeptPair want = cuda::attention::keep_two_of_four(x0, x1, x2, x3);
      const auto where = [&] {
        return "lane " + std::to_string(l) + ", scores " + std::to_string(x0) + " " + std::to_string(x1) + " " +
               std::to_string(x2) + " " + std::to_string(x3);
      };
      ASSERT_EQ((packed.nibbles >> (16 * l)) & 0xffffu, want.nibble) << where();
      ASSERT_EQ(lane(packed.first, l), want.first) << where();
      ASSERT_EQ(lane(packed.second, l), want.second) << where();
      ASSERT_EQ(lane(packed.largest, l), std::max(std::max(x0, x1), std::max(x2, x3))) << where();
    }
  }
}

}  // namespace
}  // namespace nmkit
