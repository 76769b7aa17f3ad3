// The tile-sparse SpMM against the CPU oracle: tile shapes 16..128 (square and rectangular), densities down to
// empty tile rows and columns, skewed patterns, tails in R, K and C, both layouts, every epilogue, f16 and bf16,
// outputs poisoned. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <array>
#include <initializer_list>
#include <random>
#include <span>
#include <vector>
#include <string>

#include "gpu/gpu_test_util.hpp"
#include "nmkit/device.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/detail/tile_timeline.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace nmkit::gpu {
namespace {

struct Case : Problem {
  int tile_rows, tile_cols;
  double density;
  TileKernel kernel = TileKernel::automatic;
  TileLaunch launch = {};
};

std::string describe(const Case& t) {
  return describe(static_cast<const Problem&>(t)) + " tiles " + std::to_string(t.tile_rows) + "x" +
         std::to_string(t.tile_cols) + " density " + std::to_string(t.density) + " kernel " + kernel_name(t.kernel);
}

double run_with(const TileMatrix& a, const Problem& t, uint32_t seed, TileKernel kernel = TileKernel::automatic,
                const TileLaunch& launch = {}) {
  const DeviceTiles da = DeviceTiles::upload(pack_tiles(a));
  const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), a.tile_rows, a.tile_cols, kernel, launch);
  return error_against_oracle(SparseMatrix{a}, t, seed, [&](const void* b, const void* c, void* d, const float* bias) {
    plan.run(nullptr, da, b, c, d, bias);
  });
}

double run_case(const Case& t, uint32_t seed) {
  const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, t.dtype, seed), t.dtype);
  return run_with(
      compress_tiles(w, prune_tiles_by_norm(w, t.tile_rows, t.tile_cols, t.density), t.tile_rows, t.tile_cols), t, seed,
      t.kernel, t.launch);
}

Problem plain(int64_t r, int64_t k, int64_t c, DType dtype, Layout b_layout) {
  return {r, k, c, dtype, dtype, b_layout, Layout::col_major, 1.0f, 0.0f, false, Activation::none};
}

TEST(TileGpu, TileShapesDensitiesAndTails) {
  SKIP_WITHOUT_GPU();
  const int64_t shapes[][3] = {{256, 256, 128}, {200, 333, 77},   {64, 40, 17},
                               {1, 16, 1},      {520, 1000, 300}, {200, 344, 136}};
  const std::pair<int, int> tiles[] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {64, 128}, {128, 64}, {16, 128}};
  uint32_t seed = 1;
  for (Layout b_layout : {Layout::col_major, Layout::row_major})
    for (std::size_t i = 0; i < std::size(shapes); ++i)
      for (std::size_t j = 0; j < std::size(tiles); ++j)
        for (double density : {0.1, 0.5, 1.0}) {
          const auto& s = shapes[i];
          const DType dtype = (i + j) % 2 ? DType::bf16 : DType::f16;
          const Case t{plain(s[0], s[1], s[2], dtype, b_layout), tiles[j].first, tiles[j].second, density};
          EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t);
        }
}

// side x side tiles over a (5 side - 7) x 9 side weight: tile row 0 full, tile row 1 empty, the others one tile
// each (skewed rows next to an empty one); `stored` false: the same shape with no tile at all.
TileMatrix skewed_tiles(int side, bool stored = true) {
  const int64_t r = 5 * side - 7, k = 9 * side;
  const DenseMatrix w = test::random_matrix(r, k, DType::f16, 9);
  TileMask mask{ceil_div(r, int64_t{side}), ceil_div(k, int64_t{side}), {}};
  mask.keep.assign(static_cast<std::size_t>(mask.grid_rows * mask.grid_cols), 0);
  if (stored) {
    for (int64_t j = 0; j < mask.grid_cols; ++j) mask.keep[static_cast<std::size_t>(j)] = 1;
    for (int64_t i = 2; i < mask.grid_rows; ++i)
      mask.keep[static_cast<std::size_t>(i * mask.grid_cols + (i * 3) % mask.grid_cols)] = 1;
  }
  return compress_tiles(w, mask, side, side);
}

// The stream kernels on skewed_tiles(side) and on its all-empty twin, with beta, bias and both D layouts, on each
// grid of `ctas` (0: the plan's own); seeds seed and seed + 1.
void expect_skewed_and_empty(TileKernel kernel, int side, std::initializer_list<int> ctas, uint32_t seed) {
  const TileMatrix a = skewed_tiles(side), empty = skewed_tiles(side, false);
  for (Layout d_layout : {Layout::col_major, Layout::row_major})
    for (int grid : ctas) {
      const Problem t{a.rows,   a.cols, 20,   DType::f16, DType::f16,      Layout::col_major,
                      d_layout, 1.5f,   0.5f, true,       Activation::none};
      EXPECT_LE(run_with(a, t, seed, kernel, {.stream_ctas = grid}), tolerance(DType::f16))
          << describe(t) << " side " << side << " stream_ctas " << grid;
      EXPECT_LE(run_with(empty, t, seed + 1, kernel, {.stream_ctas = grid}), tolerance(DType::f16))
          << describe(t) << " side " << side << " stream_ctas " << grid << " empty weight";
    }
}

TEST(TileGpu, SkewedRowsAndEmptyTileRows) {
  SKIP_WITHOUT_GPU();
  // Tile row 0 full, tile row 1 empty, the others one tile each: D's empty rows are alpha * 0 + beta * C + bias.
  // 64 and 128 run the Hopper kernel on an sm_90 device (an empty row next to a full one in a 128-row block).
  for (int side : {32, 64, 128}) {
    const TileMatrix a = skewed_tiles(side);
    const int64_t r = a.rows, k = a.cols;
    for (Layout d_layout : {Layout::col_major, Layout::row_major})
      for (int64_t n : {70, 300}) {
        const Problem t{r,        k,    n,    DType::f16, DType::f16,      Layout::col_major,
                        d_layout, 1.5f, 0.5f, true,       Activation::none};
        EXPECT_LE(run_with(a, t, 21), tolerance(DType::f16)) << describe(t) << " side " << side;
      }
  }
}

