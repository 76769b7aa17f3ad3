// The tile suite: for every (dtype, shape, tile side, density, distribution), side by side in one process:
// dense cuBLASLt on the expanded weight (the fastest of its heuristic algorithms, chosen once per shape and timed
// again at every row, right after nmkit), nmkit's tile SpMM, cuSPARSE BSR and (unless --no-tile-blocked-ell) cuSPARSE
// Blocked-ELL where the pattern allows. Weights are random packed tiles: `uniform` gives every tile row the same
// number of tiles, `skewed` draws the per-row counts from a geometric-like law (a few long rows, many short ones)
// with the same total. Every row is checked against cuBLAS.
#include "tile_suite.hpp"

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <string>

#include <cusparse.h>

#include "nmkit/dtype.hpp"
#include "blocked_ell.hpp"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/detail/tile_timeline.hpp"
#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::bench {
namespace {

#define CHECK_CUSPARSE(x) nmkit_bench_check_status(static_cast<int>(x), #x)

// A cuSPARSE SpMM baseline: one sparse descriptor of the weight (made by the derived class), B col-major K x C,
// D col-major R x C, fp32 compute; run() takes another operand set's B and D.
class CusparseSpmm {
 public:
  CusparseSpmm(const CusparseSpmm&) = delete;
  CusparseSpmm& operator=(const CusparseSpmm&) = delete;
  ~CusparseSpmm() {
    if (a_) cusparseDestroySpMat(a_);
    if (b_) cusparseDestroyDnMat(b_);
    if (d_) cusparseDestroyDnMat(d_);
  }
  void run(const void* b, void* d) {
    CHECK_CUSPARSE(cusparseDnMatSetValues(b_, const_cast<void*>(b)));
    CHECK_CUSPARSE(cusparseDnMatSetValues(d_, d));
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUSPARSE(cusparseSpMM(h_, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, a_, b_,
                                &beta, d_, CUDA_R_32F, alg_, buffer_.ptr));
  }

 protected:
  CusparseSpmm(cusparseHandle_t h, cusparseSpMMAlg_t alg) : h_(h), alg_(alg) {}
  // Once a_ is made: the dense operands' descriptors and the workspace.
  void describe_operands(const Shape& s, DType dtype, const void* b, void* d) {
    const cudaDataType type = cuda_type(dtype);
    CHECK_CUSPARSE(cusparseCreateDnMat(&b_, s.k, s.c, s.k, const_cast<void*>(b), type, CUSPARSE_ORDER_COL));
    CHECK_CUSPARSE(cusparseCreateDnMat(&d_, s.r, s.c, s.r, d, type, CUSPARSE_ORDER_COL));
    std::size_t bytes = 0;
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUSPARSE(cusparseSpMM_bufferSize(h_, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                           &alpha, a_, b_, &beta, d_, CUDA_R_32F, alg_, &bytes));
    buffer_ = DeviceArray(bytes);
  }
  cusparseSpMatDescr_t a_{};

