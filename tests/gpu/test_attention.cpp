// The fused DFSS attention kernel against the CPU oracle (nmkit/attention/dfss.hpp). Q and K hold multiples of
// 1/4 in [-1, 1], so every score is exact in fp32 on both sides and the pruning decisions, ties included, must agree.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <iostream>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "nmkit/attention/dfss.hpp"
#include "nmkit/error.hpp"
#include "nmkit/attention/dfss_gpu.hpp"

namespace nmkit::gpu {
namespace {

// bhsd_padded: [B, H, S, D] with a gap after each batch, which no 5-D map of 2:4 K can fold (the kernel copies K).
enum class TokenLayout { bhsd, bshd, bhsd_padded };

struct Case {
  int64_t batch, heads, kv_heads, seq_q, seq_k;
  int head_dim;
  DType dtype;
  AttentionPattern pattern;
  bool causal;
  TokenLayout layout = TokenLayout::bhsd;
  std::vector<int> lengths_q = {}, lengths_k = {};  // variable lengths when not empty
  std::optional<float> scale = {};                  // the plan's default: 1 / sqrt(d)
};

std::string describe(const Case& c) {
  std::string s = std::to_string(c.batch) + "x" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " S " +
                  std::to_string(c.seq_q) + "x" + std::to_string(c.seq_k) + " d " + std::to_string(c.head_dim) + " " +
                  dtype_name(c.dtype) + " " + pattern_name(c.pattern) + (c.causal ? " causal" : "") +
                  (c.layout == TokenLayout::bshd ? " BSHD" : "") +
                  (c.layout == TokenLayout::bhsd_padded ? " padded" : "");
  if (!c.lengths_q.empty()) s += " varlen";
  if (c.scale) s += " scale " + std::to_string(*c.scale);
  return s;
}

// Logical [batch][heads][tokens][d] values of one operand.
struct Operand {
  int64_t batch, heads, tokens;
  int d;
  std::vector<float> values;
  float at(int64_t b, int64_t h, int64_t s, int64_t i) const {
    return values[static_cast<std::size_t>(((b * heads + h) * tokens + s) * d + i)];
  }
};

Operand quarter_steps(int64_t batch, int64_t heads, int64_t tokens, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> step(-4, 4);
  Operand o{batch, heads, tokens, d, std::vector<float>(static_cast<std::size_t>(batch * heads * tokens * d))};
  for (float& x : o.values) x = 0.25f * static_cast<float>(step(rng));
  return o;
}

Operand random_values(int64_t batch, int64_t heads, int64_t tokens, int d, DType dtype, uint32_t seed) {
  Operand o{batch, heads, tokens, d, rounded_random(static_cast<std::size_t>(batch * heads * tokens * d), dtype, seed)};
  return o;
}

// Strides of a fixed-length operand in the case's layout.
AttentionStrides strides_of(const Case& c, int64_t heads, int64_t tokens) {
  const int64_t d = c.head_dim;
  if (c.layout == TokenLayout::bshd) return {tokens * heads * d, d, heads * d};
  const int64_t gap = c.layout == TokenLayout::bhsd_padded ? 64 : 0;
  return {heads * tokens * d + gap, tokens * d, d};
}

// Device bytes of an operand at `strides`; for variable lengths sequence b's tokens start at offsets[b].
std::vector<std::byte> lay_out(const Operand& o, DType dtype, const AttentionStrides& s, std::size_t elements,
                               const std::vector<int>& offsets, const std::vector<int>& lengths) {
  TypedBuffer buffer(dtype, elements);
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t h = 0; h < o.heads; ++h) {
      const int64_t tokens = lengths.empty() ? o.tokens : lengths[static_cast<std::size_t>(b)];
      for (int64_t t = 0; t < tokens; ++t)
        for (int i = 0; i < o.d; ++i) {
          const int64_t at = lengths.empty() ? b * s.batch + h * s.head + t * s.token + i
                                             : h * s.head + (offsets[static_cast<std::size_t>(b)] + t) * s.token + i;
          buffer.set(static_cast<std::size_t>(at), o.at(b, h, t, i));
        }
    }
  return {buffer.data(), buffer.data() + buffer.size_bytes()};
}

// The rows of operand (b, h), the first `tokens`, as a row-major float matrix.
std::vector<float> rows_of(const Operand& o, int64_t b, int64_t h, int64_t tokens) {
  const auto begin = o.values.begin() + ((b * o.heads + h) * o.tokens) * o.d;
  return {begin, begin + tokens * o.d};
}

void run_case(const Case& c) {
  SCOPED_TRACE(describe(c));
  const bool varlen = !c.lengths_q.empty();
  const int d = c.head_dim;
  std::vector<int> offsets_q{0}, offsets_k{0};
  for (std::size_t b = 0; varlen && b < c.lengths_q.size(); ++b) {
    offsets_q.push_back(offsets_q.back() + c.lengths_q[b]);
    offsets_k.push_back(offsets_k.back() + c.lengths_k[b]);
  }
  const int64_t total_q = varlen ? offsets_q.back() : 0, total_k = varlen ? offsets_k.back() : 0;

  const Operand q = quarter_steps(c.batch, c.heads, c.seq_q, d, 1);
  const Operand k = quarter_steps(c.batch, c.kv_heads, c.seq_k, d, 2);
  const Operand v = random_values(c.batch, c.kv_heads, c.seq_k, d, c.dtype, 3);

  AttentionDesc desc{.batch = c.batch,
                     .heads = c.heads,
                     .kv_heads = c.kv_heads,
                     .seq_q = c.seq_q,
                     .seq_k = c.seq_k,
                     .total_q = total_q,
                     .total_k = total_k,
                     .head_dim = d,
                     .dtype = c.dtype,
                     .pattern = c.pattern,
                     .causal = c.causal,
                     .scale = c.scale,
                     .variable_lengths = varlen};
  if (varlen) {
    desc.q = desc.o = {0, d, c.heads * d};
    desc.k = desc.v = {0, d, c.kv_heads * d};
  } else {
    desc.q = desc.o = strides_of(c, c.heads, c.seq_q);
    desc.k = desc.v = strides_of(c, c.kv_heads, c.seq_k);
  }
  const AttentionPlan plan = AttentionPlan::create(desc);

  const std::size_t q_elements = static_cast<std::size_t>(varlen ? total_q * c.heads * d : c.batch * desc.q.batch);
  const std::size_t k_elements = static_cast<std::size_t>(varlen ? total_k * c.kv_heads * d : c.batch * desc.k.batch);
  const std::size_t bytes = dtype_size(c.dtype);
  const std::vector<int> no_lengths;
  const auto q_host = lay_out(q, c.dtype, desc.q, q_elements, offsets_q, varlen ? c.lengths_q : no_lengths);
  const auto k_host = lay_out(k, c.dtype, desc.k, k_elements, offsets_k, varlen ? c.lengths_k : no_lengths);
  const auto v_host = lay_out(v, c.dtype, desc.v, k_elements, offsets_k, varlen ? c.lengths_k : no_lengths);

  DeviceBytes q_dev(q_elements * bytes), k_dev(k_elements * bytes), v_dev(k_elements * bytes),
      o_dev(q_elements * bytes);
  const std::size_t lse_count =
      varlen ? static_cast<std::size_t>(c.heads * total_q) : static_cast<std::size_t>(c.batch * c.heads * c.seq_q);
  DeviceBytes lse_dev(lse_count * sizeof(float));
  DeviceBytes cu_q_dev(offsets_q.size() * sizeof(int)), cu_k_dev(offsets_k.size() * sizeof(int));
  check(cudaMemcpy(q_dev.ptr, q_host.data(), q_host.size(), cudaMemcpyHostToDevice), "copy q");
  check(cudaMemcpy(k_dev.ptr, k_host.data(), k_host.size(), cudaMemcpyHostToDevice), "copy k");
  check(cudaMemcpy(v_dev.ptr, v_host.data(), v_host.size(), cudaMemcpyHostToDevice), "copy v");
  check(cudaMemcpy(cu_q_dev.ptr, offsets_q.data(), offsets_q.size() * sizeof(int), cudaMemcpyHostToDevice), "cu q");
  check(cudaMemcpy(cu_k_dev.ptr, offsets_k.data(), offsets_k.size() * sizeof(int), cudaMemcpyHostToDevice), "cu k");
  // Poison: every output the kernel must write starts as NaN.
  check(cudaMemset(o_dev.ptr, 0xff, q_elements * bytes), "poison o");
  check(cudaMemset(lse_dev.ptr, 0xff, lse_count * sizeof(float)), "poison lse");

  plan.run(nullptr, {.q = q_dev.ptr,
                     .k = k_dev.ptr,
                     .v = v_dev.ptr,
                     .o = o_dev.ptr,
                     .lse = static_cast<float*>(lse_dev.ptr),
                     .cu_seqlens_q = static_cast<int32_t*>(cu_q_dev.ptr),
                     .cu_seqlens_k = static_cast<int32_t*>(cu_k_dev.ptr)});
  check(cudaDeviceSynchronize(), "attention kernel");
  std::vector<std::byte> o_bytes(q_elements * bytes);
  std::vector<float> lse(lse_count);
  check(cudaMemcpy(o_bytes.data(), o_dev.ptr, o_bytes.size(), cudaMemcpyDeviceToHost), "copy o");
  check(cudaMemcpy(lse.data(), lse_dev.ptr, lse_count * sizeof(float), cudaMemcpyDeviceToHost), "copy lse");
  const std::vector<float> o = decode(o_bytes, c.dtype);

  // P is rounded to the dtype before P * V; O is a convex combination of V's entries in [-1, 1].
  const double o_tolerance = c.dtype == DType::bf16 ? 1.5e-2 : 3e-3;
  const double lse_tolerance = 2e-3;
  DfssOptions oracle{.n = 2, .m = 4};
  oracle.mask.causal = c.causal;
  oracle.scale = plan.scale();
  double worst_o = 0, worst_lse = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t len_q = varlen ? c.lengths_q[b] : c.seq_q, len_k = varlen ? c.lengths_k[b] : c.seq_k;
      const int64_t kv_head = h / (c.heads / c.kv_heads);
      const std::vector<float> qm = rows_of(q, b, h, len_q), km = rows_of(k, b, kv_head, len_k),
                               vm = rows_of(v, b, kv_head, len_k);
      std::vector<float> ref_lse;
      const ConstMatrixRef qr{qm.data(), len_q, d}, kr{km.data(), len_k, d}, vr{vm.data(), len_k, d};
      // No keys: nothing to attend, O = 0 and lse = -inf (the oracle takes no empty K).
      std::vector<float> ref(static_cast<std::size_t>(len_q * d), 0.0f);
      ref_lse.assign(static_cast<std::size_t>(len_q), -std::numeric_limits<float>::infinity());
      if (len_k > 0)
        ref = c.pattern == AttentionPattern::nm24 ? dfss_attention(qr, kr, vr, oracle, &ref_lse)
                                                  : attention_reference(qr, kr, vr, oracle, &ref_lse);
      for (int64_t s = 0; s < len_q; ++s) {
        const int64_t row = varlen ? h * desc.o.head + (offsets_q[b] + s) * desc.o.token
                                   : b * desc.o.batch + h * desc.o.head + s * desc.o.token;
        for (int i = 0; i < d; ++i) {
          const float got = o[static_cast<std::size_t>(row + i)], want = ref[static_cast<std::size_t>(s * d + i)];
          ASSERT_TRUE(std::isfinite(got)) << "O not written at b " << b << " h " << h << " row " << s << " col " << i;
          worst_o = std::max(worst_o, static_cast<double>(std::fabs(got - want)));
          ASSERT_LE(std::fabs(got - want), o_tolerance) << "b " << b << " h " << h << " row " << s << " col " << i;
        }
        const std::size_t lse_at = varlen ? static_cast<std::size_t>(h * total_q + offsets_q[b] + s)
                                          : static_cast<std::size_t>((b * c.heads + h) * c.seq_q + s);
        const float want_lse = ref_lse[static_cast<std::size_t>(s)];
        if (std::isinf(want_lse)) {
          EXPECT_TRUE(std::isinf(lse[lse_at]) && lse[lse_at] < 0) << "lse at row " << s << ": " << lse[lse_at];
        } else {
          worst_lse = std::max(worst_lse, static_cast<double>(std::fabs(lse[lse_at] - want_lse)));
          ASSERT_LE(std::fabs(lse[lse_at] - want_lse), lse_tolerance) << "lse, b " << b << " h " << h << " row " << s;
        }
      }
    }
  std::cout << "  " << describe(c) << ": max |O - oracle| " << worst_o << ", max |lse - oracle| " << worst_lse << "\n";
}

class AttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    const DeviceQuery cuda = query_cuda_devices();
    if (cuda.devices.front().cc_major != 9) GTEST_SKIP() << "the fused attention kernel needs sm_90a";
  }
};

constexpr auto kSparse = AttentionPattern::nm24;
constexpr auto kDense = AttentionPattern::dense;

TEST_F(AttentionGpu, EveryHeadDimDtypeAndPattern) {
  for (int d : {64, 128})
    for (DType dtype : {DType::bf16, DType::f16})
      for (AttentionPattern pattern : {kSparse, kDense})
        for (bool causal : {false, true}) run_case({1, 2, 2, 300, 300, d, dtype, pattern, causal});
}

TEST_F(AttentionGpu, TailsAndUnequalLengths) {
  for (AttentionPattern pattern : {kSparse, kDense})
    for (bool causal : {false, true}) {
      run_case({1, 1, 1, 1, 1, 128, DType::bf16, pattern, causal});
      run_case({2, 1, 1, 77, 333, 64, DType::f16, pattern, causal});
      run_case({1, 1, 1, 333, 77, 128, DType::bf16, pattern, causal});
      run_case({1, 1, 1, 130, 1029, 128, DType::f16, pattern, causal});
    }
}

TEST_F(AttentionGpu, ManyKeySteps) {  // the rings wrap many times
  run_case({1, 2, 2, 256, 2048, 128, DType::bf16, kSparse, false});
  run_case({1, 2, 2, 1024, 1024, 64, DType::f16, kSparse, true});
}

