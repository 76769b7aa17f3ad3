#pragma once
// The fused kernel's fast 2:4 rule: two groups at a time, one in each 16-bit lane of f16x2 registers. Packed
// compares give a mask per lane (0xffff or 0) and the selections are bit operations, so it costs half the
// instructions of two keep_two_of_four calls, whose decisions it takes on the f16 values.
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "rule_function.hpp"  // compiled by the host compiler too (with the CUDA headers) for the CPU tests

namespace nmkit::cuda::attention {

struct KeptPairs {
  uint32_t first, second;  // f16x2: each lane's kept scores in key order
  uint32_t nibbles;        // lane l's metadata nibble (keep_two_of_four's) at bit 16 l
  uint32_t largest;        // f16x2: each lane's largest score
};

NMKIT_RULE_FUNCTION uint32_t bits_of(__half2 x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

NMKIT_RULE_FUNCTION __half2 half2_of(uint32_t b) {
  __half2 x;
  memcpy(&x, &b, sizeof x);
  return x;
}

// Per bit: yes where mask is set, else no (one LOP3).
NMKIT_RULE_FUNCTION uint32_t select_bits(uint32_t mask, uint32_t yes, uint32_t no) {
  return (mask & yes) | (~mask & no);
}

// keep_two_of_four's rule, step for step, on x0..x3 (keys 0..3 of the two lanes' groups).
NMKIT_RULE_FUNCTION KeptPairs keep_two_of_four_x2(__half2 x0, __half2 x1, __half2 x2, __half2 x3) {
  constexpr uint32_t kBothLanes = 0x00010001u;
  const uint32_t a1 = __hgt2_mask(x1, x0), b1 = __hgt2_mask(x3, x2);
  const __half2 a_hi = __hmax2(x0, x1), a_lo = __hmin2(x0, x1), b_hi = __hmax2(x2, x3), b_lo = __hmin2(x2, x3);
  const uint32_t a_both = __hge2_mask(a_lo, b_hi), b_both = __hgt2_mask(b_lo, a_hi);
  const uint32_t general = (a1 & 0x1u * kBothLanes) | (b1 & 0x4u * kBothLanes) | 0x8u * kBothLanes;
  const uint32_t nibbles = select_bits(a_both, 0x4u * kBothLanes, select_bits(b_both, 0xeu * kBothLanes, general));
  return {select_bits(a_both, bits_of(x0), select_bits(b_both, bits_of(x2), bits_of(a_hi))),
          select_bits(a_both, bits_of(x1), select_bits(b_both, bits_of(x3), bits_of(b_hi))), nibbles,
          bits_of(__hmax2(a_hi, b_hi))};
}

}  // namespace nmkit::cuda::attention
