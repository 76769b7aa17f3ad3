// The nm24 GPU kernels against the CPU oracle: fresh random data, tails in R, K and C, both B and D
// layouts, every epilogue, f16 and bf16, outputs poisoned before each run. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <utility>
#include <string>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_heuristics.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "gpu/gpu_test_util.hpp"

namespace nmkit::gpu {
namespace {

struct Case : Problem {
  Nm24Kernel kernel;
  int block_n = 0;  // 0: the heuristic's choice
};

std::string describe(const Case& t) {
  return describe(static_cast<const Problem&>(t)) + " kernel " + kernel_name(t.kernel);
}

// Runs one case on the GPU (the case's kernel and n-tile, the rest of `options`) and returns the relative error
// against the CPU oracle.
double run_case(const Case& t, uint32_t seed, Nm24Options options = {}) {
  options.kernel = t.kernel, options.block_n = t.block_n;
  const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, t.dtype, seed), t.dtype);
  const NmMatrix a = compress_nm(w, prune_nm_magnitude(w, 2, 4), 2, 4);
  const DeviceNm24 da = DeviceNm24::upload(pack_nm24(a));
  const Nm24SpmmPlan plan = Nm24SpmmPlan::create(t.desc(), options);
  return error_against_oracle(SparseMatrix{a}, t, seed, [&](const void* b, const void* c, void* d, const float* bias) {
    plan.run(nullptr, da, b, c, d, bias);
  });
}

std::vector<Nm24Kernel> kernels_here() {
  std::vector<Nm24Kernel> k{Nm24Kernel::sm80_mma_sp, Nm24Kernel::sm80_mma_sp_skinny};
  try {
    Nm24SpmmPlan::create({128, 64, 128}, {.kernel = Nm24Kernel::sm90_wgmma_sp});
    k.push_back(Nm24Kernel::sm90_wgmma_sp);
  } catch (const Error&) {
  }
  return k;
}

bool sm90_here() {
  const auto kernels = kernels_here();
  return std::find(kernels.begin(), kernels.end(), Nm24Kernel::sm90_wgmma_sp) != kernels.end();
}

TEST(Nm24Gpu, ShapesWithTailsAgainstTheCpuOracle) {
  SKIP_WITHOUT_GPU();
  const int64_t shapes[][3] = {
      {128, 64, 128}, {256, 256, 256}, {200, 136, 72},    {64, 40, 17},    {333, 1000, 513},
      {1, 8, 1},      {130, 520, 300}, {512, 2048, 1024}, {768, 128, 4000}};  // the last one takes the 192-wide n-tile
                                                                              // on an H200
  uint32_t seed = 1;
  for (Nm24Kernel kernel : kernels_here())
    for (DType dtype : {DType::f16, DType::bf16})
      for (const auto& s : shapes) {
        const Layout b_layout = Layout::col_major;
        if (kernel == Nm24Kernel::sm90_wgmma_sp && s[1] % 8 != 0) continue;  // the plan refuses; tested below
        const Case t{{s[0], s[1], s[2], dtype, dtype, b_layout, Layout::col_major, 1.0f, 0.0f, false, Activation::none},
                     kernel};
        EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t);
      }
}

// More column tiles than a grid's y dimension holds (65535 of 128 columns): every kernel covers the columns past it.
TEST(Nm24Gpu, MoreColumnTilesThanAGridDimensionHolds) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kColumns = int64_t{65535} * 128 + 136;
  uint32_t seed = 4000;
  for (Nm24Kernel kernel : kernels_here()) {
    const Case t{{8, 8, kColumns, DType::f16, DType::f16, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false,
                  Activation::none},
                 kernel};
    EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
  }
}

