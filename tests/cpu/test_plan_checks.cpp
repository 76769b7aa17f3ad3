// The GPU plans' and layers' refusals that need no device: built with the CUDA parts, run everywhere (CI has no
// GPU), so that a check which stops throwing fails here and not only on the GPU machine.
#include <gtest/gtest.h>

#include <cstdlib>

#include "nmkit/error.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "nmkit/gpu/sparse_linear.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {
namespace {

TEST(PlanChecks, Nm24RefusesBadDescriptions) {
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({0, 64, 64}), ErrorCode::invalid_argument, "R >= 1");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({64, 64, 64, DType::f32}), ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create({64, 64, 64, DType::f16, DType::bf16}), ErrorCode::unsupported,
                     "output dtype");
}

TEST(PlanChecks, LeadingDimensionsBelowTheDenseOneAreRefused) {
  // ldb is at least K (B col-major) or C (B row-major); the tile kernels read a dense B only.
  SpmmDesc col_major{64, 96, 40};
  col_major.ldb = 95;
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(col_major), ErrorCode::invalid_argument, "at least K = 96");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create(col_major, 128, 8), ErrorCode::invalid_argument, "at least K = 96");
  SpmmDesc row_major{64, 96, 40};
  row_major.b_layout = Layout::row_major, row_major.ldb = 39;
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(row_major), ErrorCode::invalid_argument, "at least C = 40");
  row_major.ldb = 48;
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create(row_major, 64, 64), ErrorCode::unsupported, "dense B");
}

TEST(PlanChecks, MoreThan2To30TokensAreRefused) {
  // The Hopper kernels address B and D by 32-bit tensor-map coordinates, a last tile's boxes past C included.
  const SpmmDesc too_many{64, 64, (int64_t{1} << 30) + 1};
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(too_many), ErrorCode::unsupported, "C is at most 2^30");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create(too_many, 128, 8), ErrorCode::unsupported, "C is at most 2^30");
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create(too_many, 64, 64), ErrorCode::unsupported, "C is at most 2^30");
}

TEST(PlanChecks, Nm24RefusesOptionsNoKernelTakes) {
  const SpmmDesc desc{256, 256, 256};
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.block_n = 100}), ErrorCode::invalid_argument, "block_n");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.raster_rows = -1}), ErrorCode::invalid_argument, "raster_rows");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.raster_rows = 1025}), ErrorCode::invalid_argument, "raster_rows");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.split = 9}), ErrorCode::invalid_argument, "split");
  for (const Nm24Options& sm90_only :
       {Nm24Options{.kernel = Nm24Kernel::sm80_mma_sp, .block_n = 128},
        Nm24Options{.kernel = Nm24Kernel::sm80_mma_sp, .schedule = Sm90Schedule::persistent},
        Nm24Options{.kernel = Nm24Kernel::sm80_mma_sp, .raster_rows = 8},
        Nm24Options{.kernel = Nm24Kernel::sm80_mma_sp, .split = 2}}) {
    EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, sm90_only), ErrorCode::unsupported, "sm90 kernel");
    EXPECT_NMKIT_ERROR(VnmSpmmPlan::create(desc, 128, 8, sm90_only), ErrorCode::unsupported, "sm90 kernel");
  }
}

TEST(PlanChecks, SkinnyKernelOptionsAreChecked) {
  const SpmmDesc desc{256, 256, 16};
  constexpr Nm24Kernel kSkinny = Nm24Kernel::sm80_mma_sp_skinny;
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.kernel = kSkinny, .block_n = 128}), ErrorCode::invalid_argument,
                     "8, 16, 32 or 64");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.kernel = kSkinny, .block_m = 64}), ErrorCode::invalid_argument,
                     "block_m must be 16 or 32");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.kernel = kSkinny, .split = 9}), ErrorCode::invalid_argument,
                     "split must be 1..8");
  // Its split-K runs in clusters: an sm_90 device's, refused by name on others (without a device the plan's
  // device query fails first).
  try {
    EXPECT_EQ(Nm24SpmmPlan::create(desc, {.kernel = kSkinny, .split = 2}).config().split, 2);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::cuda_error) {
      EXPECT_EQ(e.code(), ErrorCode::unsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("an sm_90 device"), std::string::npos) << e.what();
    }
  }
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.kernel = kSkinny, .schedule = Sm90Schedule::staged}),
                     ErrorCode::unsupported, "sm90 kernel");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.block_m = 16}), ErrorCode::unsupported, "skinny kernel");
  EXPECT_NMKIT_ERROR(Nm24SpmmPlan::create(desc, {.block_n = 8}), ErrorCode::invalid_argument, "block_n");
  // The V:N:M plan's skinny kernel (its gathering staging) takes the same options, checked the same way.
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create(desc, 128, 8, {.kernel = kSkinny, .block_n = 128}),
                     ErrorCode::invalid_argument, "8, 16, 32 or 64");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create(desc, 128, 8, {.kernel = kSkinny, .block_m = 64}), ErrorCode::invalid_argument,
                     "block_m must be 16 or 32");
  try {  // its gathering staging is built for column tiles of 8 and 16 (without a device the device query fails first)
    VnmSpmmPlan::create(desc, 128, 8, {.kernel = kSkinny, .block_n = 32});
    ADD_FAILURE() << "block_n 32 taken";
  } catch (const Error& e) {
    if (e.code() != ErrorCode::cuda_error)
      EXPECT_NE(std::string(e.what()).find("block_n 8 or 16"), std::string::npos) << e.what();
  }
}

TEST(PlanChecks, VnmRefusesUnsupportedPatterns) {
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 48, 10), ErrorCode::unsupported, "V=48");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 300), ErrorCode::invalid_argument, "M=300");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64, DType::f32}, 64, 8), ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 10, {}, VnmForm::full_2_4), ErrorCode::invalid_argument,
                     "M % 4 == 0");
}

TEST(PlanChecks, SparseLinearRefusesWeightsNoKernelTakes) {
  const DenseMatrix w16 = test::random_matrix(64, 64, DType::f16, 1);
  EXPECT_NMKIT_ERROR(SparseLinear::create(prune_magnitude(w16, NmSpec{2, 8}).compressed), ErrorCode::unsupported,
                     "2:4");
  const DenseMatrix w32 = test::random_matrix(64, 64, DType::f32, 1);
  EXPECT_NMKIT_ERROR(SparseLinear::create(prune_magnitude(w32, NmSpec{2, 4}).compressed), ErrorCode::unsupported,
                     "f16 or bf16 weights");
}

}  // namespace
}  // namespace nmkit::gpu