TEST(TileGpu, LayoutsAndEpilogues) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1000;
  for (const Problem& problem : layout_and_epilogue_problems(136, 200, 96)) {
    const Case t{problem, 32, 64, 0.5};
    EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
  }
}

bool sm90_here() {
  try {
    TileSpmmPlan::create({128, 64, 128}, 64, 64, TileKernel::sm90_wgmma);
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(TileGpu, HopperKernelAgainstTheOracle) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // Token blocks of 64/128/256 (C = 1..300), R tails that leave a 128-row block half empty, K tails inside the
  // last tile column, and small grids that split K across clusters of 2..8 CTAs.
  const int64_t shapes[][3] = {{256, 256, 128}, {200, 320, 77},  {520, 1000, 300},
                               {64, 64, 1},     {300, 2048, 40}, {72, 4000, 130}};
  uint32_t seed = 7000;
  for (std::size_t i = 0; i < std::size(shapes); ++i)
    for (int tile_rows : {64, 128})
      for (int tile_cols : {64, 128})
        for (double density : {0.1, 0.5, 1.0}) {
          const auto& s = shapes[i];
          const DType dtype = (i + tile_rows / 64 + tile_cols / 64) % 2 ? DType::bf16 : DType::f16;
          const Case t{plain(s[0], s[1], s[2], dtype, Layout::col_major), tile_rows, tile_cols, density,
                       TileKernel::sm90_wgmma};
          EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t);
        }
  for (const Problem& problem : layout_and_epilogue_problems(136, 1024, 40)) {  // split K, every epilogue
    if (problem.b_layout == Layout::row_major) continue;                        // the plan refuses; tested below
    const Case t{problem, 64, 64, 0.5, TileKernel::sm90_wgmma};
    EXPECT_GT(TileSpmmPlan::create(t.desc(), 64, 64, TileKernel::sm90_wgmma).launch().split, 1) << describe(t);
    EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
  }
  for (const Problem& problem : layout_and_epilogue_problems(136, 200, 96)) {
    if (problem.b_layout == Layout::row_major) continue;
    const Case t{problem, 128, 64, 0.5, TileKernel::sm90_wgmma};
    EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
  }
}

TEST(TileGpu, HopperKernelRunsSmallTilesWidened) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // Tile sides of 16 and 32 run the Hopper kernel on the weight's widened copy (64 along the narrow sides, zeros
  // around the small tiles): R and K tails inside a small tile and past the last wide one, empty wide tiles,
  // split K (C = 40) and persistent units (C = 300), both D layouts.
  const int64_t shapes[][3] = {{200, 328, 300}, {1000, 2048, 40}, {72, 96, 5}};
  const std::pair<int, int> tiles[] = {{16, 16}, {32, 32}, {32, 64}, {128, 32}, {16, 128}};
  uint32_t seed = 9300;
  for (const auto& s : shapes)
    for (const auto& [tile_rows, tile_cols] : tiles)
      for (double density : {0.1, 0.5}) {
        const DType dtype = tile_rows == 32 ? DType::bf16 : DType::f16;
        Case t{plain(s[0], s[1], s[2], dtype, Layout::col_major), tile_rows, tile_cols, density};
        t.d_layout = s[2] == 300 ? Layout::row_major : Layout::col_major;
        const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, dtype, seed), dtype);
        const TileMatrix a =
            compress_tiles(w, prune_tiles_by_norm(w, tile_rows, tile_cols, density), tile_rows, tile_cols);
        ASSERT_NE(tile_schedules(DeviceTiles::upload(pack_tiles(a))).widened, nullptr) << describe(t);
        EXPECT_LE(run_with(a, t, seed += 10, TileKernel::sm90_wgmma), tolerance(dtype)) << describe(t);
      }
}

TEST(TileGpu, HopperPersistentCtasTakeSeveralUnits) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // 9 row blocks x 16 token blocks = 144 units > 132 SMs: some persistent CTAs run two units, their producer
  // loading the second while the consumers write the first (both D layouts, bias and beta); and the default
  // one-unit-per-CTA launch of the same problems.
  uint32_t seed = 9100;
  for (bool persistent : {true, false})
    for (Layout d_layout : {Layout::col_major, Layout::row_major})
      for (int side : {64, 128}) {
        Case t{
            {1100, 192, 4000, DType::f16, DType::f16, Layout::col_major, d_layout, 1.25f, 0.5f, true, Activation::relu},
            side,
            side,
            0.5,
            TileKernel::sm90_wgmma};
        t.launch.persistent = persistent;
        const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), side, side, TileKernel::sm90_wgmma, t.launch);
        EXPECT_EQ(plan.launch().split, 1);
        EXPECT_EQ(plan.launch().persistent, persistent);
        EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t) << (persistent ? " persistent" : "");
      }
}