// Every tile of the skinny kernel on the shapes decode hits and odd ones: T = 1, K and R not multiples of a tile,
// C past one column tile, f32 and row-major D, and each way it reads B: chunks (K % 8 == 0), pairs (K = 202) and
// elements (K = 33, odd: its pairs split at the tail).
TEST(Nm24Gpu, EverySkinnyTile) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 5000;
  for (int block_m : {16, 32})
    for (int block_n : {8, 16, 32, 64})
      for (auto [r, k, c] : {std::tuple<int64_t, int64_t, int64_t>{1000, 1000, 77},
                             {768, 768, 1},
                             {300, 202, 16},
                             {17, 33, 9},
                             {129, 520, 64}}) {
        const DType dtype = block_n == 16 ? DType::bf16 : DType::f16;
        const DType out = block_m == 32 && block_n == 8 ? DType::f32 : dtype;
        const Layout d_layout = block_n == 32 ? Layout::row_major : Layout::col_major;
        Case t{{r, k, c, dtype, out, Layout::col_major, d_layout, 1.0f, 0.0f, false, Activation::none},
               Nm24Kernel::sm80_mma_sp_skinny};
        t.block_n = block_n;
        EXPECT_LE(run_case(t, seed += 10, {.block_m = block_m}), tolerance(t.dtype))
            << describe(t) << " block_m " << block_m << " block_n " << block_n;
      }
}

// The skinny kernel's split-K (clusters, sm_90): k-ranges shorter than a batch, ranks with no k-block at all
// (K = 33 over 8 x 8 warps), each tile and both D layouts, the epilogue applied once.
TEST(Nm24Gpu, SkinnySplitKOverClusters) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 5500;
  for (int split : {2, 3, 8})
    for (auto [r, k, c, block_m, block_n] : {std::tuple<int64_t, int64_t, int64_t, int, int>{1000, 1000, 77, 32, 64},
                                             {768, 3072, 1, 16, 8},
                                             {300, 4100, 16, 32, 16},
                                             {17, 33, 9, 16, 32},
                                             {129, 8200, 5, 32, 8}}) {
      const DType dtype = split == 3 ? DType::bf16 : DType::f16;
      Case t{{r, k, c, dtype, block_n == 8 ? DType::f32 : dtype, Layout::col_major,
              block_n == 16 ? Layout::row_major : Layout::col_major, 1.5f, split == 2 ? 0.5f : 0.0f, split != 3,
              split == 8 ? Activation::gelu : Activation::relu},
             Nm24Kernel::sm80_mma_sp_skinny};
      t.block_n = block_n;
      EXPECT_LE(run_case(t, seed += 10, {.block_m = block_m, .split = split}), tolerance(t.dtype))
          << describe(t) << " block_m " << block_m << " block_n " << block_n << " split " << split;
    }
}

TEST(Nm24Gpu, EveryHopperTileWidth) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 500;
  for (int block_n : {256, 192, 128, 64, 32, 16})
    for (auto [r, k, c] : {std::tuple<int64_t, int64_t, int64_t>{300, 256, 1}, {256, 512, 37}, {129, 192, 300}}) {
      Case t{
          {r, k, c, DType::f16, DType::f16, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false, Activation::none},
          Nm24Kernel::sm90_wgmma_sp};
      t.block_n = block_n;
      EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t) << " block_n " << block_n;
    }
}

// n-tiles up to 64 stage two k-tiles at a time: a CTA's k-tiles in whole stages and a last stage of one, alone (K of
// one k-tile), after an odd number of stages or an even one, with K tails, and split-K ranges of odd lengths.
// Split-K stages two k-tiles a stage: k-ranges of odd length leave a last stage of one k-tile.
TEST(Nm24Gpu, SplitKStagesTwoKTilesWithAnyRest) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 900;
  for (int block_n : {64, 32, 16})
    for (auto [r, k, c, split] : {std::tuple<int64_t, int64_t, int64_t, int>{128, 136, 16, 2},
                                  {256, 320, 40, 2},
                                  {200, 448, 64, 3},
                                  {384, 448, 7, 2},
                                  {256, 448, 16, 3},
                                  {128, 960, 33, 2},
                                  {256, 1000, 24, 4},
                                  {128, 1000, 16, 8},
                                  {128, 64, 16, 1}}) {
      Case t{{r, k, c, DType::bf16, DType::bf16, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false,
              Activation::none},
             Nm24Kernel::sm90_wgmma_sp};
      t.block_n = block_n;
      EXPECT_LE(run_case(t, seed += 10, {.split = split}), tolerance(t.dtype))
          << describe(t) << " block_n " << block_n << " split " << split;
    }
}

