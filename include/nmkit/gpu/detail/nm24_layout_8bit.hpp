#pragma once
// The packed layout of 8-bit (e4m3, e5m2, int8) 2:4 weights for wgmma.mma_async.sp m64nNk64 (docs/formats.md,
// "8-bit 2:4 packed for the nm24 kernels"): the constants and index maths that the packer, the tests and a kernel
// share. Not part of the public API.
//
// What the PTX ISA fixes (§9.7.15.6 "wgmma.mma_async.sp"): for .e4m3/.e5m2/.s8/.u8 one instruction covers K = 64,
// each chunk of 4 consecutive K elements keeps 2 (§9.7.15.6.1 "Sparse matrix storage"), so A is m64 x k32 bytes;
// a nibble per chunk holds the two 2-bit indices, ascending (the first kept element's in the low 2 bits, as for
// 16-bit types), and every thread of a quad contributes metadata (sparsity selector 0). Each warp w of the
// warpgroup gives the metadata of rows 16w..16w+15 (§9.7.15.6.2, Figures 180 and 181, the layout of mma.sp
// m16n8k64's Figures 136 and 137): lane 4g + t holds row g + 8 (t % 2), logical columns 32 (t / 2) .. +31, chunk q
// in bits [4q, 4q + 4).
#include <cstdint>

#include "nmkit/gpu/detail/nm24_layout.hpp"

