// The nm24 packed layout: round trip and the register positions the sparse MMA instructions expect.
#include <gtest/gtest.h>

#include "nmkit/error.hpp"
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
  // which sit in lane 4*1 + 1 = 5, register 1 + 2*1 = 3; its metadata in lanes 5 and 7 (groups 4..7),
  // bits [16 + 4, 16 + 8).
  DenseMatrix w = DenseMatrix::zeros(16, 32, DType::f16);
  w.set(9, 21, 1.0f), w.set(9, 23, 2.0f);
  const PackedNm24 p = pack_nm24(compress_nm(w, 2, 4));
  const uint32_t reg = p.values[5 * 4 + 3];
  EXPECT_EQ(reg & 0xffff, Half::from_float(1.0f).bits);
  EXPECT_EQ(reg >> 16, Half::from_float(2.0f).bits);
  for (int lane : {5, 7}) EXPECT_EQ((p.metadata[lane] >> 20) & 0xf, 1u | (3u << 2)) << lane;
  EXPECT_EQ((p.metadata[4] >> 20) & 0xf, 0x4u);  // lane 4 covers groups 0..3 of row 9: padding pattern (0, 1)
}

TEST(Nm24Pack, RejectsOtherPatternsAndDtypes) {
  const DenseMatrix w = test::random_matrix(16, 32, DType::f16, 3);
  EXPECT_NMKIT_ERROR(pack_nm24(compress_nm(w, prune_nm_magnitude(w, 2, 8), 2, 8)), ErrorCode::unsupported, "2:4");
  const DenseMatrix w32 = test::random_matrix(16, 32, DType::f32, 3);
  EXPECT_NMKIT_ERROR(pack_nm24(compress_nm(w32, prune_nm_magnitude(w32, 2, 4), 2, 4)), ErrorCode::unsupported, "f16 or bf16");
}

}  // namespace
}  // namespace nmkit::gpu
