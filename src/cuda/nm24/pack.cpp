// pack_nm24 / unpack_nm24: the logical 2:4 format <-> the sparse MMA operands (values in wgmma's shared-memory
// layout, metadata in register order).
// Host code only (no CUDA), so that CI tests it.
#include <algorithm>
#include <cstring>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu {
namespace {

constexpr int kGroup = 4;  // 2:4
constexpr int kKept = 2;
constexpr int kCompressedK = kFragmentK / 2;                 // 16 stored values per row per k-block
constexpr int kMetaGroupsPerLane = kFragmentK / 2 / kGroup;  // 4 groups (16 logical k) per metadata half

// Where value (row, logical group, slot) of one 16 x 32 fragment sits: lane and register half.
// Compressed column j = 2 * group + slot (group in [0, 8) inside the k-block).
struct FragmentPosition {
  int lane, reg, half;
};
FragmentPosition position_of(int row_in_slab, int compressed_col) {
  const int g = row_in_slab % 8, upper_rows = row_in_slab / 8;
  const int high_cols = compressed_col / 8, t = (compressed_col % 8) / 2;
  return {g * 4 + t, upper_rows + 2 * high_cols, compressed_col % 2};
}

uint16_t bits_of(const TypedBuffer& values, std::size_t i) {
  uint16_t b;
  std::memcpy(&b, values.data() + i * 2, 2);
  return b;
}

}  // namespace

PackedNm24 pack_nm24(const NmMatrix& a) {
  validate(a);
  require(a.n == kKept && a.m == kGroup, ErrorCode::unsupported,
          "pack_nm24 needs the 2:4 pattern, got " + std::to_string(a.n) + ":" + std::to_string(a.m));
  require(a.dtype() == DType::f16 || a.dtype() == DType::bf16, ErrorCode::unsupported,
          std::string("pack_nm24 needs f16 or bf16 values, got ") + dtype_name(a.dtype()));
  PackedNm24 p;
  p.rows = a.rows, p.cols = a.cols, p.dtype = a.dtype();
  p.rows_padded = round_up(std::max<int64_t>(a.rows, 1), kPackRowAlign);
  p.cols_padded = round_up(std::max<int64_t>(a.cols, 1), kPackKAlign);
  const int64_t slabs = p.rows_padded / kSlabRows, kblocks = p.cols_padded / kFragmentK;
  p.values.assign(static_cast<std::size_t>(slabs * kblocks * kLanes * kRegistersPerFragment), 0);
  // Padding groups select positions 0 and 1 (ordered, as the instruction requires) with zero values.
  constexpr uint32_t kPaddingNibble = 0u | (1u << 2);
  uint32_t padding_word = 0;
  for (int i = 0; i < 8; ++i) padding_word |= kPaddingNibble << (4 * i);
  p.metadata.assign(static_cast<std::size_t>(slabs * kblocks * kMetaWordsPerFragment), padding_word);

  const int64_t groups = a.groups();
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t slab = r / kSlabRows;
    const int row = static_cast<int>(r % kSlabRows);
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t kblock = g * kGroup / kFragmentK;
      const int group_in_block = static_cast<int>(g % (kFragmentK / kGroup));
      uint32_t nibble = 0;
      for (int s = 0; s < kKept; ++s) {
        const int64_t vi = (r * groups + g) * kKept + s;
        const FragmentPosition pos = position_of(row, group_in_block * kKept + s);
        uint32_t& reg = p.values[static_cast<std::size_t>(packed_value_word(slab, kblock, kblocks, pos.lane, pos.reg))];
        reg |= static_cast<uint32_t>(bits_of(a.values, static_cast<std::size_t>(vi))) << (16 * pos.half);
        nibble |= a.index(vi) << (2 * s);
      }
      // Metadata: lane 4 gid holds k-groups 0..3 of the block, lane 4 gid + 1 groups 4..7; bits [0, 16) for row
      // gid, [16, 32) for row gid + 8.
      const int gid = row % 8, upper = row / 8;
      const int lane = gid * 4 + group_in_block / kMetaGroupsPerLane;
      const int shift = 16 * upper + 4 * (group_in_block % kMetaGroupsPerLane);
      uint32_t& word = p.metadata[static_cast<std::size_t>(packed_meta_word(slab, kblock, kblocks, lane))];
      word = (word & ~(0xfu << shift)) | (nibble << shift);
    }
  }
  return p;
}

NmMatrix unpack_nm24(const PackedNm24& p) {
  const int64_t slabs = p.rows_padded / kSlabRows, kblocks = p.cols_padded / kFragmentK;
  require(p.rows_padded % kPackRowAlign == 0 && p.cols_padded % kPackKAlign == 0 && p.rows <= p.rows_padded &&
              p.cols <= p.cols_padded &&
              p.values.size() == static_cast<std::size_t>(slabs * kblocks * kLanes * kRegistersPerFragment) &&
              p.metadata.size() == static_cast<std::size_t>(slabs * kblocks * kMetaWordsPerFragment),
          ErrorCode::invalid_argument, "unpack_nm24: packed sizes are inconsistent");
  NmMatrix a;
  a.rows = p.rows, a.cols = p.cols, a.n = kKept, a.m = kGroup;
  a.values = TypedBuffer(p.dtype, static_cast<std::size_t>(a.value_count()));
  a.indices.assign(static_cast<std::size_t>((a.value_count() * a.index_bits() + 7) / 8), 0);
  const int64_t groups = a.groups();
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t slab = r / kSlabRows, kblock = g * kGroup / kFragmentK;
      const int row = static_cast<int>(r % kSlabRows), group_in_block = static_cast<int>(g % (kFragmentK / kGroup));
      const int gid = row % 8, upper = row / 8;
      const int lane = gid * 4 + group_in_block / kMetaGroupsPerLane;
      const uint32_t word = p.metadata[static_cast<std::size_t>(packed_meta_word(slab, kblock, kblocks, lane))];
      const uint32_t nibble = (word >> (16 * upper + 4 * (group_in_block % kMetaGroupsPerLane))) & 0xf;
      for (int s = 0; s < kKept; ++s) {
        const int64_t vi = (r * groups + g) * kKept + s;
        const FragmentPosition pos = position_of(row, group_in_block * kKept + s);
        const uint32_t reg =
            p.values[static_cast<std::size_t>(packed_value_word(slab, kblock, kblocks, pos.lane, pos.reg))];
        const uint16_t bits = static_cast<uint16_t>(reg >> (16 * pos.half));
        std::memcpy(a.values.data() + vi * 2, &bits, 2);
        const unsigned index = (nibble >> (2 * s)) & 3u;
        for (int b = 0; b < 2; ++b)
          if ((index >> b) & 1u) a.indices[(vi * 2 + b) / 8] |= static_cast<uint8_t>(1u << ((vi * 2 + b) % 8));
      }
    }
  validate(a);
  return a;
}

}  // namespace nmkit::gpu