TEST(TileGpu, HopperEpilogueTailsAndLayouts) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // The per-warpgroup chunk epilogue with vector stores (beta == 0, 16-bit D, aligned rows): R tails inside a
  // warpgroup's 64 rows and warpgroups wholly past R (R = 136: the second block's upper one), C tails inside a
  // 32-token chunk, both D layouts, bias and activations, every block_n, persistent and one CTA per unit.
  const int64_t shapes[][3] = {{136, 256, 200}, {704, 320, 1000}, {1024, 192, 72}};
  uint32_t seed = 9500;
  for (const auto& s : shapes)
    for (Layout d_layout : {Layout::col_major, Layout::row_major})
      for (int block_n : {32, 64, 128, 256}) {
        const DType dtype = block_n == 128 || block_n == 32 ? DType::bf16 : DType::f16;
        Case t{{s[0], s[1], s[2], dtype, dtype, Layout::col_major, d_layout, 0.75f, 0.0f, block_n != 64,
                block_n == 256 ? Activation::gelu : Activation::relu},
               64,
               64,
               0.4,
               TileKernel::sm90_wgmma};
        t.launch = {block_n, 1, block_n != 128};
        EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t) << " block_n " << block_n;
      }
}

TEST(TileGpu, HopperDeferredStoreOverManyUnitsPerCta) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // The deferred store (16-bit D, beta 0, no GELU, D's stride a multiple of 8 elements): persistent CTAs take
  // 3-4 units each, so the staged and stored barriers turn through both parities; R and C tails clipped by the
  // store's tensor map, both layouts; the chunked epilogue beside (beta != 0, which the plan stores chunked). Where
  // D's stride is not a multiple of 8 elements (R = 3079 for col-major D, C = 4100 for row-major D) the plan keeps
  // the chunked one.
  const int64_t shapes[][3] = {{3080, 128, 4104}, {3079, 128, 4100}};
  uint32_t seed = 9700;
  for (const auto& s : shapes)
    for (Layout d_layout : {Layout::col_major, Layout::row_major})
      for (bool deferred : {true, false}) {
        const DType dtype = d_layout == Layout::row_major ? DType::bf16 : DType::f16;
        Case t{{s[0], s[1], s[2], dtype, dtype, Layout::col_major, d_layout, 0.5f, deferred ? 0.0f : 0.5f, true,
                deferred ? Activation::relu : Activation::none},
               64,
               64,
               0.5,
               TileKernel::sm90_wgmma};
        const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), 64, 64, TileKernel::sm90_wgmma, t.launch);
        const int64_t d_stride = d_layout == Layout::col_major ? s[0] : s[2];
        ASSERT_EQ(tile_plan_defers_store(plan), deferred && d_stride % 8 == 0) << describe(t);
        ASSERT_TRUE(plan.launch().persistent && plan.launch().split == 1 && plan.launch().block_n == 256)
            << describe(t);
        EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t) << (deferred ? " deferred" : " chunked");
      }
  // Where the staged value would not be D's final value the plan keeps the chunked epilogue.
  const auto deferred_for = [](float beta, Activation activation, DType out) {
    const SpmmDesc desc{4096, 256,  4096,  DType::f16, out, Layout::col_major, Layout::col_major,
                        1.0f, beta, false, activation};
    return tile_plan_defers_store(TileSpmmPlan::create(desc, 64, 64, TileKernel::sm90_wgmma));
  };
  EXPECT_TRUE(deferred_for(0.0f, Activation::relu, DType::f16));
  EXPECT_FALSE(deferred_for(0.5f, Activation::none, DType::f16));
  EXPECT_FALSE(deferred_for(0.0f, Activation::gelu, DType::f16));
  EXPECT_FALSE(deferred_for(0.0f, Activation::none, DType::f32));
}

TEST(TileGpu, HopperUnitOrdersOverManyUnitsPerCta) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // Persistent CTAs over 3-4 units each in both orders of the work units: token block by token block (every tile
  // row stores the same number of tiles: a balanced schedule) and position by position (tile row 3 stores every
  // column, the others a few). R and C tails, both epilogues (chunked for beta != 0), both tile sides.
  const int64_t r = 3080, k = 1024, n = 4104;
  uint32_t seed = 9900;
  for (int side : {64, 128})
    for (bool skewed : {false, true}) {
      const DenseMatrix w = test::random_matrix(r, k, DType::f16, seed += 10);
      TileMask mask{ceil_div(r, int64_t{side}), ceil_div(k, int64_t{side}), {}};
      mask.keep.assign(static_cast<std::size_t>(mask.grid_rows * mask.grid_cols), 0);
      for (int64_t i = 0; i < mask.grid_rows; ++i)
        for (int64_t j = 0; j < mask.grid_cols; ++j)
          mask.keep[static_cast<std::size_t>(i * mask.grid_cols + j)] = (skewed && i == 3) || (i + j) % 4 == 0;
      const PackedTiles packed = pack_tiles(compress_tiles(w, mask, side, side));
      ASSERT_EQ(tile_schedules(DeviceTiles::upload(packed)).balanced, !skewed) << "side " << side;
      for (bool deferred : {true, false}) {
        const Problem t{r,
                        k,
                        n,
                        DType::f16,
                        DType::f16,
                        Layout::col_major,
                        Layout::col_major,
                        0.5f,
                        deferred ? 0.0f : 0.5f,
                        true,
                        Activation::relu};
        ASSERT_EQ(tile_plan_defers_store(TileSpmmPlan::create(t.desc(), side, side, TileKernel::sm90_wgmma)), deferred);
        EXPECT_LE(run_with(unpack_tiles(packed), t, seed, TileKernel::sm90_wgmma), tolerance(DType::f16))
            << describe(t) << " side " << side << (skewed ? " skewed" : " balanced") << (deferred ? " deferred" : "");
      }
    }
}

