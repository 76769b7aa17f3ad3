// The V:N:M SpMM against the CPU oracle: V in {32, 64, 128, 256}, N in {1, 2}, M from 4 to 100, tails in R, K
// and C, both B and D layouts, every epilogue, f16 and bf16, both kernels, outputs poisoned. Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "gpu/gpu_test_util.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace nmkit::gpu {
namespace {

struct Pattern {
  int v, n, m;
};

struct Case : Problem {
  Pattern pattern;
  Nm24Kernel kernel = Nm24Kernel::automatic;
  int block_n = 0;
  VnmForm form = VnmForm::automatic;
};

std::string describe(const Case& t) {
  return describe(static_cast<const Problem&>(t)) + " pattern " + std::to_string(t.pattern.v) + ":" +
         std::to_string(t.pattern.n) + ":" + std::to_string(t.pattern.m) + " " + vnm_form_name(t.form) + " kernel " +
         kernel_name(t.kernel) + (t.block_n ? " block_n " + std::to_string(t.block_n) : "");
}

// Runs one case (its kernel, n-tile and form; the rest of `options`) against the CPU oracle.
double run_case(const Case& t, uint32_t seed, Nm24Options options = {}) {
  options.kernel = t.kernel, options.block_n = t.block_n;
  const DenseMatrix w = DenseMatrix::from_float(t.r, t.k, rounded_random(t.r * t.k, t.dtype, seed), t.dtype);
  const auto [v, n, m] = t.pattern;
  const VnmMatrix a = compress_vnm(w, prune_vnm_magnitude(w, v, n, m), v, n, m);
  const DeviceVnm da = DeviceVnm::upload(pack_vnm(a, t.form, t.b_layout));
  const VnmSpmmPlan plan = VnmSpmmPlan::create(t.desc(), v, m, options, t.form);
  return error_against_oracle(SparseMatrix{a}, t, seed, [&](const void* b, const void* c, void* d, const float* bias) {
    plan.run(nullptr, da, b, c, d, bias);
  });
}

// The plan on `da` with B one element off alignment: a copy of B one half further on (the oracle reads the
// original values), against the CPU oracle.
double error_with_unaligned_b(const VnmMatrix& a, const DeviceVnm& da, const VnmSpmmPlan& plan, const Problem& p,
                              uint32_t seed) {
  return error_against_oracle(SparseMatrix{a}, p, seed, [&](const void* b, const void* c, void* d, const float* bias) {
    DeviceBytes shifted(p.k * p.c * 2 + 2);
    check(cudaMemcpy(static_cast<char*>(shifted.ptr) + 2, b, p.k * p.c * 2, cudaMemcpyDeviceToDevice), "shift B");
    plan.run(nullptr, da, static_cast<char*>(shifted.ptr) + 2, c, d, bias);
    check(cudaDeviceSynchronize(), "kernel");
  });
}

bool sm90_here() {
  try {
    VnmSpmmPlan::create({128, 64, 128}, 128, 16, {.kernel = Nm24Kernel::sm90_wgmma_sp});  // the gathering kernel
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The portable kernel, and on an sm_90 device the gathering wgmma.sp kernel and the skinny one (whose split-K
// needs clusters).
std::vector<Nm24Kernel> kernels_here() {
  std::vector<Nm24Kernel> k{Nm24Kernel::sm80_mma_sp};
  if (sm90_here()) k.push_back(Nm24Kernel::sm90_wgmma_sp), k.push_back(Nm24Kernel::sm80_mma_sp_skinny);
  return k;
}

Problem plain(int64_t r, int64_t k, int64_t c, DType dtype, Layout b_layout) {
  return {r, k, c, dtype, dtype, b_layout, Layout::col_major, 1.0f, 0.0f, false, Activation::none};
}

TEST(VnmGpu, PatternsAndShapesWithTails) {
  SKIP_WITHOUT_GPU();
  const int64_t shapes[][3] = {{128, 64, 128},   {200, 136, 72}, {64, 40, 17},
                               {333, 1000, 520}, {1, 8, 1},      {256, 512, 256}};
  const Pattern patterns[] = {{128, 2, 8}, {64, 2, 5},    {32, 2, 7}, {256, 2, 16}, {128, 1, 10},
                              {64, 2, 32}, {128, 2, 100}, {64, 2, 4}, {32, 1, 20},  {128, 2, 40}};
  uint32_t seed = 1;
  for (Nm24Kernel kernel : kernels_here())
    for (Layout b_layout : {Layout::col_major, Layout::row_major})
      for (std::size_t i = 0; i < std::size(shapes); ++i)
        for (std::size_t j = 0; j < std::size(patterns); ++j) {
          const DType dtype = (i + j) % 2 ? DType::bf16 : DType::f16;
          const auto& s = shapes[i];
          // The condensed form throughout: the full_2_4 form is the nm24 product (its own tests, and below).
          Case t{plain(s[0], s[1], s[2], dtype, b_layout), patterns[j], kernel, 0, VnmForm::condensed};
          const bool sm90_ok = t.pattern.v >= 64 && (b_layout == Layout::col_major || s[2] % 8 == 0);
          if (kernel == Nm24Kernel::sm90_wgmma_sp && !sm90_ok) continue;  // the plan refuses; tested below
          EXPECT_LE(run_case(t, seed += 10), tolerance(dtype)) << describe(t);
        }
}

TEST(VnmGpu, EveryHopperTileWidth) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 500;
  for (Layout b_layout : {Layout::col_major, Layout::row_major})
    for (const auto& [v, widths] : {std::pair<int, std::vector<int>>{128, {256, 128, 64}}, {64, {128, 64}}})
      for (int block_n : widths)
        for (auto [r, k, c] : {std::tuple<int64_t, int64_t, int64_t>{300, 256, 8}, {256, 1000, 264}}) {
          Case t{
              plain(r, k, c, DType::f16, b_layout), {v, 2, 16}, Nm24Kernel::sm90_wgmma_sp, block_n, VnmForm::condensed};
          EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
        }
}

// The gathering kernels lose more on narrow n-tiles than the 2:4 kernel (docs/performance.md, V:N:M item 8): a
// 768-row weight takes one wave of 256-wide tiles, not three of 64-wide ones; a small C still takes a narrow tile.
TEST(VnmGpu, HopperGatherTilesAreWideUnlessCIsSmall) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  const auto width = [](int64_t r, int64_t c, int v) {
    return VnmSpmmPlan::create(plain(r, 4096, c, DType::f16, Layout::row_major).desc(), v, 8, {}, VnmForm::condensed)
        .config()
        .block_n;
  };
  EXPECT_EQ(width(768, 4096, 128), 256);
  EXPECT_EQ(width(768, 4096, 64), 128);
  EXPECT_EQ(width(11008, 4096, 128), 256);
  EXPECT_EQ(width(768, 64, 128), 64);
}

TEST(VnmGpu, LayoutsAndEpilogues) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 1000;
  for (Nm24Kernel kernel : kernels_here())
    for (const Problem& problem : layout_and_epilogue_problems(136, 200, 96)) {
      const Case t{problem, {64, 2, 10}, kernel};
      EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
    }
}

TEST(VnmGpu, EverySm90ScheduleAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  // The gathering kernels under the staged, register and persistent epilogues, with CTAs of the persistent grid
  // taking several tiles (1000 x 2000 at block_n 64: 8 x 32 = 256 tiles), R, K and C tails, both B layouts (the row
  // and column gathers), V = 64 (two B tiles per stage) and 128.
  uint32_t seed = 5000;
  for (Sm90Schedule schedule : {Sm90Schedule::staged, Sm90Schedule::registers, Sm90Schedule::persistent}) {
    for (Layout b_layout : {Layout::col_major, Layout::row_major})
      for (Layout d_layout : {Layout::col_major, Layout::row_major})
        for (int v : {64, 128}) {
          Problem problem = plain(1000, 300, 2000, v == 64 ? DType::bf16 : DType::f16, b_layout);
          problem.d_layout = d_layout, problem.bias = true, problem.act = Activation::relu;
          const Case t{problem, {v, 2, 10}, Nm24Kernel::sm90_wgmma_sp, 64, VnmForm::condensed};
          EXPECT_LE(run_case(t, seed += 10, {.schedule = schedule}), tolerance(t.dtype))
              << describe(t) << " schedule " << schedule_name(schedule);
        }
  }
}

// Split-K of the row gather (B row-major, V = 128, n-tiles of 64): clusters of 2, 4 and 8, each CTA a share of the
// condensed k-tiles, against the oracle with R and K tails (R = 1000; K = 1000 at 2:8 is 500 condensed columns, 8
// k-tiles: clusters of 8 take one each), C = 8 and 72, f16 and bf16, bias and ReLU, D in both layouts. By shape, a
// grid under a wave splits.
TEST(VnmGpu, RowGatherSplitKAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device";
  uint32_t seed = 7000;
  for (int split : {2, 4, 8})
    for (int64_t c : {8, 72})
      for (Layout d_layout : {Layout::col_major, Layout::row_major}) {
        Problem problem = plain(1000, 1000, c, split == 4 ? DType::bf16 : DType::f16, Layout::row_major);
        problem.d_layout = d_layout, problem.bias = true, problem.act = Activation::relu;
        const Case t{problem, {128, 2, 8}, Nm24Kernel::sm90_wgmma_sp, 64, VnmForm::condensed};
        EXPECT_LE(run_case(t, seed += 10, {.split = split}), tolerance(t.dtype)) << describe(t) << " split " << split;
      }
  const KernelConfig by_shape = VnmSpmmPlan::create(plain(4096, 4096, 8, DType::f16, Layout::row_major).desc(), 128, 8,
                                                    {.kernel = Nm24Kernel::sm90_wgmma_sp}, VnmForm::condensed)
                                    .config();
  EXPECT_GT(by_shape.split, 1) << "a 4096-row weight at C = 8 is 32 CTAs unsplit";
  EXPECT_EQ(by_shape.block_n, 64);
}

TEST(VnmGpu, StridedBAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  // B with a leading dimension past its dense one (NaN in the gap), as SparseLinear runs the row gather on x^T
  // padded to 8 tokens: odd C, the row gather (wide tiles and split-K at decode) and the column gather.
  uint32_t seed = 9200;
  for (Nm24Kernel kernel : kernels_here())
    for (Layout bl : {Layout::col_major, Layout::row_major})
      for (int64_t c : {int64_t{3}, int64_t{77}, int64_t{301}}) {
        const int64_t k = 1000;
        Problem problem = plain(1000, k, c, c == 77 ? DType::bf16 : DType::f16, bl);
        problem.bias = true, problem.act = Activation::relu;
        problem.ldb = bl == Layout::row_major ? (c + 7) / 8 * 8 : k + 13;
        const Case t{problem, {128, 2, 8}, kernel, 0, VnmForm::condensed};
        EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
        if (kernel == Nm24Kernel::sm90_wgmma_sp && bl == Layout::row_major && c == 3) {
          EXPECT_EQ(VnmSpmmPlan::create(t.desc(), 128, 8, {}, VnmForm::condensed).config().kernel,
                    Nm24Kernel::sm80_mma_sp_skinny);
          Case split = t;
          split.block_n = 64;
          EXPECT_LE(run_case(split, seed += 10, {.split = 4}), tolerance(t.dtype)) << describe(split) << " split 4";
        }
      }
  const VnmSpmmPlan plan = VnmSpmmPlan::create(plain(1024, 1024, 64, DType::f16, Layout::row_major).desc(), 128, 8);
  EXPECT_EQ(plan.for_tokens(61, 64).config().kernel, plan.config().kernel);
  EXPECT_NMKIT_ERROR(plan.for_tokens(61, 60), ErrorCode::invalid_argument, "ldb");
}

// The skinny kernel gathering B's elements through the table (decode sizes): V from 32 to 256, N 1 and 2, M with
// and without M % 4 == 0, R and condensed-K tails, C from 1 to 33, both B layouts with and without a strided or
// unaligned B, 16- and 32-row CTAs, split-K by shape and pinned, bias and ReLU, D in both layouts; and the shapes an
// automatic plan takes it for.
TEST(VnmGpu, SkinnyGatherAgreesWithTheOracle) {
  SKIP_WITHOUT_GPU();
  if (!sm90_here()) GTEST_SKIP() << "no sm90 device (the skinny kernel's split-K needs clusters)";
  uint32_t seed = 9600;
  const Pattern patterns[] = {{128, 2, 8}, {32, 2, 10}, {64, 1, 32}, {256, 2, 16}, {128, 2, 5}};
  for (const Pattern& pattern : patterns)
    for (Layout bl : {Layout::col_major, Layout::row_major})
      for (int64_t c : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{33}}) {
        Problem problem = plain(1000, 1000, c, c == 5 ? DType::bf16 : DType::f16, bl);
        problem.bias = true, problem.act = Activation::relu;
        problem.d_layout = c == 16 ? Layout::row_major : Layout::col_major;
        problem.ldb = c == 5 ? (bl == Layout::row_major ? c + 3 : problem.k + 13) : 0;
        const Case t{problem, pattern, Nm24Kernel::sm80_mma_sp_skinny, 0, VnmForm::condensed};
        EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
        if (c == 1) {
          EXPECT_LE(run_case(t, seed += 10, {.block_m = 16, .split = 8}), tolerance(t.dtype))
              << describe(t) << " block_m 16 split 8";
          EXPECT_LE(run_case(t, seed += 10, {.block_m = 32, .split = 1}), tolerance(t.dtype))
              << describe(t) << " block_m 32 split 1";
        }
      }
  // Split by shape: K = 4000 at 2:8 is 2000 condensed columns, 63 k-blocks, more than a CTA's warps load in a batch.
  const Case split{
      plain(77, 4000, 3, DType::f16, Layout::col_major), {128, 2, 8}, Nm24Kernel::automatic, 0, VnmForm::condensed};
  const KernelConfig config = VnmSpmmPlan::create(split.desc(), 128, 8, {}, VnmForm::condensed).config();
  EXPECT_EQ(config.kernel, Nm24Kernel::sm80_mma_sp_skinny);
  EXPECT_GT(config.split, 1);
  EXPECT_LE(run_case(split, seed += 10), tolerance(split.dtype)) << describe(split);
  // An automatic plan takes it at decode sizes: with B row-major on weights up to its limits (condensed R x K'
  // 4096 x 2048 at C <= 8, 4096 x 1024 at C <= 16), with B col-major on any; pinned sm90 choices keep that kernel.
  const auto kernel = [](int64_t r, int m, int64_t c, Nm24Options options = {}, Layout bl = Layout::row_major) {
    return VnmSpmmPlan::create(plain(r, 4096, c, DType::f16, bl).desc(), 128, m, options, VnmForm::condensed)
        .config()
        .kernel;
  };
  EXPECT_EQ(kernel(11008, 8, 16, {}, Layout::col_major), Nm24Kernel::sm80_mma_sp_skinny);
  EXPECT_EQ(kernel(11008, 8, 17, {}, Layout::col_major), Nm24Kernel::sm90_wgmma_sp);
  EXPECT_TRUE(VnmSpmmPlan::takes_skinny_kernel(11008, 4096, 8, 1, Layout::col_major));
  EXPECT_EQ(kernel(4096, 8, 8), Nm24Kernel::sm80_mma_sp_skinny);
  EXPECT_EQ(kernel(4096, 8, 16), Nm24Kernel::sm90_wgmma_sp);  // the row gather: its B rows are 16-byte pieces
  EXPECT_EQ(kernel(4096, 16, 16), Nm24Kernel::sm80_mma_sp_skinny);
  EXPECT_EQ(kernel(4096, 16, 24), Nm24Kernel::sm90_wgmma_sp);
  EXPECT_EQ(kernel(11008, 8, 8), Nm24Kernel::sm90_wgmma_sp);
  EXPECT_EQ(kernel(4096, 8, 8, {.block_n = 64}), Nm24Kernel::sm90_wgmma_sp);
  EXPECT_TRUE(VnmSpmmPlan::takes_skinny_kernel(4096, 4096, 8, 8, Layout::row_major));
  EXPECT_FALSE(VnmSpmmPlan::takes_skinny_kernel(4096, 4096, 8, 9, Layout::row_major));
  EXPECT_FALSE(VnmSpmmPlan::takes_skinny_kernel(11008, 4096, 8, 1, Layout::row_major));
  // An unaligned B (one element on): the skinny kernel reads elements, so the same plan runs it.
  const Problem p = plain(130, 256, 4, DType::f16, Layout::col_major);
  const DenseMatrix w = DenseMatrix::from_float(p.r, p.k, rounded_random(p.r * p.k, p.dtype, 8), p.dtype);
  const VnmMatrix a = compress_vnm(w, prune_vnm_magnitude(w, 128, 2, 8), 128, 2, 8);
  const DeviceVnm da = DeviceVnm::upload(pack_vnm(a, VnmForm::condensed, p.b_layout));
  const VnmSpmmPlan plan = VnmSpmmPlan::create(p.desc(), 128, 8);
  EXPECT_EQ(plan.config_for(da).kernel, Nm24Kernel::sm80_mma_sp_skinny);
  EXPECT_LE(error_with_unaligned_b(a, da, plan, p, 9), tolerance(p.dtype)) << "unaligned B";
}