 private:
  cusparseHandle_t h_;
  cusparseSpMMAlg_t alg_;
  cusparseDnMatDescr_t b_{}, d_{};
  DeviceArray buffer_;
};

// BSR (CUSPARSE_SPMM_BSR_ALG1) on nmkit's own packed arrays, which are BSR with row-major blocks: row_ptr,
// col_index, tiles. R and K whole tiles.
class CusparseBsr : public CusparseSpmm {
 public:
  CusparseBsr(cusparseHandle_t h, const gpu::DeviceTiles& a, int64_t grid_rows, int64_t grid_cols, int64_t nnz,
              const Shape& s, DType dtype, const void* b, void* d)
      : CusparseSpmm(h, CUSPARSE_SPMM_BSR_ALG1) {
    CHECK_CUSPARSE(cusparseCreateBsr(&a_, grid_rows, grid_cols, nnz, a.tile_rows(), a.tile_cols(),
                                     const_cast<int32_t*>(a.row_ptr()), const_cast<int32_t*>(a.col_index()),
                                     const_cast<void*>(a.data()), CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I,
                                     CUSPARSE_INDEX_BASE_ZERO, cuda_type(dtype), CUSPARSE_ORDER_ROW));
    describe_operands(s, dtype, b, d);
  }
};

// Blocked-ELL (CUSPARSE_SPMM_BLOCKED_ELL_ALG1, tensor cores) on the ELL form of the packed tiles (BlockedEll),
// where BlockedEll::applies.
class CusparseBlockedEll : public CusparseSpmm {
 public:
  CusparseBlockedEll(cusparseHandle_t h, const gpu::PackedTiles& p, const Shape& s, DType dtype, const void* b, void* d)
      : CusparseSpmm(h, CUSPARSE_SPMM_BLOCKED_ELL_ALG1) {
    const BlockedEll ell(p);
    columns_ = DeviceArray(ell.columns.size() * sizeof(int32_t));
    values_ = DeviceArray(ell.values.size() * sizeof(uint16_t));
    NMKIT_CUDA_CHECK(
        cudaMemcpy(columns_.ptr, ell.columns.data(), ell.columns.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    NMKIT_CUDA_CHECK(
        cudaMemcpy(values_.ptr, ell.values.data(), ell.values.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    CHECK_CUSPARSE(cusparseCreateBlockedEll(&a_, s.r, s.k, p.tile_rows, ell.width * p.tile_rows, columns_.ptr,
                                            values_.ptr, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO,
                                            cuda_type(dtype)));
    describe_operands(s, dtype, b, d);
  }

 private:
  DeviceArray columns_, values_;
};

gpu::PackedTiles random_tiles(int64_t rows, int64_t cols, int side, double density, bool skewed, DType dtype,
                              uint32_t seed) {
  gpu::PackedTiles p;
  p.rows = rows, p.cols = cols, p.tile_rows = side, p.tile_cols = side, p.dtype = dtype;
  const int64_t grid_rows = p.grid_rows(), grid_cols = p.grid_cols();
  const int64_t total = std::max<int64_t>(1, static_cast<int64_t>(density * grid_rows * grid_cols + 0.5));
  std::mt19937 rng(seed);
  std::vector<int64_t> counts(static_cast<std::size_t>(grid_rows), total / grid_rows);
  for (int64_t i = 0; i < total % grid_rows; ++i) ++counts[static_cast<std::size_t>(i)];
  if (skewed) {  // move tiles from random rows to a few heavy ones, keeping the total and the row capacity
    std::geometric_distribution<int64_t> heavy(0.3);
    for (int64_t moved = 0; moved < total / 2;) {
      const auto from = static_cast<std::size_t>(rng() % grid_rows);
      const auto to = static_cast<std::size_t>(std::min<int64_t>(heavy(rng), grid_rows - 1));
      if (counts[from] == 0 || counts[to] == grid_cols || from == to) {
        if (++moved > total) break;  // the heavy rows are full
        continue;
      }
      --counts[from], ++counts[to], ++moved;
    }
  }
  p.row_ptr.assign(static_cast<std::size_t>(grid_rows + 1), 0);
  std::vector<int32_t> columns(static_cast<std::size_t>(grid_cols));
  for (int64_t i = 0; i < grid_rows; ++i) {
    std::iota(columns.begin(), columns.end(), 0);
    std::shuffle(columns.begin(), columns.end(), rng);
    const auto count = static_cast<std::size_t>(counts[static_cast<std::size_t>(i)]);
    std::sort(columns.begin(), columns.begin() + static_cast<std::ptrdiff_t>(count));
    p.col_index.insert(p.col_index.end(), columns.begin(), columns.begin() + static_cast<std::ptrdiff_t>(count));
    p.row_ptr[static_cast<std::size_t>(i + 1)] = static_cast<int32_t>(p.col_index.size());
  }
  p.data.resize(p.col_index.size() * static_cast<std::size_t>(side) * side);
  std::uniform_real_distribution<float> value(0.125f, 1.0f);
  for (uint16_t& bits : p.data) {
    const float v = (rng() & 1) ? -value(rng) : value(rng);
    bits = dtype == DType::f16 ? Half::from_float(v).bits : BFloat16::from_float(v).bits;
  }
  return p;
}

// One traced run of `plan` (run_tile_plan_with_timeline), summarised from the CTAs' clock64 marks:
// the prologue until the first copies, the copies' latency (posted -> landed, which also counts how far ahead
// the producer runs), the consumer's time per step, and per work unit its main loop, its epilogue and the wait
// for the next unit's first data. Cycles become microseconds at the device's rated clock (an approximation).
void print_timeline(const gpu::TileSpmmPlan& plan, const gpu::DeviceTiles& a, const void* b, void* d,
                    cudaStream_t stream) {
  using T = gpu::TileTimeline;
  const gpu::SpmmDesc& desc = plan.desc();
  const int64_t units =
      ceil_div(desc.rows, int64_t{gpu::kTileBlockRows}) * ceil_div(desc.n, int64_t{plan.launch().block_n});
  const int64_t ctas = units * plan.launch().split;  // at least the grid
  DeviceArray buffer(ctas * T::kWords * sizeof(uint64_t));
  NMKIT_CUDA_CHECK(cudaMemsetAsync(buffer.ptr, 0, ctas * T::kWords * sizeof(uint64_t), stream));
  gpu::run_tile_plan_with_timeline(plan, stream, a, b, nullptr, d, nullptr, static_cast<uint64_t*>(buffer.ptr));
  std::vector<uint64_t> words(ctas * T::kWords);
  NMKIT_CUDA_CHECK(
      cudaMemcpyAsync(words.data(), buffer.ptr, words.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost, stream));
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  int clock_khz = 0, device = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
  const double us_per_cycle = 1e3 / clock_khz;

  const gpu::TileTimelineSummary t = gpu::summarize_tile_timeline(words, us_per_cycle);
  std::string cta0;  // the first CTA's steps, as they went
  if (const uint64_t* w = words.data(); w[T::kStart] != 0) {
    const double cta0_us_per_cycle = t.clock_ghz > 0 ? 1e-3 / t.clock_ghz : us_per_cycle;  // the mean measured clock
    const auto at = [&](int slot) {
      return (static_cast<double>(w[slot]) - static_cast<double>(w[T::kStart])) * cta0_us_per_cycle;
    };
    char text[64];
    for (int i = 0; i < std::min(T::kSteps, 24) && w[T::kArrived + i] != 0; ++i)
      std::snprintf(text, sizeof text, " %.1f/%.1f", at(T::kPosted + i), at(T::kArrived + i)), cta0 += text;
    cta0 += " | units done:";
    for (int u = 0; u < 8 && w[T::kUnitDone + u] != 0; ++u)
      std::snprintf(text, sizeof text, " %.1f", at(T::kUnitDone + u)), cta0 += text;
  }
  std::printf(
      "  timeline (us at the SMs' measured clock, %.2f GHz; nominal %.2f): CTA starts spread %.1f; per CTA %.1f "
      "units of %.1f steps; prologue to first copy %.2f; copy posted->landed %.2f; step %.2f; unit main loop "
      "%.2f, epilogue %.2f, wait for next unit's data %.2f\n",
      t.clock_ghz, 1e-3 / us_per_cycle, t.start_spread_us, t.units_per_cta, t.steps_per_unit, t.prologue_us,
      t.copy_latency_us, t.step_us, t.main_loop_us, t.epilogue_us, t.next_unit_wait_us);
  std::printf("  first CTA, posted/landed per step (us from its start):%s\n", cta0.c_str());
  if (t.end_last_us > 0)
    std::printf("  CTA ends (us after the first start): first %.1f, mean %.1f, last %.1f\n", t.end_first_us,
                t.end_mean_us, t.end_last_us);
  std::printf(
      "  epilogue (us): last wgmma done %.2f after the end-of-unit step; first part staged %.2f later; the rest %.2f\n",
      t.math_drain_us, t.first_part_us, t.other_parts_us);
  std::printf("  producer per step (us): copies issued %.3f after the post; next post %.3f after the copies\n",
              t.copy_issue_us, t.post_gap_us);
}

}  // namespace

namespace {

// --variant's launch options over the suite's own: block_n, split, persistent, stream_ctas and overlap_launch.
gpu::TileLaunch tile_variant_launch(const VariantSettings& settings, gpu::TileLaunch launch) {
  for (const auto& [key, value] : settings) {
    if (key == "block_n")
      launch.block_n = variant_int(key, value, 0, 256);
    else if (key == "split")
      launch.split = variant_int(key, value, 0, 8);
    else if (key == "persistent")
      launch.persistent = variant_flag(key, value);
    else if (key == "stream_ctas")
      launch.stream_ctas = variant_int(key, value, 0, 1 << 20);
    else if (key == "overlap_launch")
      launch.overlap_launch = variant_flag(key, value);
    else
      throw Error(
          ErrorCode::invalid_argument,
          "--variant for the tile suite takes block_n, split, persistent, stream_ctas and overlap_launch, got " + key +
              "=" + value);
  }
  return launch;
}

}  // namespace

double run_tile_suite(const TileSuiteOptions& o, cublasLtHandle_t lt, void* workspace, std::size_t workspace_bytes,
                      std::size_t l2_bytes, cudaStream_t stream, nlohmann::json& rows, const RowDone& row_done) {
  cusparseHandle_t sparse;
  CHECK_CUSPARSE(cusparseCreate(&sparse));
  CHECK_CUSPARSE(cusparseSetStream(sparse, stream));
  const auto kernel_named = [](const std::string& name, const char* option) {
    for (gpu::TileKernel k : {gpu::TileKernel::automatic, gpu::TileKernel::sm80_mma, gpu::TileKernel::sm90_wgmma,
                              gpu::TileKernel::stream_mma, gpu::TileKernel::warp_stream_mma})
      if (name == gpu::kernel_name(k)) return k;
    throw Error(ErrorCode::invalid_argument,
                std::string("tile suite: ") + option +
                    " takes automatic, sm80_mma, sm90_wgmma, stream_mma or warp_stream_mma, got " + name);
  };
  const gpu::TileKernel kernel = kernel_named(o.kernel, "--tile-kernel");
  const std::string variant_label = variant_text(o.variant);
  std::optional<gpu::TileKernel> compare;
  if (!o.compare_kernel.empty()) compare = kernel_named(o.compare_kernel, "--tile-compare");
  std::printf("\n%-5s %-18s %-5s %-7s %-7s %-7s %9s %9s %8s %10s %9s %9s  %s\n", "suite", "R x K x C", "dtype", "tile",
              "density", "rows", "cuBLAS", "nmkit ms", "vs cuBL", "cuSPARSE", "vs cuSP", "rel.err", "kernel");
  for (DType dtype : o.dtypes)
    for (const Shape& s : o.shapes) {
      const std::size_t b_bytes = s.k * s.c * 2, d_bytes = s.r * s.c * 2, w_bytes = s.r * s.k * 2;
      const int sets =
          static_cast<int>(std::clamp<std::size_t>(3 * l2_bytes / (w_bytes / 2 + b_bytes + d_bytes) + 1, 1, 8));
      std::vector<DeviceArray> b, dense_w, d_dense, d_nmkit;
      for (int i = 0; i < sets; ++i) {
        b.emplace_back(b_bytes), dense_w.emplace_back(w_bytes), d_dense.emplace_back(d_bytes),
            d_nmkit.emplace_back(d_bytes);
        fill_dense(b[i].ptr, s.k * s.c, dtype, 77 + i, stream);
      }
      DenseGemm dense(lt, s, dtype, workspace, workspace_bytes);
      bool dense_chosen = false;
      for (int side : o.tile_sides)
        for (double density : o.densities)
          for (bool skewed : {false, true}) {
            // One random pattern per row, copied into every operand set (the sets keep L2 honest, not the pattern).
            const gpu::PackedTiles packed = random_tiles(s.r, s.k, side, density, skewed, dtype, 1000u * side);
            std::vector<gpu::DeviceTiles> weights;
            for (int i = 0; i < sets; ++i) {
              weights.push_back(gpu::DeviceTiles::upload(packed));
              NMKIT_CUDA_CHECK(cudaMemsetAsync(dense_w[i].ptr, 0, w_bytes, stream));
              expand_tiles(weights[i].row_ptr(), weights[i].col_index(), weights[i].data(), dense_w[i].ptr, s.r, s.k,
                           side, side, static_cast<int64_t>(packed.col_index.size()), packed.grid_rows(), stream);
            }
            // cuBLAS's algorithm is chosen once per shape, and timed again at every row beside nmkit (below), so
            // that each ratio compares two timings of one moment.
            const auto dense_launch = [&](int i) { dense.run(dense_w[i].ptr, b[i].ptr, d_dense[i].ptr, stream); };
            if (!dense_chosen) dense.choose_fastest(dense_launch, sets, stream), dense_chosen = true;
            gpu::TileLaunch launch{o.block_n, o.split, o.persistent};  // each kernel takes its fields
            launch.stream_ctas = o.stream_ctas;
            const gpu::SpmmDesc desc{s.r, s.k, s.c, dtype, dtype};
            const gpu::TileSpmmPlan plan = gpu::TileSpmmPlan::create(desc, side, side, kernel, launch);
            dense.run(dense_w[0].ptr, b[0].ptr, d_dense[0].ptr, stream);  // the reference of set 0 for this pattern
            const auto nmkit_launch = [&](int i) { plan.run(stream, weights[i], b[i].ptr, nullptr, d_nmkit[i].ptr); };
            const double err = check_output(nmkit_launch, d_nmkit[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
            std::vector<std::function<void(int)>> launches{nmkit_launch, dense_launch};
            // The compared kernel, where it differs from the plan's own: checked, then timed in the same rounds.
            std::optional<gpu::TileSpmmPlan> variant;
            double variant_err = 0;
            const gpu::TileKernel kernel_run = plan.kernel_for(weights[0]);  // what run() launches for this weight
            const bool compared = compare && *compare != kernel_run;
            if (compared || (!compare && !o.variant.empty())) {
              variant = compared ? gpu::TileSpmmPlan::create(desc, side, side, *compare, launch)
                                 : gpu::TileSpmmPlan::create(desc, side, side, kernel,
                                                             tile_variant_launch(o.variant, launch));
              const auto variant_launch = [&](int i) {
                variant->run(stream, weights[i], b[i].ptr, nullptr, d_nmkit[i].ptr);
              };
              variant_err = check_output(variant_launch, d_nmkit[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
              launches.push_back(variant_launch);
            }
            const std::vector<double> medians =
                time_interleaved_ms(launches, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream);
            const double nmkit_ms = medians[0], dense_ms = medians[1];
            // Chains of dependent products: what a stack of layers sees, where a launch may overlap the one before.
            std::optional<std::array<double, 3>> chain_ms;  // per product: nmkit overlapped, nmkit not, cuBLAS
            if (o.chain > 0 && s.r == s.k) {
              DeviceArray ping(d_bytes), pong(d_bytes);
              gpu::TileLaunch plain_launch = launch;
              plain_launch.overlap_launch = false;
              const gpu::TileSpmmPlan plain = gpu::TileSpmmPlan::create(desc, side, side, kernel, plain_launch);
              const auto chained = [&](auto product) {
                return [&, product](int i) {
                  const void* in = b[i].ptr;
                  for (int l = 0; l < o.chain; ++l) {
                    void* out = l % 2 ? pong.ptr : ping.ptr;
                    product(i, in, out);
                    in = out;
                  }
                };
              };
              const std::vector<std::function<void(int)>> chains{
                  chained([&](int i, const void* in, void* out) { plan.run(stream, weights[i], in, nullptr, out); }),
                  chained([&](int i, const void* in, void* out) { plain.run(stream, weights[i], in, nullptr, out); }),
                  chained([&](int i, const void* in, void* out) { dense.run(dense_w[i].ptr, in, out, stream); })};
              const std::vector<double> m =
                  time_interleaved_ms(chains, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream);
              chain_ms = {m[0] / o.chain, m[1] / o.chain, m[2] / o.chain};
            }
            if (o.timeline && kernel_run == gpu::TileKernel::sm90_wgmma && dtype == DType::f16) {
              plan.run(stream, weights[1 % sets], b[1 % sets].ptr, nullptr, d_nmkit[1 % sets].ptr);
              print_timeline(plan, weights[0], b[0].ptr, d_nmkit[0].ptr, stream);
            }
            // The cuSPARSE baselines on the same pattern, each checked against cuBLAS too and reported as skipped where
            // it refuses. B and D rotate through the operand sets; the weight stays set 0's (if anything, this
            // flatters cuSPARSE).
            const auto time_baseline = [&](const char* name, const auto& make) -> std::optional<Measured> {
              try {
                auto baseline = make();
                return time_and_check([&](int i) { baseline.run(b[i].ptr, d_nmkit[i].ptr); }, sets, o.warmup, o.iters,
                                      d_nmkit[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
              } catch (const Error& e) {
                std::fprintf(stderr, "%s skipped: %s\n", name, e.what());
                cudaGetLastError();
                return std::nullopt;
              }
            };
            const std::optional<Measured> bsr = time_baseline("cuSPARSE BSR", [&] {
              require(s.r % side == 0 && s.k % side == 0, ErrorCode::unsupported,
                      "R and K must be whole tiles for BSR");
              return CusparseBsr(sparse, weights[0], packed.grid_rows(), packed.grid_cols(), packed.nnz_tiles(), s,
                                 dtype, b[0].ptr, d_nmkit[0].ptr);
            });
            std::optional<Measured> ell;  // Blocked-ELL (tensor cores), where the tile rows are even enough
            if (o.blocked_ell && BlockedEll::applies(packed))
              ell = time_baseline("cuSPARSE Blocked-ELL", [&] {
                return CusparseBlockedEll(sparse, packed, s, dtype, b[0].ptr, d_nmkit[0].ptr);
              });
            char shape_text[64], tile_text[16];
            std::snprintf(shape_text, sizeof shape_text, "%ldx%ldx%ld", s.r, s.k, s.c);
            std::snprintf(tile_text, sizeof tile_text, "%dx%d", side, side);
            char bsr_text[32] = "-", bsr_ratio[32] = "-";
            if (bsr) {
              std::snprintf(bsr_text, sizeof bsr_text, "%.3f", bsr->ms);
              std::snprintf(bsr_ratio, sizeof bsr_ratio, "%.2fx", bsr->ms / nmkit_ms);
            }
            char kernel_text[64];
            if (kernel_run == gpu::TileKernel::sm90_wgmma)
              std::snprintf(kernel_text, sizeof kernel_text, "%s n%d split %d%s%s", gpu::kernel_name(kernel_run),
                            plan.launch().block_n, plan.launch().split, plan.launch().persistent ? " persistent" : "",
                            tile_plan_defers_store(plan) ? " deferred" : "");
            else if (kernel_run == gpu::TileKernel::stream_mma || kernel_run == gpu::TileKernel::warp_stream_mma)
              std::snprintf(kernel_text, sizeof kernel_text, "%s %ld CTAs", gpu::kernel_name(kernel_run),
                            static_cast<long>(plan.stream_ctas(weights[0])));
            else
              std::snprintf(kernel_text, sizeof kernel_text, "%s", gpu::kernel_name(kernel_run));
            std::printf("%-5s %-18s %-5s %-7s %-7.2f %-7s %9.3f %9.3f %7.2fx %10s %9s %9.1e  %s", "tile", shape_text,
                        dtype_name(dtype), tile_text, density, skewed ? "skewed" : "uniform", dense_ms, nmkit_ms,
                        dense_ms / nmkit_ms, bsr_text, bsr_ratio, err, kernel_text);
            if (ell)
              std::printf("  | Blocked-ELL %.3f ms (%.2fx, err %.1e)", ell->ms, ell->ms / nmkit_ms, ell->rel_error);
            if (variant)
              std::printf("  | %s %.3f ms (%.3fx nmkit's time, err %.1e)",
                          compared ? gpu::kernel_name(variant->kernel()) : variant_label.c_str(), medians[2],
                          medians[2] / nmkit_ms, variant_err);
            if (chain_ms)
              std::printf(
                  "  | chain of %d, us per product: %.2f overlapped, %.2f not, cuBLAS %.2f (%.2fx / %.2fx cuBLAS)",
                  o.chain, 1e3 * (*chain_ms)[0], 1e3 * (*chain_ms)[1], 1e3 * (*chain_ms)[2],
                  (*chain_ms)[2] / (*chain_ms)[0], (*chain_ms)[2] / (*chain_ms)[1]);
            std::printf("\n");
            std::fflush(stdout);
            rows.push_back({{"suite", "tile"},
                            {"r", s.r},
                            {"k", s.k},
                            {"c", s.c},
                            {"dtype", dtype_name(dtype)},
                            {"tile", side},
                            {"density", density},
                            {"distribution", skewed ? "skewed" : "uniform"},
                            {"operand_sets", sets},
                            {"cublas_ms", dense_ms},
                            {"nmkit_ms", nmkit_ms},
                            {"speedup_vs_cublas", dense_ms / nmkit_ms},
                            {"nmkit_rel_error", err},
                            {"kernel", gpu::kernel_name(kernel_run)},
                            {"block_n", plan.launch().block_n},
                            {"split", plan.launch().split},
                            {"persistent", plan.launch().persistent},
                            {"deferred_store", tile_plan_defers_store(plan)}});
            if (kernel_run == gpu::TileKernel::stream_mma || kernel_run == gpu::TileKernel::warp_stream_mma)
              rows.back()["stream_ctas"] = plan.stream_ctas(weights[0]);
            if (variant && !compared) rows.back()["variant"] = variant_label;
            if (variant)
              rows.back()["variant_kernel"] = gpu::kernel_name(variant->kernel()),
              rows.back()["variant_ms"] = medians[2], rows.back()["variant_rel_error"] = variant_err,
              rows.back()["variant_speedup_vs_cublas"] = dense_ms / medians[2];
            if (chain_ms)
              rows.back()["chain"] = o.chain, rows.back()["chain_overlapped_ms"] = (*chain_ms)[0],
              rows.back()["chain_plain_ms"] = (*chain_ms)[1], rows.back()["chain_cublas_ms"] = (*chain_ms)[2];
            if (bsr)
              rows.back()["cusparse_bsr_ms"] = bsr->ms, rows.back()["cusparse_bsr_rel_error"] = bsr->rel_error,
              rows.back()["nmkit_vs_cusparse_bsr"] = bsr->ms / nmkit_ms;
            if (ell)
              rows.back()["cusparse_blocked_ell_ms"] = ell->ms,
              rows.back()["cusparse_blocked_ell_rel_error"] = ell->rel_error,
              rows.back()["nmkit_vs_cusparse_blocked_ell"] = ell->ms / nmkit_ms;
            row_done();
          }
    }
  cusparseDestroy(sparse);
  // Host cost of one TileSpmmPlan::run() on a tiny weight.
  const gpu::PackedTiles packed = random_tiles(128, 128, 64, 0.5, false, DType::f16, 3);
  const gpu::DeviceTiles w = gpu::DeviceTiles::upload(packed);
  const gpu::TileSpmmPlan plan = gpu::TileSpmmPlan::create({128, 128, 16}, 64, 64);
  DeviceArray b(128 * 16 * 2), d(128 * 16 * 2);
  fill_dense(b.ptr, 128 * 16, DType::f16, 8, stream);
  const double us = host_overhead_us([&] { plan.run(stream, w, b.ptr, nullptr, d.ptr); }, stream);
  std::printf("host overhead of TileSpmmPlan::run(): %.2f us per call (%s)\n", us, gpu::kernel_name(plan.kernel()));
  return us;
}

}  // namespace nmkit::bench