TEST(TileGpu, HopperClaimedUnitsAcrossLaunchesAndStreams) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // Persistent CTAs claim units from a counter pair that the last CTA of a launch zeroes again: launch after
  // launch on one stream, each into a poisoned D, and launches of the same plan on two streams at once (each
  // launch its own counters), must each compute every unit. Skewed (one tile row stores every column) and
  // balanced patterns, both epilogues (chunked for beta != 0).
  const int64_t r = 3080, k = 1024, n = 4104;
  uint32_t seed = 9950;
  for (bool skewed : {false, true})
    for (bool deferred : {true, false}) {
      const DenseMatrix w = test::random_matrix(r, k, DType::f16, seed += 10);
      TileMask mask{ceil_div(r, int64_t{64}), ceil_div(k, int64_t{64}), {}};
      mask.keep.assign(static_cast<std::size_t>(mask.grid_rows * mask.grid_cols), 0);
      for (int64_t i = 0; i < mask.grid_rows; ++i)
        for (int64_t j = 0; j < mask.grid_cols; ++j)
          mask.keep[static_cast<std::size_t>(i * mask.grid_cols + j)] = (skewed && i == 3) || (i + 2 * j) % 5 == 0;
      const TileMatrix a = compress_tiles(w, mask, 64, 64);
      const DeviceTiles da = DeviceTiles::upload(pack_tiles(a));
      const Problem t{r,
                      k,
                      n,
                      DType::f16,
                      DType::f16,
                      Layout::col_major,
                      Layout::col_major,
                      1.0f,
                      deferred ? 0.0f : 0.5f,
                      false,
                      Activation::none};
      const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), 64, 64, TileKernel::sm90_wgmma);
      ASSERT_TRUE(plan.launch().persistent);
      ASSERT_EQ(tile_plan_defers_store(plan), deferred);
      const std::size_t d_bytes = static_cast<std::size_t>(r * n) * 2;
      DeviceBuffer other(d_bytes);
      cudaStream_t streams[2];
      for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      const double error =
          error_against_oracle(SparseMatrix{a}, t, seed, [&](const void* b, const void* c, void* d, const float* bias) {
            for (int i = 0; i < 4; ++i) {  // one stream: each launch must find the counters zero
              ASSERT_EQ(cudaMemsetAsync(d, 0xff, d_bytes, streams[0]), cudaSuccess);
              plan.run(streams[0], da, b, c, d, bias);
            }
            for (int i = 0; i < 3; ++i) {  // two streams at once
              ASSERT_EQ(cudaMemsetAsync(d, 0xff, d_bytes, streams[0]), cudaSuccess);
              plan.run(streams[1], da, b, c, other.data(), bias);
              plan.run(streams[0], da, b, c, d, bias);
            }
            for (cudaStream_t& s : streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
          });
      EXPECT_LE(error, tolerance(DType::f16)) << (skewed ? "skewed" : "balanced") << (deferred ? " deferred" : "");
      for (cudaStream_t& s : streams) cudaStreamDestroy(s);
    }
}

TEST(TileGpu, HopperSmallTokenBlocksAcrossUnitsAndSplits) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // Token blocks of 32 and 64 (the decode-sized launches): persistent CTAs that take 3 units each (the ring
  // through both parities across unit boundaries, units of 1-7 steps), steps that only one of the two 64-row
  // tile rows has, one CTA per unit, and split-K clusters; C tails inside the token block.
  uint32_t seed = 9900;
  for (int block_n : {32, 64})
    for (int side : {64, 128})
      for (int mode = 0; mode < 3; ++mode) {  // persistent, one CTA per unit, split K over 2
        const int64_t c = block_n == 32 ? 29 : 61;
        Case t{{128 * 3 * 132 - 40, 448, c, DType::f16, DType::f16, Layout::col_major, Layout::col_major, 1.0f, 0.0f,
                mode == 1, Activation::none},
               side,
               side,
               mode == 0 ? 0.3 : 0.6,
               TileKernel::sm90_wgmma};
        t.launch = {block_n, mode == 2 ? 2 : 1, mode == 0, mode == 0};  // the deferred store where it applies
        const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), side, side, TileKernel::sm90_wgmma, t.launch);
        ASSERT_EQ(plan.launch().block_n, block_n);
        EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype))
            << describe(t) << " block_n " << block_n << " mode " << mode;
      }
}

TEST(TileGpu, HopperTimelineMarksEveryCtaAndKeepsTheResult) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // A traced run (run_tile_plan_with_timeline) computes the same product, and every CTA of the grid leaves ordered
  // marks: start, first copy posted, its data landed, first unit written, its end in both clocks (a plausible SM
  // clock between them).
  using T = TileTimeline;
  for (bool persistent : {true, false}) {
    Case t{{700, 256, 600, DType::f16, DType::f16, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false,
            Activation::none},
           64,
           64,
           0.5,
           TileKernel::sm90_wgmma};
    t.launch.persistent = persistent;
    const TileSpmmPlan probe = TileSpmmPlan::create(t.desc(), 64, 64, TileKernel::sm90_wgmma, t.launch);
    const int64_t units = ceil_div(t.r, int64_t{kTileBlockRows}) * ceil_div(t.c, int64_t{probe.launch().block_n});
    const int64_t grid = persistent ? std::min<int64_t>(units, query_cuda_devices().devices.at(0).sm_count)
                                    : units * probe.launch().split;
    std::vector<uint64_t> words(grid * T::kWords, 0);
    DeviceBuffer timeline(words.size() * sizeof(uint64_t));
    timeline.copy_from_host(words.data(), timeline.size());
    const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, t.dtype, 9300), t.dtype);
    const TileMatrix a = compress_tiles(w, prune_tiles_by_norm(w, 64, 64, t.density), 64, 64);
    const DeviceTiles da = DeviceTiles::upload(pack_tiles(a));
    const double error =
        error_against_oracle(SparseMatrix{a}, t, 9300, [&](const void* b, const void* c, void* d, const float* bias) {
          run_tile_plan_with_timeline(probe, nullptr, da, b, c, d, bias, static_cast<uint64_t*>(timeline.data()));
        });
    EXPECT_LE(error, tolerance(t.dtype)) << describe(t);
    timeline.copy_to_host(words.data(), words.size() * sizeof(uint64_t));
    for (int64_t c = 0; c < grid; ++c) {
      const uint64_t* w = words.data() + c * T::kWords;
      ASSERT_NE(w[T::kStart], 0u) << "CTA " << c;
      EXPECT_NE(w[T::kStartNs], 0u) << "CTA " << c;
      EXPECT_LE(w[T::kStart], w[T::kPosted]) << "CTA " << c;
      EXPECT_LE(w[T::kPosted], w[T::kArrived]) << "CTA " << c;
      EXPECT_LT(w[T::kArrived], w[T::kUnitDone]) << "CTA " << c;
      EXPECT_GE(w[T::kEndNs], w[T::kStartNs]) << "CTA " << c;
      EXPECT_GT(w[T::kEnd], w[T::kUnitDone]) << "CTA " << c;
    }
    const TileTimelineSummary s = summarize_tile_timeline(words, 1e-3);
    EXPECT_GT(s.clock_ghz, 0.3);  // measured over CTAs of a few microseconds: coarse, but an SM's clock
    EXPECT_LT(s.clock_ghz, 3.0);
  }
}