TEST(Nm24Gpu, HopperKernelTakesRowMajorB) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // B K x C row-major, staged by TMA in 64-column MN-major boxes: tails in R, K and C (C % 8 == 0), every width.
  uint32_t seed = 700;
  for (int block_n : {256, 192, 128, 64})
    for (auto [r, k, c] :
         {std::tuple<int64_t, int64_t, int64_t>{300, 256, 72}, {256, 520, 200}, {129, 192, 264}, {64, 40, 8}}) {
      const DType dtype = block_n % 128 ? DType::bf16 : DType::f16;
      Case t{{r, k, c, dtype, dtype, Layout::row_major, Layout::col_major, 1.0f, 0.0f, false, Activation::none},
             Nm24Kernel::sm90_wgmma_sp};
      t.block_n = block_n;
      EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t) << " block_n " << block_n;
    }
}

TEST(Nm24Gpu, AutomaticTakesTheHopperKernelForEitherBLayout) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  for (Layout b_layout : {Layout::col_major, Layout::row_major}) {
    SpmmDesc desc{256, 512, 256};
    desc.b_layout = b_layout;
    EXPECT_EQ(Nm24SpmmPlan::create(desc).config().kernel, Nm24Kernel::sm90_wgmma_sp) << layout_name(b_layout);
  }
  SpmmDesc odd{256, 512, 250};  // B row-major needs C % 8 == 0 for its TMA boxes: the portable kernel then
  odd.b_layout = Layout::row_major;
  EXPECT_EQ(Nm24SpmmPlan::create(odd).config().kernel, Nm24Kernel::sm80_mma_sp);
}

// The raster group (Nm24Options::raster_rows) reorders the tiles only: every group size, including one that does
// not divide the row tiles, gives the oracle's product; bad values are named.
TEST(Nm24Gpu, RasterGroupsAreCorrectAndChecked) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 1300;
  for (int rows : {1, 3, 8, 64})
    for (DType dtype : {DType::f16, DType::bf16}) {
      const Case t{
          {2200, 200, 2104, dtype, dtype, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false, Activation::none},
          Nm24Kernel::sm90_wgmma_sp};
      const Nm24Options options{.schedule = Sm90Schedule::persistent, .raster_rows = rows};
      EXPECT_EQ(Nm24SpmmPlan::create(t.desc(), options).config().raster_rows, rows);
      EXPECT_LE(run_case(t, seed += 10, options), tolerance(dtype)) << describe(t) << " raster rows " << rows;
    }
  const SpmmDesc desc{2200, 200, 2104};
  EXPECT_EQ(Nm24SpmmPlan::create(desc, {.kernel = Nm24Kernel::sm90_wgmma_sp}).config().raster_rows, 0);
  for (int bad : {-4, 2000})
    EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.raster_rows = bad}), ErrorCode::invalid_argument, "raster_rows");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.kernel = Nm24Kernel::sm80_mma_sp, .raster_rows = 4}),
                     ErrorCode::unsupported, "sm90 kernel");
}