TEST_F(AttentionGpu, GroupedQueryHeadsAndTokenMajorLayout) {
  run_case({2, 4, 2, 200, 200, 128, DType::bf16, kSparse, false});
  run_case({2, 6, 1, 150, 150, 64, DType::f16, kSparse, true});
  run_case({2, 3, 3, 150, 270, 128, DType::bf16, kSparse, false, TokenLayout::bshd});
  run_case({1, 4, 2, 129, 129, 64, DType::bf16, kDense, true, TokenLayout::bshd});
}

// 2:4 K by TMA boxes with the batch folded into the heads (BHSD) or the tokens (BSHD), and by copies where the
// batch stride folds into neither (padded); whole steps and the step holding the sequence's end.
TEST_F(AttentionGpu, EveryWayOfLoadingPermutedKeys) {
  for (TokenLayout layout : {TokenLayout::bhsd, TokenLayout::bshd, TokenLayout::bhsd_padded})
    for (int d : {64, 128}) run_case({2, 2, 2, 150, 400, d, DType::f16, kSparse, false, layout});
  run_case({3, 2, 1, 128, 256, 128, DType::bf16, kSparse, true, TokenLayout::bhsd_padded});
}

TEST_F(AttentionGpu, VariableLengths) {
  for (AttentionPattern pattern : {kSparse, kDense})
    for (bool causal : {false, true})
      run_case({3, 2, 1, 257, 300, 128, DType::bf16, pattern, causal, TokenLayout::bhsd, {5, 130, 257}, {7, 300, 129}});
  run_case({2, 2, 2, 200, 200, 64, DType::f16, kSparse, true, TokenLayout::bhsd, {200, 1}, {200, 1}});
}

