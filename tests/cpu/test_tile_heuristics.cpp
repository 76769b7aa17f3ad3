// The tile plan's heuristics (detail/tile_heuristics.hpp) on made-up devices: the Hopper kernel's token block,
// split, grid and epilogue, the kernel `automatic` takes, and the stream kernels' CTAs.
#include "nmkit/gpu/detail/tile_heuristics.hpp"

#include <gtest/gtest.h>

namespace nmkit::gpu::tile {
namespace {

constexpr int kH200Sms = 132;
// CTAs of clusters of 0..8 that run at once at two CTAs per SM, as an H200 reports them: 30 clusters of 8 fit.
constexpr ClusterWaveCtas kH200Waves = {0, 264, 264, 264, 264, 260, 264, 259, 240};

TEST(TileHeuristics, TheTokenBlockIsTheNarrowestThatCoversC) {
  for (const auto& [n, block_n] :
       {std::pair<int64_t, int>{1, 32}, {32, 32}, {33, 64}, {64, 64}, {65, 128}, {128, 128}, {129, 256}, {4096, 256}})
    EXPECT_EQ(sm90_block_n(n), block_n) << "C = " << n;
  EXPECT_EQ(sm90_ctas_per_sm(32), 2);
  EXPECT_EQ(sm90_ctas_per_sm(64), 2);
  EXPECT_EQ(sm90_ctas_per_sm(128), 1);
}

TEST(TileHeuristics, LargeGridsDoNotSplit) {
  const Sm90TileConfig c = sm90_tile_config(4096, 4096, 4096, 64, kH200Sms, kH200Waves);
  EXPECT_EQ(c.block_n, 256);
  EXPECT_EQ(c.split, 1);
}

TEST(TileHeuristics, DecodeTakesTheWidestSplitWhoseClustersRunAtOnce) {
  // 4096^2 at C = 32: 32 units; split 8 (256 CTAs) would need a second wave of clusters, split 7 (224) does not.
  EXPECT_EQ(sm90_tile_config(4096, 4096, 32, 64, kH200Sms, kH200Waves).split, 7);
  // Every CTA keeps at least four tile columns: 8 tile columns allow a split of 2.
  EXPECT_EQ(sm90_tile_config(4096, 512, 32, 64, kH200Sms, kH200Waves).split, 2);
  // Grids that fill more than a quarter of the slots do not split.
  EXPECT_EQ(sm90_tile_config(4096 * 3, 4096, 32, 64, kH200Sms, kH200Waves).split, 1);
  // Fewer clusters fit: a smaller split.
  ClusterWaveCtas small = kH200Waves;
  small[7] = small[6] = 160;
  EXPECT_EQ(sm90_tile_config(4096, 4096, 32, 64, kH200Sms, small).split, 5);
}

TEST(TileHeuristics, WideBlocksDoubleTheSplitWhileTheGridStaysSmall) {
  const ClusterWaveCtas unused{};  // one CTA per SM: the waves are not read
  EXPECT_EQ(sm90_tile_config(1024, 4096, 128, 64, kH200Sms, unused).split, 8);   // 8 units
  EXPECT_EQ(sm90_tile_config(2048, 4096, 128, 64, kH200Sms, unused).split, 4);   // 16 units
  EXPECT_EQ(sm90_tile_config(2048, 1024, 128, 128, kH200Sms, unused).split, 2);  // 8 tile columns
  EXPECT_EQ(sm90_tile_config(8192, 4096, 256, 64, kH200Sms, unused).split, 1);   // 64 units
}

TEST(TileHeuristics, TheLaunchOverridesTheShapeAndTheEpilogueFollows) {
  const Sm90TileConfig by_shape{256, 1, true, false};
  Sm90TileConfig c = sm90_launch_config(by_shape, {}, true);
  EXPECT_EQ(c.block_n, 256);
  EXPECT_EQ(c.split, 1);
  EXPECT_TRUE(c.persistent);
  EXPECT_TRUE(c.deferred_store);
  EXPECT_FALSE(sm90_launch_config(by_shape, {}, false).deferred_store);  // f32 D, beta != 0 or GELU
  c = sm90_launch_config(by_shape, {.block_n = 32}, true);               // no whole 64-token box
  EXPECT_EQ(c.block_n, 32);
  EXPECT_FALSE(c.deferred_store);
  c = sm90_launch_config(by_shape, {.split = 4}, true);  // split K: one unit per CTA, the cluster's epilogue
  EXPECT_EQ(c.split, 4);
  EXPECT_FALSE(c.persistent);
  EXPECT_FALSE(c.deferred_store);
  EXPECT_FALSE(sm90_launch_config(by_shape, {.persistent = false}, true).persistent);
  EXPECT_EQ(sm90_launch_config({32, 7, true, false}, {}, true).split, 7);
}

TEST(TileHeuristics, GridAndUnitClaims) {
  EXPECT_EQ(sm90_grid_ctas(512, 1, true, 256, kH200Sms), 132);
  EXPECT_EQ(sm90_grid_ctas(512, 1, true, 64, kH200Sms), 264);  // two CTAs per SM
  EXPECT_EQ(sm90_grid_ctas(100, 1, true, 256, kH200Sms), 100);
  EXPECT_EQ(sm90_grid_ctas(512, 1, false, 256, kH200Sms), 512);
  EXPECT_EQ(sm90_grid_ctas(32, 7, true, 32, kH200Sms), 224);  // split: one CTA per unit and share
  EXPECT_TRUE(sm90_claims_units(512, 132, 1, true, false));
  EXPECT_FALSE(sm90_claims_units(512, 132, 1, true, true));   // balanced: a static stride
  EXPECT_FALSE(sm90_claims_units(100, 100, 1, true, false));  // a unit per CTA
  EXPECT_FALSE(sm90_claims_units(512, 512, 1, false, false));
}

TEST(TileHeuristics, AutomaticKernel) {
  EXPECT_EQ(automatic_tile_kernel(true, 4096), TileKernel::sm90_wgmma);
  EXPECT_EQ(automatic_tile_kernel(true, 1), TileKernel::sm90_wgmma);
  EXPECT_EQ(automatic_tile_kernel(false, 32), TileKernel::stream_mma);
  EXPECT_EQ(automatic_tile_kernel(false, 33), TileKernel::sm80_mma);
}

TEST(TileHeuristics, StreamCtas) {
  EXPECT_EQ(stream_ctas(0, 264), 1);  // only empty rows to write
  EXPECT_EQ(stream_ctas(100, 264), 100);
  EXPECT_EQ(stream_ctas(1000, 264), 264);
  EXPECT_EQ(warp_stream_ctas(0, 32, 132), 1);
  EXPECT_EQ(warp_stream_ctas(100, 64, 1000), 13);  // 200 chunks, two per warp of eight
  EXPECT_EQ(warp_stream_ctas(100, 64, 5), 5);
  EXPECT_EQ(warp_stream_ctas(1, 32, 132), 1);
  EXPECT_TRUE(warp_stream_runs(64, 128));
  EXPECT_FALSE(warp_stream_runs(16, 64));
  EXPECT_FALSE(warp_stream_runs(32, 16));
}

}  // namespace
}  // namespace nmkit::gpu::tile