TEST(VnmGpu, BothFormsAgreeWithTheOracle) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 3000;
  for (int m : {4, 8, 16, 32})
    for (VnmForm form : {VnmForm::automatic, VnmForm::condensed, VnmForm::full_2_4})
      for (Layout b_layout : {Layout::col_major, Layout::row_major}) {
        const Case t{plain(300, 520, 136, DType::bf16, b_layout), {128, 2, m}, Nm24Kernel::automatic, 0, form};
        EXPECT_LE(run_case(t, seed += 10), tolerance(t.dtype)) << describe(t);
      }
}

// The weight's form is fixed at pack time (by the layout of B it was packed for); an automatic plan runs either.
TEST(VnmGpu, AnAutomaticPlanRunsEitherForm) {
  SKIP_WITHOUT_GPU();
  uint32_t seed = 4000;
  for (Layout b_layout : {Layout::col_major, Layout::row_major}) {
    const Problem p = plain(200, 320, 72, DType::f16, b_layout);
    const DenseMatrix w = DenseMatrix::from_float(p.r, p.k, rounded_random(p.r * p.k, p.dtype, seed), p.dtype);
    const VnmMatrix a = compress_vnm(w, prune_vnm_magnitude(w, 128, 2, 16), 128, 2, 16);
    const VnmSpmmPlan plan = VnmSpmmPlan::create(p.desc(), 128, 16);
    EXPECT_EQ(plan.form(), VnmForm::automatic);
    for (VnmForm form : {VnmForm::condensed, VnmForm::full_2_4}) {
      const DeviceVnm da = DeviceVnm::upload(pack_vnm(a, form));
      const double error = error_against_oracle(
          SparseMatrix{a}, p, seed += 10,
          [&](const void* b, const void* c, void* d, const float* bias) { plan.run(nullptr, da, b, c, d, bias); });
      EXPECT_LE(error, tolerance(p.dtype)) << describe(p) << " " << vnm_form_name(form);
    }
  }
}