// Split-K: clusters of 2..8 CTAs each sum a share of K into one tile through distributed shared memory, then one
// epilogue. Odd shapes (R, K not multiples of the tile; K's k-tiles not a multiple of the split), 1 and 77 tokens,
// every epilogue the staged path takes, both D layouts.
TEST(Nm24Gpu, SplitKAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 7000;
  for (int split : {2, 3, 5, 8})
    for (int block_n : {16, 64})
      for (int64_t tokens : {int64_t{1}, int64_t{77}})
        for (Layout d_layout : {Layout::col_major, Layout::row_major}) {
          const bool epilogue = split % 2 == 1;  // bias, GELU, beta * C and f32 D on half of the cases
          const DType dtype = split == 8 ? DType::bf16 : DType::f16;
          Case t{{1000, 1000, tokens, dtype, epilogue ? DType::f32 : dtype, Layout::col_major, d_layout, 0.5f,
                  epilogue ? 0.25f : 0.0f, epilogue, epilogue ? Activation::gelu : Activation::none},
                 Nm24Kernel::sm90_wgmma_sp};
          t.block_n = block_n;
          const Nm24Options options{.split = split};
          EXPECT_EQ(
              Nm24SpmmPlan::create(t.desc(), {.kernel = t.kernel, .block_n = block_n, .split = split}).config().split,
              split);
          EXPECT_LE(run_case(t, seed += 10, options), tolerance(dtype))
              << describe(t) << " block_n " << block_n << " split " << split;
        }
  // By shape: 4096 x 4096 at 16 tokens is 32 tiles, under a wave; 8192 x 4096 x 4096 is not.
  const int sms = [] {
    int device = 0, count = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    return count;
  }();
  EXPECT_EQ(Nm24SpmmPlan::create({4096, 4096, 16}).config().split, nm24::sm90_split(32, 64, sms));
  EXPECT_EQ(Nm24SpmmPlan::create({8192, 4096, 4096}).config().split, 1);
  // Split-K runs the staged schedule and B col-major only.
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({4096, 4096, 16}, {.schedule = Sm90Schedule::persistent, .split = 2}),
                     ErrorCode::unsupported, "staged");
  SpmmDesc row_major_b{4096, 4096, 16};
  row_major_b.b_layout = Layout::row_major;
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(row_major_b, {.split = 2}), ErrorCode::unsupported, "split-K");
}

TEST(Nm24Gpu, AutotunedPlansAreCorrectAndRepeatable) {
  SKIP_WITHOUT_GPU();
  const SpmmDesc desc{640, 512, 300};
  const Nm24SpmmPlan first = Nm24SpmmPlan::autotune(desc);
  const Nm24SpmmPlan again = Nm24SpmmPlan::autotune(desc);  // the same description gives the same tile
  EXPECT_EQ(first.config().block_n, again.config().block_n);
  Case t{{640, 512, 300, DType::f16, DType::f16, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false,
          Activation::none},
         first.config().kernel};
  if (first.config().kernel == Nm24Kernel::sm90_wgmma_sp) t.block_n = first.config().block_n;
  EXPECT_LE(run_case(t, 4242), tolerance(DType::f16)) << describe(t);
}

TEST(Nm24Gpu, LayoutsAndEpilogues) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1000;
  for (Nm24Kernel kernel : kernels_here())
    for (const Problem& problem : layout_and_epilogue_problems(136, 200, 96)) {
      const Case t{problem, kernel};  // sm90 with B row-major: the MN-major TMA path
      EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
    }
}

TEST(Nm24Gpu, EverySm90ScheduleAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // Staged, register and persistent epilogues. The persistent grid is one CTA per SM, so the first two shapes give
  // CTAs two or more tiles (144 and 323 tiles of 128 x block_n), with R and C tails and 3 or 1 k-tiles per tile: the
  // ring of stages runs on across tiles out of step with its length. 300 rows: col-major D's lines are not a
  // multiple of 8 elements, so that D takes the staged epilogue whatever the schedule; so does the 32-wide n-tile.
  struct Shape {
    int64_t r, k, c;
    int block_n;
  };
  uint32_t seed = 1300;
  for (Sm90Schedule schedule : {Sm90Schedule::staged, Sm90Schedule::registers, Sm90Schedule::persistent}) {
    for (const Shape& s : {Shape{1000, 136, 1096, 64}, Shape{2104, 40, 600, 32}, Shape{300, 192, 520, 256}})
      for (Layout b_layout : {Layout::col_major, Layout::row_major})
        for (Layout d_layout : {Layout::col_major, Layout::row_major})
          for (Activation act : {Activation::none, Activation::relu, Activation::gelu}) {
            if (b_layout == Layout::row_major && s.block_n % 64 != 0) continue;  // whole MN-major boxes
            const DType dtype = act == Activation::relu ? DType::bf16 : DType::f16;
            Case t{{s.r, s.k, s.c, dtype, dtype, b_layout, d_layout, 0.75f, 0.0f, act != Activation::none, act},
                   Nm24Kernel::sm90_wgmma_sp};
            t.block_n = s.block_n;
            const bool applies =
                (d_layout == Layout::col_major ? s.r : s.c) % 8 == 0 && act != Activation::gelu && s.block_n % 64 == 0;
            const Nm24Options options{.kernel = t.kernel, .block_n = t.block_n, .schedule = schedule};
            if (!applies && schedule != Sm90Schedule::staged) {  // a pinned schedule that cannot run is refused
              EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(t.desc(), options), ErrorCode::unsupported, "schedule needs");
              continue;
            }
            const KernelConfig config = Nm24SpmmPlan::create(t.desc(), options).config();
            EXPECT_EQ(config.register_epilogue, schedule != Sm90Schedule::staged) << schedule_name(schedule);
            EXPECT_EQ(config.persistent_ctas > 0, schedule == Sm90Schedule::persistent);
            EXPECT_LE(run_case(t, seed += 10, options), tolerance(dtype))
                << describe(t) << " schedule " << schedule_name(schedule);
          }
  }
}

