// pack_nm24 / unpack_nm24 for 8-bit values: the logical 2:4 format with 8-bit codes <-> the operands of
// wgmma.mma_async.sp m64nNk64 (values in its shared-memory layout, metadata in register order).
// Host code only (no CUDA), so that CI tests it.
#include <algorithm>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/format/bit_packing.hpp"
#include "nmkit/gpu/detail/nm24_layout_8bit.hpp"
#include "nmkit/gpu/detail/nm24_pack_8bit.hpp"

namespace nmkit::gpu {
namespace {

constexpr int kIndexBits = 2;  // one index of a 2:4 group
constexpr int kBitsPerByte = 8;

struct Sizes {
  int64_t k_tiles, kblocks, slabs;
  std::size_t value_words, metadata_words;
};
Sizes sizes_of(int64_t rows_padded, int64_t cols_padded) {
  const int64_t k_tiles = cols_padded / x8::kPackKAlign, kblocks = cols_padded / x8::kFragmentK;
  const int64_t slabs = rows_padded / kSlabRows;
  return {k_tiles, kblocks, slabs, static_cast<std::size_t>(rows_padded * cols_padded / 2 / x8::kRegisterBytes),
          static_cast<std::size_t>(slabs * kblocks * kLanes)};
}

// The metadata word of the fragment that holds row r's group g, and the nibble's place in it.
struct NibbleAt {
  std::size_t word;
  int shift;
};
NibbleAt nibble_at(int64_t r, int64_t g, int64_t kblocks) {
  const int64_t kblock = g / x8::kGroupsPerBlock;
  const x8::MetadataSlot slot =
      x8::metadata_slot(static_cast<int>(r % kSlabRows), static_cast<int>(g % x8::kGroupsPerBlock));
  const int64_t fragment = packed_fragment_index(r / kSlabRows, kblock, kblocks);
  return {static_cast<std::size_t>(fragment * kLanes + slot.lane), slot.shift};
}

void put_byte(std::vector<uint32_t>& words, int64_t byte, uint8_t value) {
  const auto w = static_cast<std::size_t>(byte / x8::kRegisterBytes);
  const int shift = static_cast<int>(byte % x8::kRegisterBytes) * kBitsPerByte;
  words[w] = (words[w] & ~(0xffu << shift)) | (static_cast<uint32_t>(value) << shift);
}

uint8_t get_byte(const std::vector<uint32_t>& words, int64_t byte) {
  const int shift = static_cast<int>(byte % x8::kRegisterBytes) * kBitsPerByte;
  return static_cast<uint8_t>(words[static_cast<std::size_t>(byte / x8::kRegisterBytes)] >> shift);
}

}  // namespace

PackedNm24x8 pack_nm24(const QuantizedNmMatrix& a) {
  validate(a);
  require(a.n == x8::kKept && a.m == x8::kGroup, ErrorCode::unsupported,
          "pack_nm24 needs the 2:4 pattern, got " + std::to_string(a.n) + ":" + std::to_string(a.m));
  PackedNm24x8 p;
  p.rows = a.rows, p.cols = a.cols, p.type = a.type();
  p.rows_padded = round_up(std::max<int64_t>(a.rows, 1), kPackRowAlign);
  p.cols_padded = round_up(std::max<int64_t>(a.cols, 1), x8::kPackKAlign);
  const Sizes s = sizes_of(p.rows_padded, p.cols_padded);
  p.values.assign(s.value_words, 0);
  // Padding groups select positions 0 and 1 (distinct and ascending, as the instruction requires) of zero codes.
  constexpr uint32_t kPaddingNibble = 0u | (1u << kIndexBits);
  uint32_t padding_word = 0;
  for (int q = 0; q < x8::kGroupsPerLane; ++q) padding_word |= kPaddingNibble << (x8::kNibbleBits * q);
  p.metadata.assign(s.metadata_words, padding_word);
  p.scales = a.scales;
  p.scales.resize(static_cast<std::size_t>(p.rows_padded), 0.0f);

  const int64_t groups = a.groups();
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      uint32_t nibble = 0;
      for (int slot = 0; slot < x8::kKept; ++slot) {
        const int64_t vi = (r * groups + g) * x8::kKept + slot;
        put_byte(p.values, x8::packed_value_byte(r, g * x8::kKept + slot, s.k_tiles),
                 a.values.codes[static_cast<std::size_t>(vi)]);
        nibble |= a.index(vi) << (kIndexBits * slot);
      }
      const NibbleAt at = nibble_at(r, g, s.kblocks);
      uint32_t& word = p.metadata[at.word];
      word = (word & ~(0xfu << at.shift)) | (nibble << at.shift);
    }
  return p;
}

QuantizedNmMatrix unpack_nm24(const PackedNm24x8& p) {
  require(p.rows >= 0 && p.cols >= 0 && p.rows_padded % kPackRowAlign == 0 && p.cols_padded % x8::kPackKAlign == 0 &&
              p.rows <= p.rows_padded && p.cols <= p.cols_padded,
          ErrorCode::invalid_argument, "unpack_nm24: packed shape is inconsistent");
  const Sizes s = sizes_of(p.rows_padded, p.cols_padded);
  require(p.values.size() == s.value_words && p.metadata.size() == s.metadata_words &&
              p.scales.size() == static_cast<std::size_t>(p.rows_padded),
          ErrorCode::invalid_argument, "unpack_nm24: packed sizes are inconsistent");
  QuantizedNmMatrix a;
  a.rows = p.rows, a.cols = p.cols, a.n = x8::kKept, a.m = x8::kGroup;
  a.values.type = p.type;
  a.values.codes.assign(static_cast<std::size_t>(a.value_count()), 0);
  a.indices.assign(packed_bytes(static_cast<std::size_t>(a.value_count()), a.index_bits()), 0);
  a.scales.assign(p.scales.begin(), p.scales.begin() + p.rows);
  const int64_t groups = a.groups();
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const NibbleAt at = nibble_at(r, g, s.kblocks);
      const uint32_t nibble = (p.metadata[at.word] >> at.shift) & 0xfu;
      for (int slot = 0; slot < x8::kKept; ++slot) {
        const int64_t vi = (r * groups + g) * x8::kKept + slot;
        a.values.codes[static_cast<std::size_t>(vi)] =
            get_byte(p.values, x8::packed_value_byte(r, g * x8::kKept + slot, s.k_tiles));
        write_packed(a.indices, static_cast<std::size_t>(vi), a.index_bits(), (nibble >> (kIndexBits * slot)) & 3u);
      }
    }
  validate(a);
  return a;
}

}  // namespace nmkit::gpu
