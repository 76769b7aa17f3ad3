// The `8bit` suite: nmkit's 8-bit 2:4 SpMM (Nm24x8SpmmPlan), alone and after quantize_tokens (x given in bf16),
// against dense cuBLASLt and cuSPARSELt 2:4 at the same 8-bit type, all in the same interleaved rounds. The weight
// is a random matrix pruned to 2:4 by magnitude and quantized per row; x is random, quantized per token. Every
// library reads the same codes. Checks: nmkit's bf16 output against a bf16 cuBLASLt product of the dequantized
// operands (which rounds them to bf16: a check of layouts and scales, not of the last bits); the baselines' outputs
// against the product of the unscaled codes (exact in bf16 inputs with fp32 sums), where their output is bf16.
#include "quantized_suite.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "sparse_lt.hpp"
#include "nmkit/error.hpp"
#include "nmkit/format/nm.hpp"
#include "nmkit/gpu/detail/nm24_8bit_spmm.hpp"
#include "nmkit/gpu/detail/quantize_tokens.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace nmkit::bench {
namespace {

using gpu::detail::DeviceNm24x8;
using gpu::detail::Nm24x8SpmmPlan;
using gpu::detail::QuantizedSpmmDesc;
using json = nlohmann::json;

cudaDataType cuda_code_type(QuantType type) {
  switch (type) {
    case QuantType::e4m3:
      return CUDA_R_8F_E4M3;
    case QuantType::e5m2:
      return CUDA_R_8F_E5M2;
    case QuantType::int8:
      return CUDA_R_8I;
  }
  return CUDA_R_8I;
}

// Dense 8-bit D = W x^T with cuBLASLt, both operands K-major (TN, the layout 8-bit tensor cores take). fp8: bf16 D,
// unit per-tensor scales and fast accumulation (the sum kept in the tensor cores over the whole K, as nmkit's is);
// int8: exact int32 sums and D (the one output type of its integer path here; twice nmkit's output bytes).
class QuantizedGemm {
 public:
  QuantizedGemm(cublasLtHandle_t lt, const Shape& s, QuantType type, void* workspace, std::size_t workspace_bytes)
      : lt_(lt), integer_(type == QuantType::int8), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_, integer_ ? CUBLAS_COMPUTE_32I : CUBLAS_COMPUTE_32F,
                                          integer_ ? CUDA_R_32I : CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
    if (!integer_) {
      const float one = 1.0f;
      NMKIT_CUDA_CHECK(cudaMemcpy(unit_scale_.ptr, &one, sizeof one, cudaMemcpyHostToDevice));
      const void* scale = unit_scale_.ptr;
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale, sizeof scale));
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale, sizeof scale));
      const int8_t fast_accumulation = 1;
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accumulation,
                                                  sizeof fast_accumulation));
    }
    const cudaDataType codes = cuda_code_type(type), out = integer_ ? CUDA_R_32I : CUDA_R_16BF;
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a_, codes, s.k, s.r, s.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b_, codes, s.k, s.c, s.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d_, out, s.r, s.c, s.r));
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                      sizeof workspace_bytes_));
    heuristics_.resize(kCandidates);
    int found = 0;
    CHECK_CUBLAS(
        cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, d_, d_, pref, kCandidates, heuristics_.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0)
      throw Error(ErrorCode::cuda_error, std::string("cuBLASLt found no ") + quant_type_name(type) + " algorithm");
    heuristics_.resize(found);
  }
  QuantizedGemm(const QuantizedGemm&) = delete;
  QuantizedGemm& operator=(const QuantizedGemm&) = delete;
  ~QuantizedGemm() {
    cublasLtMatrixLayoutDestroy(a_), cublasLtMatrixLayoutDestroy(b_), cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(desc_);
  }
  int algorithms() const { return static_cast<int>(heuristics_.size()); }
  void select(int i) { chosen_ = i; }
  void run(const void* w, const void* x, void* d, cudaStream_t s) const {
    const float alpha = 1.0f, beta = 0.0f;
    const int32_t alpha_i = 1, beta_i = 0;
    const void* a = integer_ ? static_cast<const void*>(&alpha_i) : &alpha;
    const void* b = integer_ ? static_cast<const void*>(&beta_i) : &beta;
    CHECK_CUBLAS(cublasLtMatmul(lt_, desc_, a, w, a_, x, b_, b, d, d_, d, d_, &heuristics_[chosen_].algo, workspace_,
                                workspace_bytes_, s));
  }

 private:
  static constexpr int kCandidates = 8;
  cublasLtHandle_t lt_;
  bool integer_;
  void* workspace_;
  std::size_t workspace_bytes_;
  DeviceArray unit_scale_{sizeof(float)};
  cublasLtMatmulDesc_t desc_{};
  cublasLtMatrixLayout_t a_{}, b_{}, d_{};
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics_;
  int chosen_ = 0;
};