TEST(VnmGpu, FallbacksArePickedAndCorrect) {
  SKIP_WITHOUT_GPU();
  // C % 8 != 0 with B row-major past the skinny kernel's C, and V = 32: the portable kernel. An unaligned B
  // row-major pointer: the same plan falls back at run time.
  for (const Case& t : {Case{plain(100, 96, 21, DType::f16, Layout::row_major), {128, 2, 16}},
                        Case{plain(100, 96, 40, DType::bf16, Layout::col_major), {32, 2, 10}}}) {
    EXPECT_EQ(VnmSpmmPlan::create(t.desc(), t.pattern.v, t.pattern.m).config().kernel, Nm24Kernel::sm80_mma_sp);
    EXPECT_LE(run_case(t, 31), tolerance(t.dtype)) << describe(t);
  }
  const Problem p = plain(130, 64, 24, DType::f16, Layout::row_major);
  const DenseMatrix w = DenseMatrix::from_float(p.r, p.k, rounded_random(p.r * p.k, p.dtype, 5), p.dtype);
  const VnmMatrix a = compress_vnm(w, prune_vnm_magnitude(w, 128, 2, 16), 128, 2, 16);
  const DeviceVnm da = DeviceVnm::upload(pack_vnm(a, VnmForm::automatic, p.b_layout));  // condensed at 128:2:16
  ASSERT_EQ(da.form(), VnmForm::condensed);
  const VnmSpmmPlan plan = VnmSpmmPlan::create(p.desc(), 128, 16);
  EXPECT_LE(error_with_unaligned_b(a, da, plan, p, 6), tolerance(p.dtype));
}