TEST(Nm24Gpu, TheRegisterEpilogueIsTakenOnlyWhereItApplies) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // By default: 16-bit D that is final in registers (beta == 0, no GELU) with lines of a multiple of 8 elements;
  // persistent CTAs where there are more tiles than SMs, whatever K.
  SpmmDesc desc{4096, 512, 4096};
  for (const SpmmDesc& many_tiles : {desc, SpmmDesc{4096, 8192, 4096}}) {
    const KernelConfig config =
        Nm24SpmmPlan::create(many_tiles, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = 256}).config();
    EXPECT_TRUE(config.register_epilogue);
    EXPECT_GT(config.persistent_ctas, 0) << many_tiles.cols;
  }
  // Fewer tiles than SMs: one CTA per tile. n-tiles of 16 and 32 (small C) keep the staged epilogue.
  const KernelConfig one_per_tile =
      Nm24SpmmPlan::create(SpmmDesc{256, 512, 512}, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = 256}).config();
  EXPECT_TRUE(one_per_tile.register_epilogue);
  EXPECT_EQ(one_per_tile.persistent_ctas, 0);
  for (int narrow : {16, 32})
    EXPECT_FALSE(Nm24SpmmPlan::create(desc, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = narrow})
                     .config()
                     .register_epilogue);
  SpmmDesc with_c = desc;
  with_c.beta = 1.0f;
  SpmmDesc f32 = desc;
  f32.out_dtype = DType::f32;
  SpmmDesc odd_lines = desc;
  odd_lines.rows = 1020;  // D col-major: its lines are R long
  SpmmDesc gelu = desc;
  gelu.activation = Activation::gelu;
  for (const SpmmDesc& d : {with_c, f32, odd_lines, gelu}) {
    EXPECT_FALSE(Nm24SpmmPlan::create(d).config().register_epilogue)
        << d.rows << " " << d.beta << " " << dtype_name(d.out_dtype);
    EXPECT_EQ(Nm24SpmmPlan::create(d).config().persistent_ctas, 0);
  }
  // A D that is not 16-byte aligned takes the staged epilogue at run time, and is still right.
  const Case t{{640, 256, 400, DType::f16, DType::f16, Layout::col_major, Layout::col_major, 1.0f, 0.0f, false,
                Activation::none},
               Nm24Kernel::sm90_wgmma_sp};
  const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, t.dtype, 31), t.dtype);
  const NmMatrix a = compress_nm(w, prune_nm_magnitude(w, 2, 4), 2, 4);
  const DeviceNm24 da = DeviceNm24::upload(pack_nm24(a));
  const Nm24SpmmPlan plan = Nm24SpmmPlan::create(t.desc(), {.kernel = t.kernel, .block_n = 128});
  ASSERT_TRUE(plan.config().register_epilogue);
  const std::size_t d_bytes = t.r * t.c * 2;
  DeviceBytes scratch(d_bytes + 16);
  const double err =
      error_against_oracle(SparseMatrix{a}, t, 32, [&](const void* b, const void* c, void* d, const float* bias) {
        void* shifted =
            static_cast<char*>(scratch.ptr) + 2;  // D one element past an allocation's start: 2-byte aligned
        check(cudaMemset(shifted, 0xff, d_bytes), "poison the shifted D");
        plan.run(nullptr, da, b, c, shifted, bias);
        check(cudaMemcpy(d, shifted, d_bytes, cudaMemcpyDeviceToDevice), "copy the shifted D");
      });
  EXPECT_LE(err, tolerance(t.dtype));
}