DeviceArray upload(const void* host, std::size_t bytes) {
  DeviceArray d(bytes);
  NMKIT_CUDA_CHECK(cudaMemcpy(d.ptr, host, bytes, cudaMemcpyHostToDevice));
  return d;
}
DeviceArray upload(const DenseMatrix& m) { return upload(m.values.data(), m.storage_bytes()); }

std::vector<float> random_values(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> magnitude(0.125f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = (rng() & 1) ? magnitude(rng) : -magnitude(rng);
  return v;
}

// Codes as the bf16 values they stand for, unscaled (exact: e4m3, e5m2 and int8 values all fit bf16's 8 bits).
DenseMatrix codes_as_bf16(const uint8_t* codes, QuantType type, int64_t rows, int64_t cols) {
  std::vector<float> v(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = code_value(type, codes[i]);
  return DenseMatrix::from_float(rows, cols, v, DType::bf16);
}

// One weight (R x K) and what every library needs of it.
struct WeightOperands {
  QuantizedNmMatrix quantized;
  gpu::PackedNm24x8 packed;
  std::vector<uint8_t> dense_codes;  // R x K row-major, pruned entries code 0
  DenseMatrix codes_bf16, dequantized_bf16;
};

WeightOperands make_weight(int64_t r, int64_t k, QuantType type, uint32_t seed) {
  const DenseMatrix w = DenseMatrix::from_float(r, k, random_values(r * k, seed), DType::f32);
  WeightOperands out;
  out.quantized = quantize_nm(compress_nm(w, prune_nm_magnitude(w, 2, 4), 2, 4), type);
  out.packed = gpu::pack_nm24(out.quantized);
  const QuantizedNmMatrix& q = out.quantized;
  out.dense_codes.assign(static_cast<std::size_t>(r * k), 0);
  for (int64_t row = 0; row < r; ++row)
    for (int64_t g = 0; g < q.groups(); ++g)
      for (int slot = 0; slot < q.n; ++slot) {
        const int64_t col = q.column_of(row, g, slot);
        if (col < k) out.dense_codes[row * k + col] = q.values.codes[(row * q.groups() + g) * q.n + slot];
      }
  out.codes_bf16 = codes_as_bf16(out.dense_codes.data(), type, r, k);
  const std::vector<float> dequantized = decompress(q).to_float();
  out.dequantized_bf16 = DenseMatrix::from_float(r, k, dequantized, DType::bf16);
  return out;
}

std::string ratio_text(std::optional<double> num, std::optional<double> den) {
  if (!num || !den) return "-";
  char text[16];
  std::snprintf(text, sizeof text, "%.2fx", *num / *den);
  return text;
}

}  // namespace

std::vector<Shape> quantized_suite_shapes() {
  std::vector<Shape> shapes;
  for (auto [r, k] : {std::pair<int64_t, int64_t>{11008, 4096}, {4096, 11008}, {28672, 8192}, {8192, 8192}})
    for (int64_t t : {128, 512, 2048, 4096}) shapes.push_back({r, k, t, "8bit"});
  return shapes;
}

void run_quantized_suite(const QuantizedSuiteOptions& o, cublasLtHandle_t lt, void* workspace,
                         std::size_t workspace_bytes, std::size_t l2_bytes, cudaStream_t stream, json& rows,
                         const RowDone& row_done) {
#if defined(NMKIT_HAVE_CUSPARSELT)
  cusparseLtHandle_t sparse_handle;
  const bool have_lt = o.cusparselt && cusparseLtInit(&sparse_handle) == CUSPARSE_STATUS_SUCCESS;
#endif
  std::printf("%-5s %-20s %-5s %10s %10s %8s %10s %8s %9s %8s %8s %9s  %s\n", "suite", "R x K x T", "type", "cuBLASLt",
              "cuSPLt", "vs cuBL", "nmkit", "vs cuBL", "vs cuSPLt", "+quant", "vs cuBL", "rel.err", "nmkit kernel");
  std::printf("(dense-counted T(FL)OP/s; +quant: nmkit with x quantized from bf16 in the same launch sequence)\n");
  uint32_t seed = 1;
  for (QuantType type : o.types) {
    require(type == QuantType::e4m3 || type == QuantType::int8, ErrorCode::invalid_argument,
            std::string("the 8bit suite runs e4m3 and int8 (cuBLASLt has no e5m2 x e5m2 product), not ") +
                quant_type_name(type));
    std::map<std::pair<int64_t, int64_t>, std::unique_ptr<WeightOperands>> weights;
    for (const Shape& s : o.shapes) {
      auto& weight = weights[{s.r, s.k}];
      if (!weight) weight = std::make_unique<WeightOperands>(make_weight(s.r, s.k, type, seed += 17));
      const WeightOperands& w = *weight;
      // x: bf16-exact values, so that the GPU's quantize_tokens of the bf16 copy gives the host's codes bit for bit.
      const DenseMatrix x_bf16 = DenseMatrix::from_float(s.c, s.k, random_values(s.c * s.k, seed += 17), DType::bf16);
      const QuantizedRows qx = quantize_rows(x_bf16.to_float(), s.c, s.k, type);
      const DenseMatrix x_codes_bf16 = codes_as_bf16(qx.values.codes.data(), type, s.c, s.k);
      const DenseMatrix x_dequantized_bf16 = DenseMatrix::from_float(s.c, s.k, dequantize(qx), DType::bf16);

      // Enough operand sets that a round's working set exceeds 3x L2, as the other suites' do (at most 8).
      const std::size_t set_bytes = w.packed.values.size() * 4 + w.dense_codes.size() + qx.values.codes.size() * 3;
      const int sets = std::clamp(static_cast<int>(3 * l2_bytes / std::max<std::size_t>(set_bytes, 1)) + 1, 1, 8);
      std::vector<DeviceNm24x8> w_nmkit;
      std::vector<DeviceArray> w_dense, x_codes, x_scales, x_in;
      for (int i = 0; i < sets; ++i) {
        w_nmkit.push_back(DeviceNm24x8::upload(w.packed));
        w_dense.push_back(upload(w.dense_codes.data(), w.dense_codes.size()));
        x_codes.push_back(upload(qx.values.codes.data(), qx.values.codes.size()));
        x_scales.push_back(upload(qx.scales.data(), qx.scales.size() * sizeof(float)));
        x_in.push_back(upload(x_bf16));
      }
      const std::size_t out_count = static_cast<std::size_t>(s.r * s.c);
      DeviceArray d_nmkit(out_count * 2), d_quant(out_count * 2), d_cublas(out_count * 4), d_sparse(out_count * 2);
      DeviceArray codes_scratch(qx.values.codes.size()), scales_scratch(qx.scales.size() * sizeof(float));

      // References: the dequantized product (for nmkit) and the codes' product (for the baselines), both bf16.
      DeviceArray ref_scaled(out_count * 2), ref_codes(out_count * 2);
      {
        DenseGemm reference(lt, s, DType::bf16, workspace, workspace_bytes);
        const DeviceArray wd = upload(w.dequantized_bf16), xd = upload(x_dequantized_bf16);
        const DeviceArray wc = upload(w.codes_bf16), xc = upload(x_codes_bf16);
        reference.run(wd.ptr, xd.ptr, ref_scaled.ptr, stream);
        reference.run(wc.ptr, xc.ptr, ref_codes.ptr, stream);
        NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
      }

      const QuantizedSpmmDesc desc{s.r, s.k, s.c, type, DType::bf16};
      const Nm24x8SpmmPlan plan = Nm24x8SpmmPlan::create(desc);
      const auto nmkit = [&](int i) {
        plan.run(stream, w_nmkit[i], static_cast<const uint8_t*>(x_codes[i].ptr),
                 static_cast<const float*>(x_scales[i].ptr), nullptr, d_nmkit.ptr);
      };
      const auto nmkit_quantize = [&](int i) {
        gpu::detail::quantize_tokens(stream, x_in[i].ptr, DType::bf16, s.c, s.k, type,
                                     static_cast<uint8_t*>(codes_scratch.ptr), static_cast<float*>(scales_scratch.ptr));
        plan.run(stream, w_nmkit[i], static_cast<const uint8_t*>(codes_scratch.ptr),
                 static_cast<const float*>(scales_scratch.ptr), nullptr, d_quant.ptr);
      };
      const double err = check_output(nmkit, d_nmkit.ptr, ref_scaled.ptr, s.r * s.c, DType::bf16, stream);
      const double quant_err =
          check_output(nmkit_quantize, d_quant.ptr, ref_scaled.ptr, s.r * s.c, DType::bf16, stream);
      std::vector<std::function<void(int)>> launches{nmkit, nmkit_quantize};
      std::optional<std::size_t> cublas_index, sparse_index, variant_index;

      // --variant: the same product planned with other options (a tile or schedule experiment), same rounds.
      std::optional<Nm24x8SpmmPlan> variant;
      std::optional<double> variant_err;
      std::optional<DeviceArray> d_variant;
      if (o.variant) {
        d_variant.emplace(out_count * 2);
        variant = Nm24x8SpmmPlan::create(desc, *o.variant);
        const auto variant_launch = [&](int i) {
          variant->run(stream, w_nmkit[i], static_cast<const uint8_t*>(x_codes[i].ptr),
                       static_cast<const float*>(x_scales[i].ptr), nullptr, d_variant->ptr);
        };
        variant_err = check_output(variant_launch, d_variant->ptr, ref_scaled.ptr, s.r * s.c, DType::bf16, stream);
        variant_index = launches.size();
        launches.push_back(variant_launch);
      }

      // A baseline that cannot be set up (or, for fp8 and the 2:4 library, gives a wrong product) is named, not
      // timed; the rest of the row still runs.
      std::optional<QuantizedGemm> dense;
      std::optional<double> cublas_err;
      std::string notes;
      try {
        dense.emplace(lt, s, type, workspace, workspace_bytes);
        const auto cublas = [&](int i) { dense->run(w_dense[i].ptr, x_codes[i].ptr, d_cublas.ptr, stream); };
        choose_fastest_algorithm(*dense, cublas, sets, stream);
        // fp8's D is bf16, checked against the codes' product; int8's is the exact int32 sums, not compared.
        if (type != QuantType::int8)
          cublas_err = check_output(cublas, d_cublas.ptr, ref_codes.ptr, s.r * s.c, DType::bf16, stream);
        if (!cublas_err || *cublas_err < kBaselineTolerance) {
          cublas_index = launches.size();
          launches.push_back(cublas);
        } else {
          notes += "cuBLASLt output wrong (rel. error " + std::to_string(*cublas_err) + "), not timed. ";
        }
      } catch (const Error& e) {
        notes += std::string("cuBLASLt: ") + e.what() + ". ";
      }
      std::optional<double> sparse_err;
#if defined(NMKIT_HAVE_CUSPARSELT)
      std::optional<SparseLt> sparse;
      if (have_lt) {
        try {
          std::vector<const void*> dense_w;
          for (const DeviceArray& a : w_dense) dense_w.push_back(a.ptr);
          sparse.emplace(&sparse_handle, s,
                         SparseLtTypes{cuda_code_type(type), CUDA_R_16BF,
                                       type == QuantType::int8 ? CUSPARSE_COMPUTE_32I : CUSPARSE_COMPUTE_32F},
                         dense_w, stream);
          sparse->search(x_codes[0].ptr, d_sparse.ptr);
          const auto cusparselt = [&](int i) { sparse->run(i, x_codes[i].ptr, d_sparse.ptr); };
          sparse_err = check_output(cusparselt, d_sparse.ptr, ref_codes.ptr, s.r * s.c, DType::bf16, stream);
          if (*sparse_err < kBaselineTolerance) {
            sparse_index = launches.size();
            launches.push_back(cusparselt);
          } else {
            notes += "cuSPARSELt output wrong (rel. error " + std::to_string(*sparse_err) + "), not timed. ";
          }
        } catch (const Error& e) {
          sparse.reset();
          notes += std::string("cuSPARSELt: ") + e.what() + ". ";
        }
      }
#endif
      const std::vector<double> ms =
          time_interleaved_ms(launches, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream);
      const double nmkit_ms = ms[0], quant_ms = ms[1];
      const auto ms_of = [&](std::optional<std::size_t> i) { return i ? std::optional<double>(ms[*i]) : std::nullopt; };
      const std::optional<double> cublas_ms = ms_of(cublas_index), sparse_ms = ms_of(sparse_index);
      const double flop = 2.0 * s.r * s.k * s.c;
      const auto rate = [&](double t) { return flop / (t * 1e-3) / 1e12; };
      std::ostringstream kernel;
      kernel << plan.config();
      char shape_text[64];
      std::snprintf(shape_text, sizeof shape_text, "%ldx%ldx%ld", s.r, s.k, s.c);
      const auto rate_text = [&](std::optional<double> t) {
        return t ? std::to_string(rate(*t)).substr(0, 6) : std::string("-");
      };
      std::printf("%-5s %-20s %-5s %10s %10s %8s %10.1f %8s %9s %8.1f %8s %9.1e  %s\n", s.suite.c_str(), shape_text,
                  quant_type_name(type), rate_text(cublas_ms).c_str(), rate_text(sparse_ms).c_str(),
                  ratio_text(cublas_ms, sparse_ms).c_str(), rate(nmkit_ms), ratio_text(cublas_ms, nmkit_ms).c_str(),
                  ratio_text(sparse_ms, nmkit_ms).c_str(), rate(quant_ms), ratio_text(cublas_ms, quant_ms).c_str(), err,
                  kernel.str().c_str());
      if (variant_index)
        std::printf("      variant (%s): %.1f TFLOP/s, %.3fx nmkit's time, rel. error %.1e, %s\n",
                    o.variant_text.c_str(), rate(ms[*variant_index]), ms[*variant_index] / nmkit_ms, *variant_err,
                    (std::ostringstream() << variant->config()).str().c_str());
      if (!notes.empty()) std::printf("      %s\n", notes.c_str());
      std::fflush(stdout);  // each row as it is measured, also when a time limit stops the run
      const auto number_or_null = [](std::optional<double> v) { return v && std::isfinite(*v) ? json(*v) : json(); };
      rows.push_back({{"suite", s.suite},
                      {"r", s.r},
                      {"k", s.k},
                      {"c", s.c},
                      {"type", quant_type_name(type)},
                      {"sets", sets},
                      {"cublaslt_ms", number_or_null(cublas_ms)},
                      {"cublaslt_rel_error", number_or_null(cublas_err)},
                      {"cusparselt_ms", number_or_null(sparse_ms)},
                      {"cusparselt_rel_error", number_or_null(sparse_err)},
                      {"notes", notes},
                      {"nmkit_ms", nmkit_ms},
                      {"nmkit_quantize_ms", quant_ms},
                      {"nmkit_rel_error", number_or_null(err)},
                      {"nmkit_quantize_rel_error", number_or_null(quant_err)},
                      {"nmkit_kernel", kernel.str()}});
      if (variant_index)
        rows.back()["variant"] = o.variant_text, rows.back()["variant_ms"] = ms[*variant_index],
        rows.back()["variant_rel_error"] = number_or_null(variant_err);
      row_done();
    }
  }
#if defined(NMKIT_HAVE_CUSPARSELT)
  if (have_lt) cusparseLtDestroy(&sparse_handle);
#endif
}

}  // namespace nmkit::bench
