#pragma once
// DFSS's pruning rule on the GPU (include/nmkit/attention/dfss.hpp states it; the CPU oracle is sddmm_nm): one
// 2:4 group at a time, shared by the fused kernel and the unfused ops.
#include <cmath>
#include <cstdint>

#include "rule_function.hpp"  // compiled by the host compiler too, for the CPU tests

namespace nmkit::cuda::attention {

// The 2:4 rule on one group of four scores x0..x3 (keys in order): the two largest, ties to the lower key. The
// larger of each pair (x0, x1) and (x2, x3) is kept unless both of the other pair beat it; the lower pair wins ties.
// Gives the kept scores in key order and their 2-bit indices as one metadata nibble (lower index low).
struct KeptPair {
  float first, second;
  uint32_t nibble;
};
NMKIT_RULE_FUNCTION KeptPair keep_two_of_four(float x0, float x1, float x2, float x3) {
  const bool a1 = x1 > x0, b1 = x3 > x2;  // the pairs' larger (ties to the lower key)
  // The pairs' larger and smaller values by min/max, independent of the compares above (equal values are equal).
  const float a_hi = fmaxf(x0, x1), a_lo = fminf(x0, x1), b_hi = fmaxf(x2, x3), b_lo = fminf(x2, x3);
  const bool a_both = a_lo >= b_hi;  // (x0, x1) beat both of (x2, x3)
  const bool b_both = b_lo > a_hi;   // (x2, x3) beat both of (x0, x1)
  // Indices (i0, i1) as the nibble i0 | i1 << 2: (0, 1), (2, 3), or (a1, 2 + b1).
  const uint32_t nibble = a_both ? 0x4u : b_both ? 0xeu : (b1 ? 0xcu : 0x8u) | (a1 ? 0x1u : 0x0u);
  return {a_both ? x0 : b_both ? x2 : a_hi, a_both ? x1 : b_both ? x3 : b_hi, nibble};
}

}  // namespace nmkit::cuda::attention
