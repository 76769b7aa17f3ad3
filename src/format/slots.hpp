#pragma once
// Slot selection shared by the N:M and V:N:M compressors: a group of `count` positions of which some
// are kept must be stored as exactly `slots` positions (the kept ones, then the smallest unused
// ones as explicit zeros), ascending, so that every group has the same size and sorted indices.
#include <cstdint>

namespace nmkit::detail {

inline constexpr int kMaxGroupPositions = 256;

// `kept[j]` for j < count. Writes the chosen positions to `chosen` (ascending) and returns true,
// or returns false when more than `slots` positions are kept.
inline bool choose_slots(const bool* kept, int count, int slots, int* chosen) {
  bool take[kMaxGroupPositions] = {};
  int taken = 0;
  for (int j = 0; j < count; ++j)
    if (kept[j]) {
      if (++taken > slots) return false;
      take[j] = true;
    }
  for (int j = 0; j < count && taken < slots; ++j)
    if (!take[j]) take[j] = true, ++taken;
  for (int j = 0, s = 0; j < count; ++j)
    if (take[j]) chosen[s++] = j;
  return true;
}

}  // namespace nmkit::detail