// A stream kernel on every shape x tile shape, both B layouts, f16 and bf16 in turn, and grids of 1, 3, 7 (a full
// weight there) and 50 CTAs and the device's own count.
void expect_stream_kernel_sweep(TileKernel kernel, std::span<const std::array<int64_t, 3>> shapes,
                                std::span<const std::pair<int, int>> tiles, uint32_t seed) {
  for (Layout b_layout : {Layout::col_major, Layout::row_major})
    for (std::size_t i = 0; i < shapes.size(); ++i)
      for (std::size_t j = 0; j < tiles.size(); ++j)
        for (int ctas : {0, 1, 3, 7, 50}) {
          const auto& s = shapes[i];
          const DType dtype = (i + j + ctas) % 2 ? DType::bf16 : DType::f16;
          Case t{plain(s[0], s[1], s[2], dtype, b_layout), tiles[j].first, tiles[j].second, ctas == 7 ? 1.0 : 0.3,
                 kernel};
          t.launch.stream_ctas = ctas;
          EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t) << " stream_ctas " << ctas;
        }
}

// One plan of a stream kernel (its workspace shared by every run) run again and again on fresh operands: its row
// counters must be back at zero after each launch.
void expect_repeated_runs(const Problem& t, const TileMatrix& a, TileKernel kernel, int ctas, uint32_t seed) {
  const DeviceTiles da = DeviceTiles::upload(pack_tiles(a));
  const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), a.tile_rows, a.tile_cols, kernel, {.stream_ctas = ctas});
  EXPECT_GT(plan.workspace_bytes(), 0u);
  for (uint32_t run = 0; run < 4; ++run)
    EXPECT_LE(error_against_oracle(SparseMatrix{a}, t, seed * 100 + run,
                                   [&](const void* b, const void* c, void* d, const float* bias) {
                                     plan.run(nullptr, da, b, c, d, bias);
                                   }),
              tolerance(t.dtype))
        << kernel_name(kernel) << " run " << run;
}
// The same on a weight of side x side tiles at density 0.4.
void expect_repeated_runs(const Problem& t, int side, TileKernel kernel, int ctas, uint32_t seed) {
  const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, t.dtype, seed), t.dtype);
  expect_repeated_runs(t, compress_tiles(w, prune_tiles_by_norm(w, side, side, 0.4), side, side), kernel, ctas, seed);
}

TEST(TileGpu, StreamKernelAgainstTheOracle) {
  SKIP_WITHOUT_GPU();
  // Every tile shape, R / K / C tails (C past one 32-token block: 33, 40, 70), both B layouts, and grids that cut
  // the stored tiles at odd places (1, 3, 7, 50 CTAs, and the device's own count): rows whole in one range, shared
  // by two or many, and ranges that span several rows. 300 x 344 x 40 copies B by 16 bytes in both layouts (K and
  // C multiples of 8) with a K tail inside the last tile column.
  const std::array<int64_t, 3> shapes[] = {
      {200, 333, 17}, {520, 1000, 33}, {64, 40, 1}, {1000, 2048, 70}, {300, 344, 40}};
  const std::pair<int, int> tiles[] = {{16, 16}, {32, 32}, {64, 64}, {128, 128}, {64, 128}, {128, 64}, {16, 128}};
  expect_stream_kernel_sweep(TileKernel::stream_mma, shapes, tiles, 20000);
}

// Every layout and epilogue of layout_and_epilogue_problems at C = 40 (past one 32-token block) on 32x64 tiles at
// density 0.5, run by `kernel`; seeds from seed + 10 on.
void expect_layouts_and_epilogues(TileKernel kernel, uint32_t seed) {
  for (const Problem& problem : layout_and_epilogue_problems(136, 200, 40)) {
    const Case t{problem, 32, 64, 0.5, kernel};
    EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
  }
}

TEST(TileGpu, StreamKernelEmptyRowsEpiloguesAndRepeatedRuns) {
  SKIP_WITHOUT_GPU();
  // The skewed pattern of SkewedRowsAndEmptyTileRows (a full tile row, an empty one, one tile in each other) with
  // beta, bias and both D layouts; an all-empty weight; every epilogue; and one plan run again and again (its
  // row counters must be back at zero after each launch).
  for (int side : {32, 64, 128}) expect_skewed_and_empty(TileKernel::stream_mma, side, {0, 2, 5}, 21);
  expect_layouts_and_epilogues(TileKernel::stream_mma, 21000);
  expect_repeated_runs(plain(700, 900, 24, DType::bf16, Layout::col_major), 64, TileKernel::stream_mma, 9, 5);
}