namespace nmkit::gpu::x8 {

inline constexpr int kGroup = 4;  // 2:4 along K
inline constexpr int kKept = 2;
inline constexpr int kFragmentK = 64;                                     // logical K of one m64nNk64 instruction
inline constexpr int kGroupsPerBlock = kFragmentK / kGroup;               // 16 chunks per row and k-block
inline constexpr int kStoredPerBlock = kGroupsPerBlock * kKept;           // 32 stored bytes per row and k-block
inline constexpr int kTileKBlocks = 2;                                    // two instructions per k-tile, as 16-bit
inline constexpr int kPackKAlign = kTileKBlocks * kFragmentK;             // K is padded to whole 128-wide k-tiles
inline constexpr int kTileStoredPerRow = kTileKBlocks * kStoredPerBlock;  // 64 bytes per row and k-tile

// Values: the canonical K-major, unswizzled layout ((8,m),(T,2k)):((1T,SBO),(1,LBO)) of §9.7.15.5.1.2.1.3 with
// T = 128 / 8 = 16 elements, so a core matrix is 8 rows x 16 bytes, 128 contiguous bytes, ordered per k-block as
// [8-row group (16)][16-byte half (2)]: LBO (next core matrix along K) 128, SBO (next 8 rows) 256.
inline constexpr int kCoreRows = 8;
inline constexpr int kCoreRowBytes = 16;
inline constexpr int kCoreMatrixBytes = kCoreRows * kCoreRowBytes;
inline constexpr int kCoresAlongK = kStoredPerBlock / kCoreRowBytes;  // 2, the "2k" of the canonical layout
inline constexpr int kLeadingByteOffset = kCoreMatrixBytes;
inline constexpr int kStrideByteOffset = kCoresAlongK * kCoreMatrixBytes;
inline constexpr int kKBlockValueBytes = kPackRowAlign / kCoreRows * kStrideByteOffset;      // 4 KiB
inline constexpr int kTileValueBytes = kTileKBlocks * kKBlockValueBytes;                     // 8 KiB
inline constexpr int kWarpgroupRows = 64;                                                    // M of wgmma
inline constexpr int kWarpgroupValueBytes = kWarpgroupRows / kCoreRows * kStrideByteOffset;  // 2 KiB

// The 16-bit kernel's staging carries over unchanged: the same bytes per tile, descriptor strides and fragments.
static_assert(kTileValueBytes == gpu::kTileValueBytes && kKBlockValueBytes == gpu::kKBlockValueBytes);
static_assert(kCoreMatrixBytes == gpu::kCoreMatrixBytes && kTileKBlocks == gpu::kTileKBlocks);

// Byte offset of stored value `stored_col` (0 .. K_padded / 2) of row `row` in the packed values; k_tiles =
// K_padded / 128. Tile-major like the 16-bit layout: one 128-row x 128-K tile is 8 KiB, one bulk copy.
constexpr int64_t packed_value_byte(int64_t row, int64_t stored_col, int64_t k_tiles) noexcept {
  const int64_t tile = row / kPackRowAlign * k_tiles + stored_col / kTileStoredPerRow;
  const int64_t r = row % kPackRowAlign, c = stored_col % kTileStoredPerRow, in_block = c % kStoredPerBlock;
  return tile * kTileValueBytes + c / kStoredPerBlock * kKBlockValueBytes + r / kCoreRows * kStrideByteOffset +
         in_block / kCoreRowBytes * kLeadingByteOffset + r % kCoreRows * kCoreRowBytes + in_block % kCoreRowBytes;
}

// Where warpgroup `warpgroup`'s m64 x k32-byte A operand of k-block `kblock_in_tile` starts inside a staged tile:
// the start address of its shared-memory descriptor, relative to the tile.
constexpr int a_operand_offset(int kblock_in_tile, int warpgroup) noexcept {
  return kblock_in_tile * kKBlockValueBytes + warpgroup * kWarpgroupValueBytes;
}

// The 32-bit word that register `reg` of lane `lane` holds in the mma.sp m16n8k64 A fragment (slab, kblock)
// (§9.7.14.6.2.6; wgmma's register-A form, Figure 179, is the same per warp): register u + 2h holds stored bytes
// 16h + 4t .. +3 of row 16 slab + 8u + g, so over a warp each register is one contiguous 128-byte core matrix.
inline constexpr int kQuadLanes = 4;      // a "group of four consecutive threads": lane = 4 groupID + thread
inline constexpr int kRegisterBytes = 4;  // four 8-bit values per 32-bit register
constexpr int64_t packed_value_word(int64_t slab, int64_t kblock, int64_t kblocks, int lane, int reg) noexcept {
  const int group_id = lane / kQuadLanes, thread_in_group = lane % kQuadLanes;
  const int64_t row = slab * kSlabRows + reg % 2 * kCoreRows + group_id;
  const int64_t stored = kblock * kStoredPerBlock + reg / 2 * kCoreRowBytes + thread_in_group * kRegisterBytes;
  return packed_value_byte(row, stored, kblocks / kTileKBlocks) / kRegisterBytes;
}

// packed_value_word split for a kernel: the word of register 0, and each register's distance from it in words (a
// constant, so that the four loads of a fragment share one address).
constexpr int64_t packed_fragment_word(int64_t slab, int64_t kblock, int64_t kblocks, int lane) noexcept {
  const int64_t tile = slab / kTileSlabs * (kblocks / kTileKBlocks) + kblock / kTileKBlocks;
  const int64_t byte = tile * kTileValueBytes + kblock % kTileKBlocks * kKBlockValueBytes +
                       slab % kTileSlabs * (kSlabRows / kCoreRows) * kStrideByteOffset +
                       lane / kQuadLanes * kCoreRowBytes + lane % kQuadLanes * kRegisterBytes;
  return byte / kRegisterBytes;
}
constexpr int packed_register_words(int reg) noexcept {
  return (reg % 2 * kStrideByteOffset + reg / 2 * kLeadingByteOffset) / kRegisterBytes;
}

// Metadata: one 32-bit word per lane and fragment (16-row slab x k-block), fragments tile-major at
// packed_fragment_index (nm24_layout.hpp; the same 8 slabs x 2 k-blocks per tile), so a tile's metadata is 2 KiB.
inline constexpr int kNibbleBits = 4;
inline constexpr int kMetadataWordBits = 32;
inline constexpr int kGroupsPerLane = kMetadataWordBits / kNibbleBits;  // 8 chunks: 32 logical columns per lane
struct MetadataSlot {
  int lane, shift;
};
// The lane and bit offset of chunk `group_in_block` (0..15) of row `row_in_slab` (0..15) in a fragment.
constexpr MetadataSlot metadata_slot(int row_in_slab, int group_in_block) noexcept {
  const int row_half = row_in_slab / kCoreRows, k_half = group_in_block / kGroupsPerLane;
  return {row_in_slab % kCoreRows * kQuadLanes + row_half + 2 * k_half, group_in_block % kGroupsPerLane * kNibbleBits};
}

}  // namespace nmkit::gpu::x8