TEST(VnmGpu, OverlappedLaunchesWaitForTheKernelBeforeThem) {
  SKIP_WITHOUT_GPU();
  // Chained 128:2:8 layers in the condensed form (expect_chained_layers): the gathering kernel, B col-major, at
  // C = 64, launched overlapping the kernel before it on an sm_90 device, and with Nm24Options::overlap_launch off.
  // At C = 8 the skinny kernel gathers (it waits at its start as well).
  constexpr int64_t kR1 = 1000, kK = 1536, kR2 = 700;
  const DenseMatrix w1 = test::random_matrix(kR1, kK, DType::f16, 91),
                    w2 = test::random_matrix(kR2, kR1, DType::f16, 92);
  const VnmMatrix a1 = compress_vnm(w1, prune_vnm_magnitude(w1, 128, 2, 8), 128, 2, 8);
  const VnmMatrix a2 = compress_vnm(w2, prune_vnm_magnitude(w2, 128, 2, 8), 128, 2, 8);
  const DeviceVnm d1 = DeviceVnm::upload(pack_vnm(a1, VnmForm::condensed, Layout::col_major));
  const DeviceVnm d2 = DeviceVnm::upload(pack_vnm(a2, VnmForm::condensed, Layout::col_major));
  for (int64_t n : {64, 8})
    for (bool overlap : {true, false}) {
      const Nm24Options options{.overlap_launch = overlap};
      const VnmSpmmPlan p1 = VnmSpmmPlan::create({kR1, kK, n}, 128, 8, options, VnmForm::condensed);
      const VnmSpmmPlan p2 = VnmSpmmPlan::create({kR2, kR1, n}, 128, 8, options, VnmForm::condensed);
      EXPECT_EQ(p1.config().overlap_launch, sm90_here() && overlap);
      expect_chained_layers(
          SparseMatrix{a1}, SparseMatrix{a2}, kK, kR1, kR2, n,
          [&](cudaStream_t s, const void* x, void* y) { p1.run(s, d1, x, nullptr, y); },
          [&](cudaStream_t s, const void* y, void* z) { p2.run(s, d2, y, nullptr, z); },
          std::string(overlap ? "overlapped" : "plain") + " C = " + std::to_string(n));
    }
}

