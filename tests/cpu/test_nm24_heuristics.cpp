// The nm24 and V:N:M plans' shape heuristics, with device facts given: what each picks on the shapes that matter.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <span>

#include "nmkit/gpu/detail/nm24_heuristics.hpp"
#include "nmkit/gpu/detail/token_buckets.hpp"

namespace nmkit::gpu::nm24 {
namespace {

constexpr int kH200Sms = 132;
constexpr int64_t kH200L2 = 50 << 20;

bool is_choice(int block_n, std::span<const BlockNChoice> choices) {
  return std::any_of(choices.begin(), choices.end(), [&](const BlockNChoice& c) { return c.block_n == block_n; });
}

TEST(Nm24Heuristics, EveryWidthHasARateInZeroToOne) {
  for (const std::span<const BlockNChoice> choices :
       {std::span<const BlockNChoice>(kColMajorBlockN), std::span<const BlockNChoice>(kRowMajorBlockN),
        std::span<const BlockNChoice>(kGatherOneTileBlockN), std::span<const BlockNChoice>(kGatherTwoTilesBlockN)})
    for (const BlockNChoice& c : choices) {
      EXPECT_GT(c.one_wave_efficiency, 0.0) << c.block_n;
      EXPECT_LE(c.one_wave_efficiency, 1.0) << c.block_n;
      EXPECT_GT(c.multi_wave_efficiency, 0.0) << c.block_n;
      EXPECT_LE(c.multi_wave_efficiency, 1.0) << c.block_n;
    }
}

TEST(Nm24Heuristics, BlockNIsAlwaysOneOfTheKernelsTiles) {
  for (const auto choices :
       {std::span<const BlockNChoice>(kColMajorBlockN), std::span<const BlockNChoice>(kRowMajorBlockN),
        std::span<const BlockNChoice>(kGatherOneTileBlockN), std::span<const BlockNChoice>(kGatherTwoTilesBlockN)})
    for (int64_t rows : {1, 128, 4096, 28672})
      for (int64_t cols : {8, 4096, 12288})
        for (int64_t n : {1, 16, 100, 512, 8192})
          for (int sms : {1, 78, kH200Sms})
            EXPECT_TRUE(is_choice(sm90_block_n(rows, cols, n, sms, choices), choices))
                << rows << "x" << cols << "x" << n << " on " << sms << " SMs";
}

TEST(Nm24Heuristics, BlockNFollowsWhatBindsTheShape) {
  // Many tiles, math bound: the widest tile, whose wgmma run fastest.
  EXPECT_EQ(sm90_block_n(8192, 8192, 8192, kH200Sms, kColMajorBlockN), 256);
  EXPECT_EQ(sm90_block_n(11008, 4096, 4096, kH200Sms, kRowMajorBlockN), 256);
  // Decode: the k-tile rounds or reading A bind every width alike, so the narrowest that covers C wins.
  EXPECT_EQ(sm90_block_n(4096, 4096, 16, kH200Sms, kColMajorBlockN), 16);
  EXPECT_EQ(sm90_block_n(4096, 4096, 16, kH200Sms, kColMajorBlockN, SplitK::by_shape), 16);
  EXPECT_EQ(sm90_block_n(4096, 4096, 8, kH200Sms, kRowMajorBlockN), 64);
  // 32 row tiles and C = 100: four 32-wide columns fill one wave of the SMs, where 128 would leave 100 idle.
  EXPECT_EQ(sm90_block_n(4096, 4096, 100, kH200Sms, kColMajorBlockN), 32);
  // The same shape on a single SM: one wide tile per row tile wastes the least math on padding.
  EXPECT_EQ(sm90_block_n(4096, 4096, 100, 1, kColMajorBlockN), 128);
  // 86 row tiles at C = 256 (measured on the H200: n256 39 us, n128 45 us, n64 55 us): three waves of narrow tiles
  // each pay the k-tile rounds, one wave of n256 does not.
  EXPECT_EQ(sm90_block_n(11008, 4096, 256, kH200Sms, kColMajorBlockN), 256);
  EXPECT_EQ(sm90_block_n(11008, 4096, 128, kH200Sms, kColMajorBlockN), 128);  // one wave already (23 us)
  // Three waves of n128 took 0.93 of two of n192 (H100, in the same rounds).
  EXPECT_EQ(sm90_block_n(11008, 4096, 512, kH200Sms, kColMajorBlockN), 128);
  // 32 row tiles at C = 128, K = 11008: n64 split in two (64 CTAs; 35.6 us) beats 128 n32 tiles (40.0 us).
  EXPECT_EQ(sm90_block_n(4096, 11008, 128, kH200Sms, kColMajorBlockN, SplitK::by_shape), 64);
  EXPECT_EQ(sm90_block_n(4096, 11008, 128, kH200Sms, kColMajorBlockN), 32);
}

TEST(Nm24Heuristics, BlockNFollowsTheWidthsTimedInTheSameRounds) {
  // Widths pinned against the plan's in one set of rounds (H100). Several waves of tiles on large weights: n256
  // took 0.80 of n192's time at 13824x5120x2048 and 0.955 of n128's at 11008x4096x2048.
  EXPECT_EQ(sm90_block_n(13824, 5120, 2048, kH200Sms, kColMajorBlockN, SplitK::by_shape), 256);
  EXPECT_EQ(sm90_block_n(11008, 4096, 2048, kH200Sms, kColMajorBlockN, SplitK::by_shape), 256);
  // One wave of n192 beats two of n64 where one column tile covers C (n64 took 1.48x its time at T = 160).
  EXPECT_EQ(sm90_block_n(11008, 4096, 160, kH200Sms, kColMajorBlockN, SplitK::by_shape), 192);
  // Two waves of one column tile at T = 152 on 224 row tiles: n256 took 1.55x n192's time.
  EXPECT_EQ(sm90_block_n(28672, 8192, 152, kH200Sms, kColMajorBlockN, SplitK::by_shape), 192);
  // BERT-base's 768-row weights keep n192 (one wave of 132 tiles at T = 4096; n256 took 1.13-1.16x its time).
  EXPECT_EQ(sm90_block_n(768, 3072, 4096, kH200Sms, kColMajorBlockN, SplitK::by_shape), 192);
  EXPECT_EQ(sm90_block_n(768, 768, 4096, kH200Sms, kColMajorBlockN, SplitK::by_shape), 192);
  // 8-bit codes (k-tiles of 128): one wave of n256 at 11008x4096x256 took 0.75 of three waves of n64.
  EXPECT_EQ(sm90_block_n(11008, 4096, 256, kH200Sms, kColMajorBlockN, SplitK::by_shape, 128), 256);
}

TEST(Nm24Heuristics, GatherRasterKeepsTheGroupsRowsOfAInHalfOfL2) {
  // A 128-row tile of condensed A is 128 x K' x 1.125 bytes: at K' = 4096, 64 of them (38 MB) overflow half of
  // 50 MB and 32 (19 MB) fit.
  EXPECT_EQ(sm90_gather_group_rows(4096, kH200L2), 32);
  EXPECT_EQ(sm90_gather_group_rows(1024, kH200L2), 64);
  // Never below the 2:4 kernel's group, however long K'.
  EXPECT_EQ(sm90_gather_group_rows(1 << 20, kH200L2), kSm90GroupRows);
  EXPECT_EQ(sm90_gather_group_rows(1024, 4 << 20), kSm90GroupRows);
}

TEST(Nm24Heuristics, ScheduleStagesUnlessTheRegisterEpilogueRuns) {
  // The register epilogue needs outputs final in registers and whole 64-column parts.
  EXPECT_EQ(sm90_schedule(1000, 256, false, kH200Sms), Sm90Schedule::staged);
  EXPECT_EQ(sm90_schedule(1000, 32, true, kH200Sms), Sm90Schedule::staged);
  EXPECT_EQ(sm90_schedule(1000, 16, true, kH200Sms), Sm90Schedule::staged);
  // Persistent CTAs only where there are more tiles than SMs.
  EXPECT_EQ(sm90_schedule(kH200Sms + 1, 128, true, kH200Sms), Sm90Schedule::persistent);
  EXPECT_EQ(sm90_schedule(kH200Sms, 128, true, kH200Sms), Sm90Schedule::registers);
  EXPECT_EQ(sm90_schedule(1, 192, true, kH200Sms), Sm90Schedule::registers);
}

TEST(Nm24Heuristics, SplitKFillsGridsUnderAWave) {
  // 4096 x 4096 at T = 16: 32 tiles on 132 SMs, clusters of two (four measured slower).
  EXPECT_EQ(sm90_split(32, 64, kH200Sms), 2);
  EXPECT_EQ(sm90_split(1, 128, kH200Sms), 8);  // one row tile (128 rows): a cluster of 8
  EXPECT_EQ(sm90_split(8, 64, kH200Sms), 8);   // 1024 rows: 64 CTAs
  EXPECT_EQ(sm90_split(9, 64, kH200Sms), 4);   // clusters of 8 would take more than half the SMs
  EXPECT_EQ(sm90_split(16, 64, kH200Sms), 4);  // 64 CTAs
  EXPECT_EQ(sm90_split(17, 64, kH200Sms), 2);
  EXPECT_EQ(sm90_split(8, 24, kH200Sms), 6);  // at least kMinSplitKTiles k-tiles each
  EXPECT_EQ(sm90_split(10, 20, kH200Sms), 4);
  EXPECT_EQ(sm90_split(10, 7, kH200Sms), 1);
  // Splits that save fewer k-tile rounds than their fixed cost (kSplitCostKTiles): K = 768 and 1024.
  EXPECT_EQ(sm90_split(6, 12, kH200Sms), 1);     // 768 x 768 at T = 16 (was a split of 3)
  EXPECT_EQ(sm90_split(24, 12, kH200Sms), 1);    // 3072 x 768 at T = 64 (was 2)
  EXPECT_EQ(sm90_split(10, 16, kH200Sms), 1);    // a split of 4 would save 12 rounds
  EXPECT_EQ(sm90_split(66, 1024, kH200Sms), 1);  // half a wave already
  EXPECT_EQ(sm90_split(65, 1024, kH200Sms), 2);
  EXPECT_EQ(sm90_split(0, 64, kH200Sms), 1);
}

TEST(Nm24Heuristics, SkinnyTileCoversTheColumnsAndFillsTheSms) {
  // The narrowest column tile of 8 and 16 that covers C, 16 beyond it.
  EXPECT_EQ(skinny_block_n(0), 8);
  EXPECT_EQ(skinny_block_n(1), 8);
  EXPECT_EQ(skinny_block_n(9), 16);
  EXPECT_EQ(skinny_block_n(32), 16);
  EXPECT_EQ(skinny_block_n(4096), 16);
  // Two slabs a CTA once the 32-row grid has a CTA for every two SMs: 2048 rows (64 CTAs) at C = 16 do not, at
  // C = 17 (two column tiles) they do; 768 and 1024 rows never at decode sizes.
  EXPECT_EQ(skinny_block_m(2048, 16, kH200Sms), 16);
  EXPECT_EQ(skinny_block_m(2048, 17, kH200Sms), 32);
  EXPECT_EQ(skinny_block_m(3072, 16, kH200Sms), 32);
  EXPECT_EQ(skinny_block_m(768, 32, kH200Sms), 16);
  EXPECT_EQ(skinny_block_m(1024, 1, kH200Sms), 16);
  EXPECT_EQ(skinny_block_m(1, 1, 1), 32);
  // Unsplit: one batch of loads a warp, C up to 64, small weights only.
  EXPECT_TRUE(skinny_takes(768, 768, 1));
  EXPECT_TRUE(skinny_takes(3072, 768, 16));
  EXPECT_TRUE(skinny_takes(8192, 1024, 1));
  EXPECT_TRUE(skinny_takes(1024, 1024, 64));
  EXPECT_FALSE(skinny_takes(3072, 768, 32));
  EXPECT_FALSE(skinny_takes(8192, 1024, 16));
  EXPECT_FALSE(skinny_takes(768, 768, 65));
  // Split over a cluster: K up to 8192, weights up to 4096 x 1024, R x C up to 2048.
  EXPECT_TRUE(skinny_takes(768, 3072, 1));
  EXPECT_TRUE(skinny_takes(1024, 4096, 2));
  EXPECT_TRUE(skinny_takes(128, 8192, 16));
  EXPECT_FALSE(skinny_takes(768, 3072, 16));
  EXPECT_FALSE(skinny_takes(1280, 8192, 1));
  EXPECT_FALSE(skinny_takes(4096, 4096, 1));
  EXPECT_FALSE(skinny_takes(64, 16384, 1));
  // 8-bit codes: the same rule over k-blocks of 64 codes (the same 64 bytes of B, the same weight bytes).
  EXPECT_TRUE(skinny_takes_8bit(768, 768, 16));
  EXPECT_TRUE(skinny_takes_8bit(1024, 2048, 64));
  EXPECT_TRUE(skinny_takes_8bit(128, 8192, 16));
  EXPECT_TRUE(skinny_takes_8bit(4096, 2048, 1));
  EXPECT_FALSE(skinny_takes_8bit(768, 3072, 16));
  EXPECT_FALSE(skinny_takes_8bit(4096, 4096, 1));
  EXPECT_FALSE(skinny_takes_8bit(768, 768, 65));
}

TEST(Nm24Heuristics, VnmSkinnyTakesDecodeProductsOfSmallCondensedWeights) {
  // B row-major, condensed R x K': up to 4096 x 2048 at C <= 8, 4096 x 1024 at C <= 16.
  constexpr bool kRowMajor = false, kColMajor = true;
  EXPECT_TRUE(vnm_skinny_takes(4096, 2048, 1, kRowMajor));  // 4096 x 4096 at 2:8
  EXPECT_TRUE(vnm_skinny_takes(4096, 2048, 8, kRowMajor));
  EXPECT_FALSE(vnm_skinny_takes(4096, 2048, 9, kRowMajor));
  EXPECT_TRUE(vnm_skinny_takes(4096, 1024, 16, kRowMajor));  // 4096 x 4096 at 2:16
  EXPECT_FALSE(vnm_skinny_takes(4096, 1024, 17, kRowMajor));
  EXPECT_TRUE(vnm_skinny_takes(768, 384, 16, kRowMajor));
  EXPECT_FALSE(vnm_skinny_takes(11008, 2048, 1, kRowMajor));  // 11008 x 4096 at 2:8: the row gather is faster
  EXPECT_FALSE(vnm_skinny_takes(4096, 5504, 1, kRowMajor));
  // B col-major: any weight up to C = 16; never past K' = 8192 (a cluster's batch) in either layout.
  EXPECT_TRUE(vnm_skinny_takes(11008, 2048, 16, kColMajor));
  EXPECT_TRUE(vnm_skinny_takes(4096, 5504, 1, kColMajor));
  EXPECT_FALSE(vnm_skinny_takes(768, 384, 17, kColMajor));
  EXPECT_FALSE(vnm_skinny_takes(64, 8200, 1, kColMajor));
  EXPECT_FALSE(vnm_skinny_takes(64, 8200, 1, kRowMajor));
}

TEST(Nm24Heuristics, SkinnySplitKeepsOneBatchOfLoadsAWarp) {
  // Eight warps of four k-blocks of 32 take K = 1024 in one batch a CTA; two k-blocks a batch at 32 x 64 tiles.
  EXPECT_EQ(skinny_batch(1, 2), 4);
  EXPECT_EQ(skinny_batch(2, 8), 2);
  EXPECT_EQ(skinny_split(1, 16, 8), 1);
  EXPECT_EQ(skinny_split(1024, 16, 16), 1);
  EXPECT_EQ(skinny_split(1025, 16, 16), 2);
  EXPECT_EQ(skinny_split(4096, 32, 8), 4);
  EXPECT_EQ(skinny_split(768, 32, 64), 2);
  EXPECT_EQ(skinny_split(11008, 16, 8), kMaxClusterCtas);  // a cluster at most: more batches a warp beyond 8192
}

TEST(TokenBuckets, EveryTokenCountRunsAPlanAtMostAQuarterWider) {
  std::set<int64_t> buckets;
  int64_t previous = 0;
  for (int64_t t = 1; t <= 4096; ++t) {
    const int64_t b = detail::token_bucket(t);
    EXPECT_GE(b, t);
    EXPECT_LE(4 * b, 5 * t) << t;  // a plan's C is at most 25 % above the run's
    EXPECT_GE(b, previous) << t;   // monotone: buckets are intervals
    EXPECT_EQ(detail::token_bucket(b), b) << t;
    if (t <= detail::kExactTokens) EXPECT_EQ(b, t);
    previous = b;
    buckets.insert(b);
  }
  EXPECT_EQ(buckets.size(), 48u);  // 16 exact, then 4 per octave from 16 to 4096
  EXPECT_EQ(detail::token_bucket(17), 20);
  EXPECT_EQ(detail::token_bucket(4095), 4096);
  EXPECT_EQ(detail::token_bucket(int64_t{1} << 40), int64_t{1} << 40);
}

}  // namespace
}  // namespace nmkit::gpu::nm24