TEST(TileGpu, WarpStreamKernelAgainstTheOracle) {
  SKIP_WITHOUT_GPU();
  // Tiles 32 rows high by 32, 64 and 128 columns (1, 2 and 4 chunks per tile); R / K / C tails (C past one 32-token
  // block: 33, 70); B col-major with 16-byte rows (K % 8 == 0, the vector path, K tails inside the last tile
  // column) and without (K = 333), and B row-major (element loads); grids that cut the chunks at odd places (1, 3,
  // 7, 50 CTAs of 8 warps, and the device's own count): rows whole in one warp's range, shared by two or many
  // warps, ranges that span several rows, empty ranges. Tiles 64 and 128 rows high run through the weight's split
  // copy in tiles 32 rows high.
  const std::array<int64_t, 3> shapes[] = {{200, 333, 17},   {520, 1000, 33}, {64, 40, 1},
                                           {1000, 2048, 70}, {300, 344, 40},  {96, 96, 32}};
  const std::pair<int, int> tiles[] = {{32, 32}, {32, 64}, {32, 128}, {64, 64}, {128, 64}};
  expect_stream_kernel_sweep(TileKernel::warp_stream_mma, shapes, tiles, 23000);
}

TEST(TileGpu, WarpStreamKernelEmptyRowsEpiloguesAndRepeatedRuns) {
  SKIP_WITHOUT_GPU();
  // As StreamKernelEmptyRowsEpiloguesAndRepeatedRuns: a full tile row, an empty one, one tile in each other; an
  // all-empty weight; beta, bias, both D layouts, every epilogue; one plan run again and again.
  expect_skewed_and_empty(TileKernel::warp_stream_mma, 32, {0, 1, 2, 5}, 31);
  expect_layouts_and_epilogues(TileKernel::warp_stream_mma, 24000);
  expect_repeated_runs(plain(700, 1024, 32, DType::bf16, Layout::col_major), 32, TileKernel::warp_stream_mma, 3, 6);
}

TEST(TileGpu, WarpStreamStoresWholeTilesBy16Bytes) {
  SKIP_WITHOUT_GPU();
  // The plain epilogue stores a 32x32 tile of D that lies wholly inside D by 16-byte vectors where D is 16-bit and
  // its rows (row-major) or columns (col-major) start on 16 bytes, and element by element elsewhere: R = 136 (four
  // whole tile rows and an 8-row tail), C = 32, 40 (a whole token block and a partial one) and 64, both D layouts,
  // f16, bf16 and fp32 outputs, alpha != 1; R = 140 puts col-major D's columns off 16 bytes.
  uint32_t seed = 25000;
  for (int64_t r : {136, 140})
    for (int64_t n : {32, 40, 64})
      for (Layout d_layout : {Layout::col_major, Layout::row_major})
        for (DType out : {DType::f16, DType::bf16, DType::f32}) {
          const DType in = out == DType::f32 ? DType::bf16 : out;
          const Problem problem{r, 256, n, in, out, Layout::col_major, d_layout, 1.5f, 0.0f, false, Activation::none};
          const Case t{problem, 32, 32, 0.5, TileKernel::warp_stream_mma};
          EXPECT_LE(run_case(t, seed += 10), tolerance(in)) << describe(t);
        }
}

// Tiles 32 rows high by tile_cols: tile row 0 stores every tile column, row 1 none, row i > 1 stores i % 5 tiles;
// R has a tail.
TileMatrix one_long_row(int tile_cols) {
  const int64_t grid_rows = 40, grid_cols = 64, r = 32 * grid_rows - 5, k = grid_cols * tile_cols;
  const DenseMatrix w = test::random_matrix(r, k, DType::f16, 12);
  TileMask mask{grid_rows, grid_cols, std::vector<uint8_t>(static_cast<std::size_t>(grid_rows * grid_cols), 0)};
  for (int64_t j = 0; j < grid_cols; ++j) mask.keep[static_cast<std::size_t>(j)] = 1;
  for (int64_t i = 2; i < grid_rows; ++i)
    for (int64_t j = 0; j < i % 5; ++j)
      mask.keep[static_cast<std::size_t>(i * grid_cols + (7 * i + 13 * j) % grid_cols)] = 1;
  return compress_tiles(w, mask, 32, tile_cols);
}

TEST(TileGpu, WarpStreamScheduleCutsALongRowOverCtas) {
  SKIP_WITHOUT_GPU();
  // The weight's schedule (the plan's default CTAs) cuts tile row 0 over several CTAs, summed through the
  // workspace, and gives the short rows whole to CTAs; the same weight cut evenly (9 CTAs) for comparison; beta,
  // bias, both D layouts, C within and past one token block; one plan run again and again.
  for (int tile_cols : {32, 64}) {
    const TileMatrix a = one_long_row(tile_cols);
    const PackedTiles packed = pack_tiles(a);
    const DeviceTiles da = DeviceTiles::upload(packed);
    ASSERT_GT(tile_schedules(da).warp_stream_ctas, 1) << "tiles 32x" << tile_cols;
    const int chunks_per_tile = tile_cols / 32;
    const int64_t chunks = packed.nnz_tiles() * chunks_per_tile;
    // The schedule the default grid targets: two chunks per warp, eight warps per CTA (far fewer than the device
    // holds).
    const WarpStreamSchedule schedule =
        warp_stream_schedule(packed.row_ptr, chunks_per_tile, (chunks + 15) / 16, 1 << 20);
    ASSERT_GE(schedule.row_ctas[1], 1) << "row 0 is not cut, tiles 32x" << tile_cols;
    for (Layout d_layout : {Layout::col_major, Layout::row_major})
      for (int64_t n : {20, 45})
        for (int ctas : {0, 9}) {
          const Problem t{a.rows,   a.cols, n,    DType::f16, DType::f16,      Layout::col_major,
                          d_layout, 1.5f,   0.5f, true,       Activation::none};
          EXPECT_LE(run_with(a, t, 41, TileKernel::warp_stream_mma, {.stream_ctas = ctas}), tolerance(DType::f16))
              << describe(t) << " tiles 32x" << tile_cols << " stream_ctas " << ctas;
        }
    expect_repeated_runs(plain(a.rows, a.cols, 32, DType::f16, Layout::col_major), a, TileKernel::warp_stream_mma, 0,
                         42);
  }
}

