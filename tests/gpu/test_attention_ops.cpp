// The unfused DFSS ops (prune_scores_nm24, softmax_nm24, then Nm24SpmmPlan for P * V) against the CPU oracle's
// sddmm_nm, softmax_nm and spmm_nm_v. Q and K hold 0 or +-1/4 at head dim 64, so every score is a multiple of 1/16
// in [-4, 4], exact in fp32, f16 and bf16 alike: the pruning decisions, ties (many) included, must agree.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "nmkit/attention/dfss.hpp"
#include "nmkit/attention/dfss_ops_gpu.hpp"
#include "nmkit/error.hpp"

namespace nmkit::gpu {
namespace {

constexpr int kHeadDim = 64;
constexpr float kScale = 0.125f;  // 1 / sqrt(64)

std::vector<float> sixteenths(std::size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> step(-1, 1);
  std::vector<float> v(count);
  for (float& x : v) x = 0.25f * static_cast<float>(step(rng));
  return v;
}

// The device P, downloaded and unpacked (which validates the metadata), as a dense fp32 matrix.
std::vector<float> download_dense(const DeviceNm24& p) {
  PackedNm24 packed;
  packed.rows = p.rows(), packed.cols = p.cols(), packed.rows_padded = p.rows_padded();
  packed.cols_padded = p.cols_padded(), packed.dtype = p.dtype();
  packed.values.resize(p.value_bytes() / 4);
  packed.metadata.resize(p.metadata_bytes() / 4);
  check(cudaMemcpy(packed.values.data(), p.values(), p.value_bytes(), cudaMemcpyDeviceToHost), "copy values");
  check(cudaMemcpy(packed.metadata.data(), p.metadata(), p.metadata_bytes(), cudaMemcpyDeviceToHost), "copy meta");
  return decompress(unpack_nm24(packed)).to_float();
}

TEST(AttentionOpsGpu, PruneSoftmaxAndProductAgreeWithTheOracle) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t seq_q, seq_k;
  };
  uint32_t seed = 400;
  for (DType dtype : {DType::bf16, DType::f16})
    for (DType score_dtype : {DType::f32, dtype})
      for (const Shape& s : {Shape{1, 1}, Shape{77, 333}, Shape{200, 64}, Shape{129, 1029}})
        for (bool causal : {false, true}) {
          const std::string what = std::string(dtype_name(dtype)) + " scores " + dtype_name(score_dtype) + " " +
                                   std::to_string(s.seq_q) + "x" + std::to_string(s.seq_k) + (causal ? " causal" : "");
          const std::vector<float> q = sixteenths(s.seq_q * kHeadDim, seed += 3);
          const std::vector<float> k = sixteenths(s.seq_k * kHeadDim, seed += 3);
          const std::vector<float> v = rounded_random(s.seq_k * kHeadDim, dtype, seed += 3);
          std::vector<float> scores(static_cast<std::size_t>(s.seq_q * s.seq_k));
          for (int64_t i = 0; i < s.seq_q; ++i)
            for (int64_t j = 0; j < s.seq_k; ++j) {
              float dot = 0;
              for (int c = 0; c < kHeadDim; ++c) dot += q[i * kHeadDim + c] * k[j * kHeadDim + c];
              scores[i * s.seq_k + j] = dot;
            }
          const ConstMatrixRef qm{q.data(), s.seq_q, kHeadDim}, km{k.data(), s.seq_k, kHeadDim};
          std::vector<float> want_lse;
          const NmMatrix want_p = softmax_nm(sddmm_nm(qm, km, kScale, {.causal = causal}, 2, 4), &want_lse);
          const std::vector<float> want_dense = decompress(want_p).to_float();
          const std::vector<float> want_o = spmm_nm_v(want_p, {v.data(), s.seq_k, kHeadDim});

          const auto score_bytes = encode(scores, score_dtype);
          DeviceBytes d_scores(score_bytes.size()), d_lse(s.seq_q * 4), d_v(v.size() * 2), d_o(s.seq_q * kHeadDim * 2);
          check(cudaMemcpy(d_scores.ptr, score_bytes.data(), score_bytes.size(), cudaMemcpyHostToDevice), "scores");
          const auto v_bytes = encode(v, dtype);
          check(cudaMemcpy(d_v.ptr, v_bytes.data(), v_bytes.size(), cudaMemcpyHostToDevice), "V");
          check(cudaMemset(d_lse.ptr, 0xff, s.seq_q * 4), "poison lse");
          check(cudaMemset(d_o.ptr, 0xff, s.seq_q * kHeadDim * 2), "poison O");
          DeviceNm24 p = DeviceNm24::allocate(s.seq_q, s.seq_k, dtype);
          check(cudaMemset(p.values(), 0xff, p.value_bytes()), "poison P");
          prune_scores_nm24(nullptr,
                            {.scores = d_scores.ptr,
                             .dtype = score_dtype,
                             .rows = s.seq_q,
                             .cols = s.seq_k,
                             .scale = kScale,
                             .causal = causal},
                            p);
          softmax_nm24(nullptr, p, static_cast<float*>(d_lse.ptr));
          check(cudaDeviceSynchronize(), "prune and softmax");

          const std::vector<float> got_dense = download_dense(p);
          ASSERT_EQ(got_dense.size(), want_dense.size()) << what;
          int pattern_mismatches = 0;
          for (std::size_t i = 0; i < got_dense.size(); ++i)
            if ((got_dense[i] != 0.0f) != (want_dense[i] != 0.0f)) ++pattern_mismatches;
          EXPECT_EQ(pattern_mismatches, 0) << what << ": kept entries differ from the oracle's";
          EXPECT_LE(test::relative_frobenius(got_dense, want_dense), dtype == DType::bf16 ? 8e-3 : 1e-3) << what;
          std::vector<float> got_lse(static_cast<std::size_t>(s.seq_q));
          check(cudaMemcpy(got_lse.data(), d_lse.ptr, s.seq_q * 4, cudaMemcpyDeviceToHost), "copy lse");
          for (int64_t i = 0; i < s.seq_q; ++i) EXPECT_NEAR(got_lse[i], want_lse[i], 1e-4) << what << " row " << i;

          const SpmmDesc desc{s.seq_q, s.seq_k, kHeadDim, dtype, dtype, Layout::row_major, Layout::row_major};
          Nm24SpmmPlan::create(desc, {.overlap_launch = false}).run(nullptr, p, d_v.ptr, nullptr, d_o.ptr);
          check(cudaDeviceSynchronize(), "P * V");
          std::vector<std::byte> o_bytes(s.seq_q * kHeadDim * 2);
          check(cudaMemcpy(o_bytes.data(), d_o.ptr, o_bytes.size(), cudaMemcpyDeviceToHost), "copy O");
          EXPECT_LE(test::relative_frobenius(decode(o_bytes, dtype), want_o), 2e-2) << what;
        }
}

TEST(AttentionOpsGpu, Refusals) {
  SKIP_WITHOUT_GPU();
  DeviceNm24 p = DeviceNm24::allocate(64, 128, DType::bf16);
  DeviceBytes scores(64 * 128 * 4);
  EXPECT_NMKIT_ERROR(prune_scores_nm24(nullptr, {.scores = scores.ptr, .rows = 64, .cols = 96}, p),
                     ErrorCode::invalid_argument, "P holds 64x128");
  EXPECT_NMKIT_ERROR(prune_scores_nm24(nullptr, {.scores = scores.ptr, .rows = 64, .cols = 128, .ld = 100}, p),
                     ErrorCode::invalid_argument, "ld 100");
  EXPECT_NMKIT_ERROR(prune_scores_nm24(nullptr, {.rows = 64, .cols = 128}, p), ErrorCode::invalid_argument, "null");
}

}  // namespace
}  // namespace nmkit::gpu