TEST(Nm24Gpu, StridedBAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  // B with a leading dimension past its dense one (NaN in the gap): both layouts, every kernel here, a split-K
  // decode product (C = 5); ldb a multiple of 8 over an odd K (B col-major) or C, and an odd ldb, which takes the
  // portable kernel.
  uint32_t seed = 9100;
  for (Nm24Kernel kernel : kernels_here())
    for (Layout bl : {Layout::col_major, Layout::row_major})
      for (int64_t c : {int64_t{5}, int64_t{300}})
        for (int64_t extra : {int64_t{3}, int64_t{20}}) {
          const int64_t k = bl == Layout::col_major && extra == 3 ? 1001 : 1000;
          Case t{{520, k, c, DType::f16, DType::f16, bl, Layout::col_major, 1.0f, 0.0f, true, Activation::gelu},
                 kernel};
          t.ldb = (bl == Layout::col_major ? k : c) + extra;
          if (kernel == Nm24Kernel::sm90_wgmma_sp && t.ldb % 8 != 0) t.ldb += 8 - t.ldb % 8;
          EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
          // Decode-sized C on Hopper takes the skinny kernel, which reads any leading dimension.
          const Nm24Kernel portable = sm90_here() && nm24::skinny_takes(t.r, t.k, t.c) ? Nm24Kernel::sm80_mma_sp_skinny
                                                                                       : Nm24Kernel::sm80_mma_sp;
          if (t.ldb % 8 != 0) EXPECT_EQ(Nm24SpmmPlan::create(t.desc()).config().kernel, portable) << describe(t);
        }
  // for_tokens keeps the plan's choices for a new C and ldb, and checks ldb against C.
  const Nm24SpmmPlan plan = Nm24SpmmPlan::create({4096, 1024, 64});
  EXPECT_EQ(plan.for_tokens(60, 1032).desc().ldb, 1032);
  EXPECT_NMKIT_ERROR(plan.for_tokens(60, 1000), ErrorCode::invalid_argument, "ldb");
}

TEST(Nm24Gpu, UnalignedLeadingDimensionsTakeThePortableKernel) {
  SKIP_WITHOUT_GPU();
  // K = 36 and C = 73: neither B layout gives the 16-byte rows TMA needs, so the plan must pick the portable kernel
  // (C past the skinny kernel's).
  for (Layout bl : {Layout::col_major, Layout::row_major}) {
    const Case t{{70, 36, 73, DType::f16, DType::f16, bl, Layout::row_major, 1.0f, 0.0f, false, Activation::none},
                 Nm24Kernel::automatic};
    EXPECT_EQ(Nm24SpmmPlan::create(t.desc()).config().kernel, Nm24Kernel::sm80_mma_sp) << describe(t);
    EXPECT_LE(run_case(t, 77), tolerance(DType::f16)) << describe(t);
  }
}