TEST(VnmGpu, BadInputsAreRejected) {
  SKIP_WITHOUT_GPU();
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 48, 10), ErrorCode::unsupported, "V=48");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 300), ErrorCode::invalid_argument, "M=300");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64, DType::f32}, 64, 8), ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 32, 16, {.kernel = Nm24Kernel::sm90_wgmma_sp}),
                     ErrorCode::unsupported, "V >= 64");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 10, {}, VnmForm::full_2_4), ErrorCode::invalid_argument,
                     "M % 4 == 0");
  const DenseMatrix w = test::random_matrix(64, 64, DType::f16, 5);
  const DeviceVnm a = DeviceVnm::upload(pack_vnm(compress_vnm(w, prune_vnm_magnitude(w, 64, 2, 8), 64, 2, 8)));
  DeviceBytes b(64 * 64 * 2), d(64 * 64 * 2);
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 16).run(nullptr, a, b.ptr, nullptr, d.ptr),
                     ErrorCode::invalid_argument, "plan was made for");
  const VnmSpmmPlan plan = VnmSpmmPlan::create({64, 64, 64}, 64, 8);
  EXPECT_NMKIT_ERROR(plan.run(nullptr, a, nullptr, nullptr, d.ptr), ErrorCode::invalid_argument, "must not be null");
  EXPECT_NMKIT_ERROR(plan.run(nullptr, a, b.ptr, nullptr, static_cast<char*>(d.ptr) + 1), ErrorCode::invalid_argument,
                     "aligned");
  const VnmSpmmPlan condensed = VnmSpmmPlan::create({64, 64, 64}, 64, 8, {}, VnmForm::condensed);
  EXPECT_NMKIT_ERROR(condensed.run(nullptr, a, b.ptr, nullptr, d.ptr), ErrorCode::invalid_argument, "full_2_4 form");
  PackedVnm bad = pack_vnm(compress_vnm(w, prune_vnm_magnitude(w, 64, 2, 8), 64, 2, 8), VnmForm::condensed);
  bad.gather[0] = 64;  // past K
  EXPECT_NMKIT_ERROR(DeviceVnm::upload(bad), ErrorCode::invalid_argument, "not a row of B");
}

}  // namespace
}  // namespace nmkit::gpu
