// The vnm suite: for every (dtype, shape, V, M, B layout), side by side in one process: dense cuBLASLt (best
// of its heuristic algorithms, once per shape), nmkit's V:N:M SpMM, and the fixed-index ablation (the seed's
// "ideal": the same condensed 2:4 product with B's selected rows already contiguous, run by the nm24 kernel).
// The gap between the last two is what gathering B costs. Weights are random in the packed layout (on the
// device), with random column choices; every row is checked against cuBLAS on the expanded weight.
#include "vnm_suite.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"

namespace nmkit::bench {
namespace {

constexpr int kSelected = 4;

// A random gather table: per V-row block and group, 4 ascending columns of M (kNoBRow past K). Tables are
// kept per min(V, 128) rows, so a V >= 128 block repeats its entries in each of its 128-row tiles.
std::vector<int32_t> random_gather(const gpu::DeviceNm24& condensed, int64_t cols, int v, int m, uint32_t seed,
                                   bool shared_columns) {
  const int table_rows = std::min(v, gpu::kPackRowAlign);
  const int64_t blocks = condensed.rows_padded() / table_rows, stride = condensed.cols_padded();
  const int64_t groups = condensed.cols() / kSelected;
  std::vector<int32_t> table(static_cast<std::size_t>(blocks * stride), gpu::kNoBRow);
  std::mt19937 rng(seed);
  std::vector<int> columns(static_cast<std::size_t>(m));
  std::vector<int32_t> block_entries(static_cast<std::size_t>(groups * kSelected));
  for (int64_t tb = 0; tb < blocks; ++tb) {
    if (shared_columns ? tb == 0 : (tb * table_rows) % v == 0) {  // a new V-block: draw its columns
      for (int64_t g = 0; g < groups; ++g) {
        std::iota(columns.begin(), columns.end(), 0);
        std::shuffle(columns.begin(), columns.end(), rng);
        std::sort(columns.begin(), columns.begin() + kSelected);
        for (int s = 0; s < kSelected; ++s) {
          const int64_t k = g * m + columns[static_cast<std::size_t>(s)];
          block_entries[static_cast<std::size_t>(g * kSelected + s)] =
              k < cols ? static_cast<int32_t>(k) : gpu::kNoBRow;
        }
      }
    }
    std::copy(block_entries.begin(), block_entries.end(), table.begin() + tb * stride);
  }
  return table;
}

}  // namespace

double run_vnm_suite(const VnmSuiteOptions& o, cublasLtHandle_t lt, void* workspace, std::size_t workspace_bytes,
                     std::size_t l2_bytes, cudaStream_t stream, nlohmann::json& rows, const RowDone& row_done) {
  if (o.shared_columns) std::printf("\nevery V-block selects the same columns (--vnm-shared-columns)\n");
  std::printf("\n%-7s %-20s %-5s %-9s %-4s %9s %9s %8s %9s %8s %9s %9s  %s\n", "suite", "R x K x C", "dtype", "V:N:M",
              "B", "cuBLAS", "nmkit", "vs cuBL", "ideal", "vs cuBL", "full 2:4", "rel.err",
              "condensed kernel (gather cost vs ideal)");
  for (DType dtype : o.dtypes)
    for (const Shape& s : o.shapes) {
      const std::size_t b_bytes = s.k * s.c * 2, d_bytes = s.r * s.c * 2, w_bytes = s.r * s.k * 2;
      const int sets =
          static_cast<int>(std::clamp<std::size_t>(3 * l2_bytes / (w_bytes / 4 + b_bytes + d_bytes) + 1, 1, 8));
      std::vector<DeviceArray> b, b_ideal, dense_w, d_dense, d_nmkit;
      for (int i = 0; i < sets; ++i) {
        b.emplace_back(b_bytes), dense_w.emplace_back(w_bytes), d_dense.emplace_back(d_bytes),
            d_nmkit.emplace_back(d_bytes);
        fill_dense(b[i].ptr, s.k * s.c, dtype, 99 + i, stream);
      }
      DenseGemm dense(lt, s, dtype, workspace, workspace_bytes);
      bool dense_chosen = false;  // cuBLAS's algorithm is chosen once per shape, and timed beside every row
      // The full_2_4 form (M % 4 == 0): the nm24 product over all of K, whatever V and M; timed once per layout.
      std::map<Layout, double> full_ms;
      {
        std::vector<gpu::DeviceNm24> full;
        for (int i = 0; i < sets; ++i) {
          full.push_back(gpu::DeviceNm24::allocate(s.r, s.k, dtype));
          fill_packed(full[i].values(), full[i].metadata(), s.r, s.k, full[i].rows_padded(), full[i].cols_padded(),
                      dtype, 4321 + i, stream);
        }
        for (Layout b_layout : o.b_layouts) {
          std::vector<DeviceArray> b_run;
          if (b_layout == Layout::row_major)
            for (int i = 0; i < sets; ++i)
              b_run.emplace_back(b_bytes), transpose(b[i].ptr, b_run[i].ptr, s.k, s.c, stream);
          gpu::SpmmDesc desc{s.r, s.k, s.c, dtype, dtype};
          desc.b_layout = b_layout;
          const gpu::Nm24SpmmPlan plan = gpu::Nm24SpmmPlan::create(desc);
          full_ms[b_layout] = time_median_ms(
              [&](int i) {
                plan.run(stream, full[i], b_layout == Layout::row_major ? b_run[i].ptr : b[i].ptr, nullptr,
                         d_nmkit[i].ptr);
              },
              sets, o.warmup, o.iters, stream);
        }
      }

      for (int v : o.vs)
        for (int m : o.ms) {
          const int64_t condensed_cols = kSelected * ceil_div(s.k, int64_t{m});
          std::vector<gpu::DeviceVnm> weights;
          std::vector<gpu::DeviceNm24> ideal_weights;
          std::vector<int32_t> table;
          for (int i = 0; i < sets; ++i) {
            gpu::DeviceNm24 condensed = gpu::DeviceNm24::allocate(s.r, condensed_cols, dtype);
            fill_packed(condensed.values(), condensed.metadata(), s.r, condensed_cols, condensed.rows_padded(),
                        condensed.cols_padded(), dtype, 1234 + i + 17 * m, stream);
            if (i == 0) table = random_gather(condensed, s.k, v, m, static_cast<uint32_t>(7 * v + m), o.shared_columns);
            // The dense weight of the same product for cuBLAS, and a copy of the condensed one for the ablation.
            DeviceArray condensed_dense(static_cast<std::size_t>(s.r * condensed_cols) * 2);
            NMKIT_CUDA_CHECK(
                cudaMemsetAsync(condensed_dense.ptr, 0, static_cast<std::size_t>(s.r * condensed_cols) * 2, stream));
            expand_packed(condensed.values(), condensed.metadata(), condensed_dense.ptr, s.r, condensed_cols,
                          condensed.rows_padded(), condensed.cols_padded(), dtype, stream);
            gpu::DeviceNm24 ideal = gpu::DeviceNm24::allocate(s.r, condensed.cols_padded(), dtype);
            NMKIT_CUDA_CHECK(cudaMemcpyAsync(ideal.values(), condensed.values(), condensed.value_bytes(),
                                             cudaMemcpyDeviceToDevice, stream));
            NMKIT_CUDA_CHECK(cudaMemcpyAsync(ideal.metadata(), condensed.metadata(), condensed.metadata_bytes(),
                                             cudaMemcpyDeviceToDevice, stream));
            weights.push_back(gpu::DeviceVnm::from_parts(std::move(condensed), table, s.k, v, m));
            NMKIT_CUDA_CHECK(cudaMemsetAsync(dense_w[i].ptr, 0, w_bytes, stream));
            scatter_columns(condensed_dense.ptr, weights[i].gather(), dense_w[i].ptr, s.r, s.k, condensed_cols,
                            weights[i].gather_stride(), std::min(v, gpu::kPackRowAlign), stream);
            ideal_weights.push_back(std::move(ideal));
            NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // condensed_dense is freed at the end of the iteration
          }
          const auto dense_launch = [&](int i) { dense.run(dense_w[i].ptr, b[i].ptr, d_dense[i].ptr, stream); };
          if (!dense_chosen) dense.choose_fastest(dense_launch, sets, stream), dense_chosen = true;
          // The ablation's operand: the first row block's B rows, contiguous (col-major K' x C).
          // Its K is the condensed width padded to the packing's 64 (zero rows of B there), so that the ablation
          // runs the same sm90 kernel for every M (an unpadded K' = 4 * ceil(K / M) need not be a multiple of 8).
          const int64_t ideal_k = weights[0].gather_stride();
          b_ideal.clear();
          for (int i = 0; i < sets; ++i) {
            b_ideal.emplace_back(static_cast<std::size_t>(ideal_k * s.c) * 2);
            gather_b_rows(b[i].ptr, weights[0].gather(), b_ideal[i].ptr, s.k, s.c, ideal_k, stream);
          }
          const gpu::Nm24SpmmPlan ideal_plan = gpu::Nm24SpmmPlan::create({s.r, ideal_k, s.c, dtype, dtype});
          const double ideal_ms = time_median_ms(
              [&](int i) { ideal_plan.run(stream, ideal_weights[i], b_ideal[i].ptr, nullptr, d_nmkit[i].ptr); }, sets,
              o.warmup, o.iters, stream);

          for (Layout b_layout : o.b_layouts) {
            // Row-major B holds the same logical matrix: transpose the col-major sets once.
            std::vector<DeviceArray> b_run;
            if (b_layout == Layout::row_major)
              for (int i = 0; i < sets; ++i) {
                b_run.emplace_back(b_bytes);
                transpose(b[i].ptr, b_run[i].ptr, s.k, s.c, stream);
              }
            auto b_of = [&](int i) { return b_layout == Layout::row_major ? b_run[i].ptr : b[i].ptr; };
            gpu::SpmmDesc desc{s.r, s.k, s.c, dtype, dtype};
            desc.b_layout = b_layout;
            const gpu::VnmSpmmPlan plan = gpu::VnmSpmmPlan::create(
                desc, v, m, {.kernel = gpu::Nm24Kernel::automatic, .block_n = o.block_n}, gpu::VnmForm::condensed);
            dense.run(dense_w[0].ptr, b[0].ptr, d_dense[0].ptr, stream);  // the reference of set 0 for this pattern
            const auto nmkit_launch = [&](int i) { plan.run(stream, weights[i], b_of(i), nullptr, d_nmkit[i].ptr); };
            const double err = check_output(nmkit_launch, d_nmkit[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
            std::vector<std::function<void(int)>> launches{nmkit_launch, dense_launch};
            // --vnm-kernel: the condensed form pinned to another kernel, timed in the same rounds.
            std::optional<gpu::VnmSpmmPlan> variant;
            double variant_err = 0.0;
            std::string variant_refused;  // a pin the plan does not take for this row (named, the row still runs)
            if (o.variant_kernel != gpu::Nm24Kernel::automatic) {
              try {
                variant = gpu::VnmSpmmPlan::create(desc, v, m, {.kernel = o.variant_kernel}, gpu::VnmForm::condensed);
              } catch (const Error& e) {
                variant_refused = e.what();
              }
            }
            if (variant) {
              const auto variant_launch = [&](int i) {
                variant->run(stream, weights[i], b_of(i), nullptr, d_nmkit[i].ptr);
              };
              variant_err = check_output(variant_launch, d_nmkit[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
              launches.push_back(variant_launch);
            }
            const std::vector<double> medians =
                time_interleaved_ms(launches, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream);
            const double nmkit_ms = medians[0], dense_ms = medians[1];

            const double tflops = 2.0 * s.r * s.k * s.c / (dense_ms * 1e-3) / 1e12;
            std::ostringstream config;
            config << plan.config();
            char shape_text[64], pattern[32];
            std::snprintf(shape_text, sizeof shape_text, "%ldx%ldx%ld", s.r, s.k, s.c);
            std::snprintf(pattern, sizeof pattern, "%d:2:%d", v, m);
            const bool col = b_layout == Layout::col_major;
            // The full_2_4 form's speed-up where M allows it (M % 4 == 0).
            char full_text[32] = "-";
            if (m % 4 == 0) std::snprintf(full_text, sizeof full_text, "%.2fx", dense_ms / full_ms[b_layout]);
            std::printf("%-7s %-20s %-5s %-9s %-4s %9.1f %9.3f %7.2fx %9.3f %7.2fx %9s %9.1e  %s n%d (%+.0f%%)\n",
                        "vnm", shape_text, dtype_name(dtype), pattern, col ? "col" : "row", tflops, nmkit_ms,
                        dense_ms / nmkit_ms, ideal_ms, dense_ms / ideal_ms, full_text, err,
                        kernel_name(plan.config().kernel), plan.config().block_n, 100.0 * (nmkit_ms / ideal_ms - 1.0));
            if (!variant_refused.empty()) std::printf("        variant refused: %s\n", variant_refused.c_str());
            if (variant)
              std::printf("%-7s %-20s %-5s %-9s %-4s %9s %9.3f %7.2fx %9s %8s %9s %9.1e  variant %s n%d split %d\n", "",
                          "", "", "", "", "", medians[2], dense_ms / medians[2], "", "", "", variant_err,
                          kernel_name(variant->config().kernel), variant->config().block_n, variant->config().split);
            std::fflush(stdout);
            rows.push_back({{"suite", "vnm"},
                            {"r", s.r},
                            {"k", s.k},
                            {"c", s.c},
                            {"dtype", dtype_name(dtype)},
                            {"v", v},
                            {"n", 2},
                            {"m", m},
                            {"b_layout", layout_name(b_layout)},
                            {"operand_sets", sets},
                            {"shared_columns", o.shared_columns},
                            {"cublas_ms", dense_ms},
                            {"nmkit_ms", nmkit_ms},
                            {"ideal_ms", ideal_ms},
                            {"speedup_vs_cublas", dense_ms / nmkit_ms},
                            {"ideal_speedup_vs_cublas", dense_ms / ideal_ms},
                            {"gather_cost", nmkit_ms / ideal_ms - 1.0},
                            {"nmkit_rel_error", err},
                            {"nmkit_config", config.str()},
                            {"full_2_4_ms", full_ms[b_layout]},
                            {"full_2_4_speedup_vs_cublas", dense_ms / full_ms[b_layout]}});
            if (variant) {
              std::ostringstream variant_config;
              variant_config << variant->config();
              rows.back()["variant_ms"] = medians[2];
              rows.back()["variant_speedup_vs_cublas"] = dense_ms / medians[2];
              rows.back()["variant_rel_error"] = variant_err;
              rows.back()["variant_config"] = variant_config.str();
            }
            row_done();
          }
        }
    }
  // Host cost of one VnmSpmmPlan::run() (B row-major: the gathering sm90 kernel where available).
  gpu::DeviceNm24 condensed = gpu::DeviceNm24::allocate(128, 32, DType::f16);  // 128 x 64 at 128:2:8
  fill_packed(condensed.values(), condensed.metadata(), 128, 32, condensed.rows_padded(), condensed.cols_padded(),
              DType::f16, 5, stream);
  const std::vector<int32_t> table = random_gather(condensed, 64, 128, 8, 1, false);
  const gpu::DeviceVnm w = gpu::DeviceVnm::from_parts(std::move(condensed), table, 64, 128, 8);
  gpu::SpmmDesc tiny{128, 64, 16};
  tiny.b_layout = Layout::row_major;
  const gpu::VnmSpmmPlan plan =
      gpu::VnmSpmmPlan::create(tiny, 128, 8, {.kernel = gpu::Nm24Kernel::automatic}, gpu::VnmForm::condensed);
  DeviceArray b(64 * 16 * 2), d(128 * 16 * 2);
  fill_dense(b.ptr, 64 * 16, DType::f16, 8, stream);
  const double us = host_overhead_us([&] { plan.run(stream, w, b.ptr, nullptr, d.ptr); }, stream);
  std::printf("host overhead of VnmSpmmPlan::run(): %.2f us per call (%s)\n", us, kernel_name(plan.config().kernel));
  return us;
}

}  // namespace nmkit::bench