TEST(Nm24Gpu, OverlappedLaunchesWaitForTheKernelBeforeThem) {
  SKIP_WITHOUT_GPU();
  // Chained 2:4 layers (expect_chained_layers): decode-sized C (the staged epilogue, n16) and C = 200 (the register
  // epilogue; 1000 / 700 rows make 8 / 6 tiles), launched overlapping the kernel before them on an sm_90 device
  // (KernelConfig::overlap_launch), and with Nm24Options::overlap_launch off.
  constexpr int64_t kR1 = 1000, kK = 1536, kR2 = 700;
  const DenseMatrix w1 = test::random_matrix(kR1, kK, DType::f16, 81),
                    w2 = test::random_matrix(kR2, kR1, DType::f16, 82);
  const NmMatrix a1 = compress_nm(w1, prune_nm_magnitude(w1, 2, 4), 2, 4),
                 a2 = compress_nm(w2, prune_nm_magnitude(w2, 2, 4), 2, 4);
  const DeviceNm24 d1 = DeviceNm24::upload(pack_nm24(a1)), d2 = DeviceNm24::upload(pack_nm24(a2));
  EXPECT_EQ(Nm24SpmmPlan::create({kR1, kK, 16}).config().overlap_launch, sm90_here()) << "on by default on sm_90";
  // The skinny kernel (pinned at C = 16) overlaps too.
  for (auto [n, kernel] : {std::pair{int64_t{16}, Nm24Kernel::automatic},
                           {int64_t{16}, Nm24Kernel::sm80_mma_sp_skinny},
                           {int64_t{200}, Nm24Kernel::automatic}})
    for (bool overlap : {true, false}) {
      const Nm24Options options{.kernel = kernel, .overlap_launch = overlap};
      const Nm24SpmmPlan p1 = Nm24SpmmPlan::create({kR1, kK, n}, options),
                         p2 = Nm24SpmmPlan::create({kR2, kR1, n}, options);
      EXPECT_EQ(p1.config().overlap_launch, sm90_here() && overlap);
      expect_chained_layers(
          SparseMatrix{a1}, SparseMatrix{a2}, kK, kR1, kR2, n,
          [&](cudaStream_t s, const void* x, void* y) { p1.run(s, d1, x, nullptr, y); },
          [&](cudaStream_t s, const void* y, void* z) { p2.run(s, d2, y, nullptr, z); },
          std::string(kernel_name(p1.config().kernel)) + ", C = " + std::to_string(n) +
              (overlap ? " overlapped" : " plain"));
    }
}

TEST(Nm24Gpu, BadInputsAreRejected) {
  SKIP_WITHOUT_GPU();
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({0, 64, 64}), ErrorCode::invalid_argument, "R >= 1");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({64, 64, 64, DType::f32}), ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({64, 64, 64, DType::f16, DType::bf16}), ErrorCode::unsupported,
                     "output dtype");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({64, 64, 64}, {.kernel = Nm24Kernel::sm80_mma_sp, .block_n = 128}),
                     ErrorCode::unsupported, "block_n");
  SpmmDesc row_major_b{64, 64, 64};
  row_major_b.b_layout = Layout::row_major;
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(row_major_b, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = 32}),
                     ErrorCode::unsupported, "64, 128, 192 or 256");
  row_major_b.n = 100;  // TMA needs 16-byte row strides: C (B's leading dimension) % 8 == 0; past the skinny kernel's
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(row_major_b, {.kernel = Nm24Kernel::sm90_wgmma_sp}), ErrorCode::unsupported,
                     "a multiple of 8");
  EXPECT_EQ(Nm24SpmmPlan::create(row_major_b).config().kernel, Nm24Kernel::sm80_mma_sp);

  const DenseMatrix w = test::random_matrix(64, 64, DType::f16, 5);
  const DeviceNm24 a = DeviceNm24::upload(pack_nm24(compress_nm(w, prune_nm_magnitude(w, 2, 4), 2, 4)));
  DeviceBytes b(64 * 64 * 2), d(64 * 64 * 2);
  const Nm24SpmmPlan other = Nm24SpmmPlan::create({128, 64, 64});
  EXPECT_NMKIT_ERROR(other.run(nullptr, a, b.ptr, nullptr, d.ptr), ErrorCode::invalid_argument, "plan was made for");
  const Nm24SpmmPlan plan = Nm24SpmmPlan::create({64, 64, 64});
  EXPECT_NMKIT_ERROR(plan.run(nullptr, a, nullptr, nullptr, d.ptr), ErrorCode::invalid_argument, "must not be null");
  SpmmDesc with_beta{64, 64, 64};
  with_beta.beta = 1.0f;
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(with_beta).run(nullptr, a, b.ptr, nullptr, d.ptr),
                     ErrorCode::invalid_argument, "needs C");
  EXPECT_NMKIT_ERROR(plan.run(nullptr, a, b.ptr, nullptr, static_cast<char*>(d.ptr) + 1), ErrorCode::invalid_argument,
                     "aligned");
}

}  // namespace
}  // namespace nmkit::gpu