// The lengths the issue names, with tails in the last key step and query block.
TEST_F(AttentionGpu, OddLengths) {
  for (bool causal : {false, true}) {
    run_case({1, 1, 1, 1000, 1000, 128, DType::bf16, kSparse, causal});
    run_case({1, 1, 1, 4097, 4097, 64, DType::f16, kSparse, causal});
  }
}

// A large scale makes later key steps pass the references of the first by far more than 2^4, so that the fast 2:4
// path gives up and the exact one moves the references (quarter-step scores at the default scale never do).
TEST_F(AttentionGpu, ReferencesThatMoveAfterTheFirstStep) {
  for (int d : {64, 128})
    for (bool causal : {false, true}) {
      Case c{1, 2, 2, 300, 700, d, DType::f16, kSparse, causal};
      c.scale = 2.0f;
      run_case(c);
    }
}

TEST_F(AttentionGpu, NoKeysGivesZerosAndMinusInfinity) { run_case({1, 1, 1, 70, 0, 64, DType::bf16, kSparse, false}); }

TEST(AttentionPlan, RefusesBadDescriptions) {
  const auto refused = [](AttentionDesc d, const char* what) {
    try {
      (void)AttentionPlan::create(d);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << what << ": " << e.what();
    }
  };
  const AttentionDesc good{.batch = 1, .heads = 4, .seq_q = 16, .seq_k = 16, .head_dim = 64};
  AttentionDesc d = good;
  d.head_dim = 96;
  refused(d, "head_dim 96");
  d = good, d.kv_heads = 3;
  refused(d, "kv_heads not dividing heads");
  d = good, d.dtype = DType::f32;
  refused(d, "f32");
  d = good, d.q = {4 * 16 * 64, 16 * 64, 60};
  refused(d, "token stride not a multiple of 8");
  d = good, d.k = {int64_t{1} << 40, 16 * 64, 64};
  refused(d, "a batch stride TMA cannot take");
  d = good, d.scale = -1.0f;
  refused(d, "negative scale");
  d = good, d.variable_lengths = true;
  refused(d, "variable lengths without totals");
}

}  // namespace
}  // namespace nmkit::gpu
