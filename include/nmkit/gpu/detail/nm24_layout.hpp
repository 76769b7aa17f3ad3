#pragma once
// The nm24 kernels' packed layout (docs/formats.md, "2:4 packed for the nm24 kernels"): the constants and index
// maths that the kernels, pack_nm24 and the tests share. Not part of the public API.
#include <cstdint>

namespace nmkit::gpu {

inline constexpr int kSlabRows = 16;       // rows of one mma.sp / wgmma.sp warp fragment
inline constexpr int kFragmentK = 32;      // logical K of one sparse MMA
inline constexpr int kPackRowAlign = 128;  // R is padded to whole thread-block tiles
inline constexpr int kPackKAlign = 64;     // K is padded to whole k-tiles
inline constexpr int kLanes = 32;
inline constexpr int kRegistersPerFragment = 4;

inline constexpr int kTileSlabs = kPackRowAlign / kSlabRows;   // 8 slabs per 128-row tile
inline constexpr int kTileKBlocks = kPackKAlign / kFragmentK;  // 2 k-blocks per 64-wide k-tile

// Position of fragment (slab, kblock) in the packed metadata, tile-major: the 16 fragments of one 128 x 64 tile
// are contiguous, so a kernel stages a tile's metadata with one bulk copy.
constexpr int64_t packed_fragment_index(int64_t slab, int64_t kblock, int64_t kblocks) noexcept {
  const int64_t row_tile = slab / kTileSlabs, k_tile = kblock / kTileKBlocks, k_tiles = kblocks / kTileKBlocks;
  return ((row_tile * k_tiles + k_tile) * kTileSlabs + slab % kTileSlabs) * kTileKBlocks + kblock % kTileKBlocks;
}

// Metadata: with sparsity selector 0 the sparse MMA reads the metadata register of lanes 4g and 4g + 1 of each quad
// only (PTX ISA, "sparse matrix metadata"), so a fragment stores those 16 words, word 2g + t for lanes 4g + t and
// 4g + t + 2 (1 KiB per 128 x 64 tile): bits [0, 16) row g, [16, 32) row g + 8; lane 4g holds k-groups 0..3 of the
// k-block, lane 4g + 1 groups 4..7, a nibble per group.
inline constexpr int kMetaWordsPerFragment = kLanes / 2;
inline constexpr int kTileMetaBytes = kTileSlabs * kTileKBlocks * kMetaWordsPerFragment * 4;  // 1 KiB
// The word of a fragment's metadata that lane `lane` passes to the sparse MMA.
constexpr int meta_word_of_lane(int lane) noexcept { return lane / 4 * 2 + lane % 2; }
constexpr int64_t packed_meta_word(int64_t slab, int64_t kblock, int64_t kblocks, int lane) noexcept {
  return packed_fragment_index(slab, kblock, kblocks) * kMetaWordsPerFragment + meta_word_of_lane(lane);
}

// The packed values of a 128 x 64 tile (8 KiB, 32 stored values per row) are contiguous too, tile-major, and laid
// out as the canonical K-major, unswizzled operand of wgmma (PTX ISA §9.7.15.5.1.2): core matrices of 8 rows x 8
// stored values (16 bytes per row, 128 contiguous bytes), ordered [k-block (2)][8-row group (16)][8-value half
// (2)]. A warpgroup's m64 x k32 operand is then one shared-memory descriptor (wgmma.mma_async.sp with A in shared
// memory: the tensor cores read it; no register loads), and a warp's mma.sp A fragment of a 16-row slab is four
// core matrices (register r = u + 2 h: row group 2 (slab % 8) + u, half h), each read by the warp as 128
// contiguous bytes (docs/formats.md).
inline constexpr int kCoreMatrixBytes = 128;                                  // 8 rows x 16 bytes
inline constexpr int kKBlockValueBytes = kPackRowAlign * kFragmentK / 2 * 2;  // 4 KiB: 128 rows x 16 stored values
inline constexpr int kTileValueBytes = kTileKBlocks * kKBlockValueBytes;      // 8 KiB
// The 32-bit word (two stored values) that register `reg` of lane `lane` holds in the A fragment (slab, kblock).
constexpr int64_t packed_value_word(int64_t slab, int64_t kblock, int64_t kblocks, int lane, int reg) noexcept {
  const int64_t tile = slab / kTileSlabs * (kblocks / kTileKBlocks) + kblock / kTileKBlocks;
  const int64_t row_group = 2 * (slab % kTileSlabs) + reg % 2, half = reg / 2;
  const int64_t byte = tile * kTileValueBytes + kblock % kTileKBlocks * kKBlockValueBytes +
                       (2 * row_group + half) * kCoreMatrixBytes + lane / 4 * 16 + lane % 4 * 4;
  return byte / 4;
}

}  // namespace nmkit::gpu
