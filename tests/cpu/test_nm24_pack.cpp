// The nm24 packed layout: round trip and the register positions the sparse MMA instructions expect.
#include <gtest/gtest.h>

#include <cstring>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {
namespace {

NmMatrix random_24(int64_t r, int64_t k, DType dtype, uint32_t seed) {
  const DenseMatrix w = test::random_matrix(r, k, dtype, seed);
  return compress_nm(w, prune_nm_magnitude(w, 2, 4), 2, 4);
}

TEST(Nm24Pack, RoundTripsWithTails) {
  for (DType dtype : {DType::f16, DType::bf16})
    for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 4}, {16, 32}, {130, 70}, {257, 1000}}) {
      const NmMatrix a = random_24(r, k, dtype, static_cast<uint32_t>(r * k));
      const PackedNm24 p = pack_nm24(a);
      EXPECT_EQ(p.rows_padded % kPackRowAlign, 0);
      EXPECT_EQ(p.cols_padded % kPackKAlign, 0);
      const NmMatrix back = unpack_nm24(p);
      EXPECT_EQ(back.indices, a.indices);
      EXPECT_EQ(back.values.to_float(), a.values.to_float());
    }
}

TEST(Nm24Pack, FragmentPositionsFollowTheInstruction) {
  // Row 9 (g = 1, upper half), logical columns 20..23 = group 5 of k-block 0: compressed columns 10, 11,
  // which sit in lane 4*1 + 1 = 5, register 1 + 2*1 = 3; its metadata in lane 5's word (groups 4..7, read by lanes
  // 5 and 7), word 2*1 + 1 = 3 of the fragment, bits [16 + 4, 16 + 8).
  DenseMatrix w = DenseMatrix::zeros(16, 32, DType::f16);
  w.set(9, 21, 1.0f), w.set(9, 23, 2.0f);
  const PackedNm24 p = pack_nm24(compress_nm(w, 2, 4));
  const uint32_t reg = p.values[static_cast<std::size_t>(packed_value_word(0, 0, p.cols_padded / kFragmentK, 5, 3))];
  EXPECT_EQ(reg & 0xffff, Half::from_float(1.0f).bits);
  EXPECT_EQ(reg >> 16, Half::from_float(2.0f).bits);
  ASSERT_EQ(p.metadata.size(), static_cast<std::size_t>(kTileSlabs * kTileKBlocks * kMetaWordsPerFragment));
  for (int lane : {5, 7}) {
    const auto word = static_cast<std::size_t>(packed_meta_word(0, 0, p.cols_padded / kFragmentK, lane));
    EXPECT_EQ(word, 3u) << lane;
    EXPECT_EQ((p.metadata[word] >> 20) & 0xf, 1u | (3u << 2)) << lane;
  }
  EXPECT_EQ((p.metadata[2] >> 20) & 0xf, 0x4u);  // lane 4 covers groups 0..3 of row 9: padding pattern (0, 1)
}

TEST(Nm24Pack, ValuesSitInTheWgmmaSharedMemoryLayout) {
  // Stored value j of row r (compressed column c = j % 32 of k-tile j / 32) sits where wgmma's K-major unswizzled
  // layout puts it: tile (r / 128, j / 32), k-block c / 16, core matrix (row group r % 128 / 8, half c % 16 / 8), row
  // r % 8, value c % 8; with two row tiles and three k-tiles, every tile index is exercised.
  const NmMatrix a = random_24(256, 192, DType::f16, 11);
  const PackedNm24 p = pack_nm24(a);
  const int64_t k_tiles = p.cols_padded / kPackKAlign, stored_per_row = a.cols / 2;
  const auto* bytes = reinterpret_cast<const unsigned char*>(p.values.data());
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t j = 0; j < stored_per_row; ++j) {
      const int64_t tile = r / kPackRowAlign * k_tiles + j / 32, c = j % 32, row = r % kPackRowAlign;
      const int64_t at = tile * kTileValueBytes + c / 16 * kKBlockValueBytes +
                         (row / 8 * 2 + c % 16 / 8) * kCoreMatrixBytes + row % 8 * 16 + c % 8 * 2;
      uint16_t bits;
      std::memcpy(&bits, bytes + at, 2);
      uint16_t expected;
      std::memcpy(&expected, a.values.data() + (r * stored_per_row + j) * 2, 2);
      ASSERT_EQ(bits, expected) << "row " << r << " stored value " << j;
    }
}

TEST(Nm24Pack, RejectsOtherPatternsAndDtypes) {
  const DenseMatrix w = test::random_matrix(16, 32, DType::f16, 3);
  EXPECT_NMKIT_ERROR(pack_nm24(compress_nm(w, prune_nm_magnitude(w, 2, 8), 2, 8)), ErrorCode::unsupported, "2:4");
  const DenseMatrix w32 = test::random_matrix(16, 32, DType::f32, 3);
  EXPECT_NMKIT_ERROR(pack_nm24(compress_nm(w32, prune_nm_magnitude(w32, 2, 4), 2, 4)), ErrorCode::unsupported,
                     "f16 or bf16");
}

}  // namespace
}  // namespace nmkit::gpu