TEST(TileGpu, FewTokensTakeTheStreamKernelWhereTheHopperOneDoesNotApply) {
  SKIP_WITHOUT_GPU();
  // B row-major never runs the Hopper kernel; B col-major does on an sm_90 device.
  for (int64_t c : {int64_t{1}, int64_t{16}, kStreamMaxTokens}) {
    const SpmmDesc row_major_b{512, 512, c, DType::f16, DType::f16, Layout::row_major};
    EXPECT_EQ(TileSpmmPlan::create(row_major_b, 64, 64).kernel(), TileKernel::stream_mma) << "C = " << c;
    EXPECT_EQ(TileSpmmPlan::create({512, 512, c}, 64, 64).kernel(),
              sm90_here() ? TileKernel::sm90_wgmma : TileKernel::stream_mma)
        << "C = " << c;
  }
  const SpmmDesc wide{512, 512, kStreamMaxTokens + 1, DType::f16, DType::f16, Layout::row_major};
  EXPECT_EQ(TileSpmmPlan::create(wide, 64, 64).kernel(), TileKernel::sm80_mma);
  EXPECT_EQ(TileSpmmPlan::create(wide, 64, 64).workspace_bytes(), 0u);
}

TEST(TileGpu, AutomaticPicksTheWarpStreamKernelForWeightsWithASchedule) {
  SKIP_WITHOUT_GPU();
  // On an sm_90 device, tiles 32 rows high at C <= 32: the warp-stream kernel for a weight whose schedule cuts no
  // tile row (every row the same length here) and for one whose schedule cuts row 0 over CTAs; both against the
  // oracle, D row-major (whole tiles stored by 16-byte vectors). Past 32 tokens, or elsewhere, the planned kernel.
  std::vector<uint8_t> keep(40 * 64, 0);
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t j = 0; j < 16; ++j) keep[static_cast<std::size_t>(i * 64 + (5 * i + 4 * j) % 64)] = 1;
  const TileMatrix even =
      compress_tiles(test::random_matrix(40 * 32 - 3, 64 * 32, DType::f16, 13), TileMask{40, 64, keep}, 32, 32);
  const TileMatrix cut = one_long_row(32);
  for (int64_t n : {20, 32, 33}) {
    const Problem t{even.rows,         even.cols, n,    DType::f16, DType::f16,      Layout::col_major,
                    Layout::row_major, 1.0f,      0.0f, false,      Activation::none};
    const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), 32, 32);
    const DeviceTiles a_even = DeviceTiles::upload(pack_tiles(even)), a_cut = DeviceTiles::upload(pack_tiles(cut));
    EXPECT_EQ(tile_schedules(a_even).warp_stream_rows_cut, 0);
    EXPECT_GT(tile_schedules(a_cut).warp_stream_rows_cut, 0);
    const bool warp_stream = sm90_here() && n <= 32;
    EXPECT_EQ(plan.kernel_for(a_even), warp_stream ? TileKernel::warp_stream_mma : plan.kernel()) << "C = " << n;
    EXPECT_EQ(plan.kernel_for(a_cut), warp_stream ? TileKernel::warp_stream_mma : plan.kernel()) << "C = " << n;
    EXPECT_LE(run_with(even, t, 51), tolerance(DType::f16)) << describe(t);
    const Problem u{cut.rows,          cut.cols, n,    DType::f16, DType::f16,      Layout::col_major,
                    Layout::row_major, 1.0f,     0.0f, false,      Activation::none};
    EXPECT_LE(run_with(cut, u, 52), tolerance(DType::f16)) << describe(u);
  }
}

