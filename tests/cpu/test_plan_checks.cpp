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

TEST(PlanChecks, VnmRefusesUnsupportedPatterns) {
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 48, 10), ErrorCode::unsupported, "V=48");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 300), ErrorCode::invalid_argument, "M=300");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64, DType::f32}, 64, 8), ErrorCode::unsupported, "f16 or bf16");
  EXPECT_NMKIT_ERROR(VnmSpmmPlan::create({64, 64, 64}, 64, 10, Nm24Kernel::automatic, 0, VnmForm::full_2_4),
                     ErrorCode::invalid_argument, "M % 4 == 0");
}

TEST(PlanChecks, TileRejectsABadOverlapSwitch) {
  // NMKIT_OVERLAP_LAUNCH takes 0 or 1; anything else is named in the error, before the plan asks for a device.
  setenv("NMKIT_OVERLAP_LAUNCH", "yes", 1);
  EXPECT_NMKIT_ERROR(TileSpmmPlan::create({256, 256, 32}, 64, 64), ErrorCode::invalid_argument,
                     "NMKIT_OVERLAP_LAUNCH must be 0 or 1");
  unsetenv("NMKIT_OVERLAP_LAUNCH");
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