TEST(TileGpu, TallTilesRunTheWarpStreamKernelThroughTheirSplitCopy) {
  SKIP_WITHOUT_GPU();
  // Tiles 64 and 128 rows high at C <= 32: on an sm_90 device `automatic` runs the warp-stream kernel on the
  // weight's copy in tiles 32 rows high (an R tail, C within and at one token block), and past 32 tokens the planned
  // kernel; the skewed pattern (a full tile row next to an empty one) with beta, bias and both D layouts, by the
  // schedule and by a forced grid; one plan run again and again.
  uint32_t seed = 26000;
  for (auto [tr, tc] : {std::pair{64, 64}, {128, 128}, {64, 128}, {128, 32}}) {
    const DenseMatrix w = test::random_matrix(700, 1024, DType::f16, seed);
    const TileMatrix a = compress_tiles(w, prune_tiles_by_norm(w, tr, tc, 0.4), tr, tc);
    const PackedTiles packed = pack_tiles(a);
    const DeviceTiles da = DeviceTiles::upload(packed);
    if (sm90_here()) {
      ASSERT_NE(tile_schedules(da).split_rows, nullptr) << tr << "x" << tc;
      EXPECT_EQ(tile_schedules(da).split_rows->tile_rows(), 32);
      int64_t parts = 0;  // every stored tile cut in tr / 32, less the parts past R of the last tile row's
      for (int64_t i = 0; i < ceil_div(a.rows, int64_t{32}); ++i)
        parts += packed.row_ptr[i / (tr / 32) + 1] - packed.row_ptr[i / (tr / 32)];
      EXPECT_EQ(tile_schedules(da).split_rows->nnz_tiles(), parts) << tr << "x" << tc;
    }
    for (int64_t n : {20, 32, 33}) {
      const Problem t{a.rows, a.cols, n,     DType::f16,      DType::f16, Layout::col_major, Layout::row_major,
                      1.0f,   0.0f,   false, Activation::none};
      const TileSpmmPlan plan = TileSpmmPlan::create(t.desc(), tr, tc);
      EXPECT_EQ(plan.kernel_for(da), sm90_here() && n <= 32 ? TileKernel::warp_stream_mma : plan.kernel())
          << tr << "x" << tc << " C = " << n;
      EXPECT_LE(run_with(a, t, seed += 10), tolerance(DType::f16)) << describe(t) << " tiles " << tr << "x" << tc;
    }
  }
  if (!sm90_here()) return;  // the forced kernel needs the split copy, which needs a device that fits the kernel
  for (int side : {64, 128}) expect_skewed_and_empty(TileKernel::warp_stream_mma, side, {0, 3}, 61);
  expect_repeated_runs(plain(700, 1024, 32, DType::bf16, Layout::col_major), 64, TileKernel::warp_stream_mma, 0, 63);
}

TEST(TileGpu, OverlappedLaunchesWaitForTheKernelBeforeThem) {
  SKIP_WITHOUT_GPU();
  // Chained layers (expect_chained_layers) in 32x32 tiles at C = 24: the warp-stream kernel on an sm_90 device,
  // launched overlapping the kernel before it (TileLaunch::overlap_launch), and without.
  constexpr int64_t kR1 = 1000, kK = 1536, kR2 = 700, kN = 24;
  const DenseMatrix w1 = test::random_matrix(kR1, kK, DType::f16, 71),
                    w2 = test::random_matrix(kR2, kR1, DType::f16, 72);
  const TileMatrix a1 = compress_tiles(w1, prune_tiles_by_norm(w1, 32, 32, 0.3), 32, 32);
  const TileMatrix a2 = compress_tiles(w2, prune_tiles_by_norm(w2, 32, 32, 0.3), 32, 32);
  const DeviceTiles d1 = DeviceTiles::upload(pack_tiles(a1)), d2 = DeviceTiles::upload(pack_tiles(a2));
  for (const bool overlap : {true, false}) {
    const TileLaunch launch{.overlap_launch = overlap};
    const TileSpmmPlan p1 = TileSpmmPlan::create({kR1, kK, kN}, 32, 32, TileKernel::automatic, launch),
                       p2 = TileSpmmPlan::create({kR2, kR1, kN}, 32, 32, TileKernel::automatic, launch);
    EXPECT_EQ(p1.launch().overlap_launch, sm90_here() && overlap);
    if (sm90_here()) EXPECT_EQ(p1.kernel_for(d1), TileKernel::warp_stream_mma);
    expect_chained_layers(
        SparseMatrix{a1}, SparseMatrix{a2}, kK, kR1, kR2, kN,
        [&](cudaStream_t s, const void* x, void* y) { p1.run(s, d1, x, nullptr, y); },
        [&](cudaStream_t s, const void* y, void* z) { p2.run(s, d2, y, nullptr, z); },
        overlap ? "overlap on" : "overlap off");
  }
}

TEST(TileGpu, BadInputsAreRejected) {
  SKIP_WITHOUT_GPU();
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 64}, 48, 64), ErrorCode::unsupported, "16, 32, 64 or 128");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 64, DType::f32}, 64, 64), ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 64}, 64, 64, TileKernel::automatic, {96}),
                     ErrorCode::invalid_argument, "block_n must be");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 64}, 64, 64, TileKernel::automatic, {0, 9}),
                     ErrorCode::invalid_argument, "split must be");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 16}, 64, 64, TileKernel::stream_mma, {.stream_ctas = -1}),
                     ErrorCode::invalid_argument, "stream_ctas must be");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 16}, 16, 64, TileKernel::warp_stream_mma), ErrorCode::unsupported,
                     "32, 64 or 128 rows high");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 16}, 32, 16, TileKernel::warp_stream_mma), ErrorCode::unsupported,
                     "32, 64 or 128 columns");
  const SpmmDesc row_major_b{64, 64, 64, DType::f16, DType::f16, Layout::row_major};
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create(row_major_b, 32, 32, TileKernel::sm90_wgmma), ErrorCode::unsupported,
                     "B col-major");
  const DenseMatrix w = test::random_matrix(64, 64, DType::f16, 5);
  const DeviceTiles a = DeviceTiles::upload(pack_tiles(compress_tiles(w, prune_tiles_by_norm(w, 32, 32, 0.5), 32, 32)));
  DeviceBytes b(64 * 64 * 2), d(64 * 64 * 2);
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({64, 64, 64}, 64, 64).run(nullptr, a, b.ptr, nullptr, d.ptr),
                     ErrorCode::invalid_argument, "plan was made for");
  const TileSpmmPlan plan = TileSpmmPlan::create({64, 64, 64}, 32, 32);
  EXPECT_NMKIT_ERROR(plan.run(nullptr, a, nullptr, nullptr, d.ptr), ErrorCode::invalid_argument, "must not be null");
}

}  // namespace
}  // namespace nmkit::gpu
