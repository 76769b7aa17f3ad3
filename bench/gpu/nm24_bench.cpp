// nmkit_bench: 2:4 SpMM (and, with --suite vnm, V:N:M SpMM: vnm_suite.cpp) side by side with dense cuBLASLt (best of
// its heuristic algorithms) and cuSPARSELt (algorithm search, plan made once), in one process on one GPU. Kernel times
// are medians of CUDA-event timings after warm-up, the libraries interleaved in rotating rounds (time_interleaved_ms);
// operand sets rotate so that no library runs out of L2. Every row is checked against cuBLAS in the same run, on a
// poisoned output.
//
//   nmkit_bench --suite llm|bert|decode|all [--shape R,K,C]... [--dtype f16|bf16|both] [--json FILE]
//   nmkit_bench --suite models [--models ...] [--tokens ...] --resume FILE   # over several calls, see --resume
//   nmkit_bench --suite vnm [--v 64,128] [--m 8,16,32] [--b-layout col|row|both] [--shape R,K,C]...
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "../../src/cuda/common/check.cuh"
#include "bench_common.hpp"
#include "bench_kernels.hpp"
#include "model_shapes.hpp"
#include "power_probe.hpp"
#include "quantized_suite.hpp"
#include "resumable_run.hpp"
#include "sparse_lt.hpp"
#include "tile_suite.hpp"
#include "transpose_suite.hpp"
#include "vnm_suite.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "nmkit/gpu/sparse_linear.hpp"
#include "nmkit/io/output_file.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace {

using namespace nmkit;
using json = nlohmann::json;
using namespace nmkit::bench;

// The models suite's rows: `models` names the models kept (model_shapes.hpp's names; empty: all), `tokens` the token
// counts (empty: kModelTokens), so that its ~300 rows per dtype can be run a part at a time.
struct ModelsFilter {
  std::vector<std::string> models;
  std::vector<int64_t> tokens;
};

std::vector<Shape> suite_shapes(const std::string& suite, const ModelsFilter& filter = {}) {
  std::vector<Shape> out;
  if (suite == "bert" || suite == "all")
    for (int64_t r : {768, 1024})
      for (int64_t k : {768, 1536, 3072, 4096, 6144, 12288}) out.push_back({r, k, 4096, "bert"});
  if (suite == "llm" || suite == "all")
    for (auto [r, k, c] : {std::tuple<int64_t, int64_t, int64_t>{11008, 4096, 4096},
                           {4096, 11008, 4096},
                           {28672, 8192, 4096},
                           {36864, 12288, 4096},
                           {8192, 8192, 8192}})
      out.push_back({r, k, c, "llm"});
  if (suite == "decode" || suite == "all")
    for (int64_t c : {1, 16, 128}) out.push_back({11008, 4096, c, "decode"});
  if (suite == "models") {  // every linear of the listed models at every token count (model_shapes.hpp)
    for (const std::string& name : filter.models)
      if (std::none_of(kModelLinears.begin(), kModelLinears.end(),
                       [&](const ModelLinear& l) { return l.model == name; }))
        throw Error(ErrorCode::invalid_argument, "--models: no model '" + name + "' (model_shapes.hpp names them)");
    const std::vector<int64_t> tokens =
        filter.tokens.empty() ? std::vector<int64_t>(kModelTokens.begin(), kModelTokens.end()) : filter.tokens;
    for (const ModelLinear& layer : kModelLinears)
      if (filter.models.empty() ||
          std::find(filter.models.begin(), filter.models.end(), layer.model) != filter.models.end())
        for (int64_t c : tokens) {
          // A shape two models share (Llama-3-70B's k and v, its tp8 shard's q) is one row.
          const bool listed = std::any_of(out.begin(), out.end(),
                                          [&](const Shape& s) { return s.r == layer.r && s.k == layer.k && s.c == c; });
          if (!listed) out.push_back({layer.r, layer.k, c, "models"});
        }
  }
  if (suite == "tile")  // seed 003: a 4096 x 4096 weight, a small batch and a large one
    for (int64_t c : {32, 4096}) out.push_back({4096, 4096, c, "tile"});
  if (suite == "8bit")  // fp8 / int8 2:4 against cuBLASLt and cuSPARSELt at 8 bits
    out = quantized_suite_shapes();
  if (suite == "transpose")  // the transpose before a V:N:M product of token-major x (K = k, T = c)
    out = transpose_suite_shapes();
  if (suite == "vnm")  // the acceptance shapes of the V:N:M issue: llm, BERT-large (--vnm-shapes for the suites)
    for (auto [r, k, c] :
         {std::tuple<int64_t, int64_t, int64_t>{11008, 4096, 4096}, {8192, 8192, 8192}, {1024, 4096, 4096}})
      out.push_back({r, k, c, "vnm"});
  if (out.empty() && suite != "none") throw Error(ErrorCode::invalid_argument, "unknown suite '" + suite + "'");
  return out;
}

struct Options {
  std::string suite = "all";
  std::vector<int> vnm_v{32, 64, 128};
  std::vector<int> tile_sides{32, 64, 128};
  std::vector<double> tile_densities{0.5, 0.25, 0.1, 0.05};
  int tile_block_n = 0, tile_split = 0;
  bool tile_unit_per_cta = false;
  bool tile_timeline = false;
  int tile_chain = 0;
  bool tile_blocked_ell = true;
  int tile_stream_ctas = 0;
  std::string tile_compare, tile_kernel = "automatic";
  std::vector<int> vnm_m{4, 5, 7, 8, 10, 16, 20, 32, 40, 100};
  std::string vnm_b_layout = "both";
  int vnm_block_n = 0;
  bool vnm_shared_columns = false;
  std::string vnm_kernel;  // vnm suite: a second condensed plan on this kernel, timed beside the plan's choice
  std::string vnm_shapes = "acceptance";
  std::vector<std::string> shapes;
  ModelsFilter models;
  std::string dtype = "both";
  std::vector<std::string> quant_types{"e4m3", "int8"};  // 8bit suite
  std::string json_path;
  std::string resume_path;  // 2:4 suites: the run to continue, rewritten after every row
  bool hold_queue = true;
  int warmup = 5, iters = 30;
  bool cusparselt = true;
  bool autotune = false;
  bool launch_times = false;  // JSON: every timed launch per library (cublas, nmkit, [cusparselt,] [variant])
  double power_ms = 0;        // > 0: sustained runs with the SM clock and power sampled (2:4 suites)
  std::string variant;        // KEY=VALUE[,...]: a second nmkit plan with these options, timed beside the first
  int chain = 0;              // > 0: also chains of this many back-to-back launches per library (2:4 suites)
};

// A sustained run of each library on one row, as JSON and as one line of text.
nlohmann::json sustained_json(const SustainedRun& r) {
  return {{"ms_per_launch", r.ms_per_launch},
          {"sm_mhz", r.sm_mhz},
          {"watts", r.watts},
          {"launches", r.launches},
          {"samples", r.samples}};
}
std::string sustained_text(const char* who, const SustainedRun& r, double flop) {
  char text[160];
  std::snprintf(text, sizeof text, "%s %.1f TFLOP/s at %.0f MHz, %.0f W (%.2f TFLOP/J)", who,
                flop / (r.ms_per_launch * 1e-3) / 1e12, r.sm_mhz, r.watts,
                flop / (r.ms_per_launch * 1e-3) / 1e12 / r.watts);
  return text;
}

// A kernel's short name on the command line (sm80, sm90, skinny; the caller checks it is one of them).
gpu::Nm24Kernel kernel_of(const std::string& name) {
  return name == "sm80"   ? gpu::Nm24Kernel::sm80_mma_sp
         : name == "sm90" ? gpu::Nm24Kernel::sm90_wgmma_sp
                          : gpu::Nm24Kernel::sm80_mma_sp_skinny;
}

// The 2:4 plan options of --variant: kernel (sm80|sm90|skinny), block_n, block_m (skinny), schedule
// (staged|registers|persistent), raster_rows, split (split-K CTAs per tile) and overlap_launch (0|1).
gpu::Nm24Options nm24_variant_options(const VariantSettings& settings) {
  gpu::Nm24Options options;
  for (const auto& [key, value] : settings) {
    if (key == "kernel" && (value == "sm80" || value == "sm90" || value == "skinny"))
      options.kernel = kernel_of(value);
    else if (key == "block_n")
      options.block_n = variant_int(key, value, 8, 256);
    else if (key == "block_m")
      options.block_m = variant_int(key, value, 16, 32);
    else if (key == "schedule" && (value == "staged" || value == "registers" || value == "persistent"))
      options.schedule = value == "staged"      ? gpu::Sm90Schedule::staged
                         : value == "registers" ? gpu::Sm90Schedule::registers
                                                : gpu::Sm90Schedule::persistent;
    else if (key == "raster_rows")
      options.raster_rows = variant_int(key, value, 1, 1024);
    else if (key == "split")
      options.split = variant_int(key, value, 1, 8);
    else if (key == "overlap_launch")
      options.overlap_launch = variant_flag(key, value);
    else
      throw Error(ErrorCode::invalid_argument,
                  "--variant for the 2:4 suites takes kernel=sm80|sm90|skinny, block_n=N, block_m=N, "
                  "schedule=staged|registers|persistent, raster_rows=N, split=N and overlap_launch=0|1, got " +
                      key + "=" + value);
  }
  return options;
}

// SparseLinear as a serving loop sees it: 1000 token counts drawn from 1..4096 (seeded). How many plans the layer
// makes for them and how long making them took (kernel(T) makes a run's plan without launching), then the host time
// of run() cycling through the same counts once every plan exists (host_overhead_us: bursts queued behind a hold,
// so that the GPU's time does not count).
void serving_loop(json& out, cudaStream_t stream) {
  constexpr int64_t kRows = 256, kCols = 256, kMaxTokens = 4096;
  constexpr int kCalls = 1000;
  std::mt19937 random(11);
  std::uniform_int_distribution<int64_t> draw(1, kMaxTokens);
  std::vector<int64_t> tokens(kCalls);
  for (int64_t& t : tokens) t = draw(random);
  const DenseMatrix w = DenseMatrix::from_float(kRows, kCols, std::vector<float>(kRows * kCols, 1.0f), DType::f16);
  DeviceArray x(kMaxTokens * kCols * 2), y(kMaxTokens * kRows * 2);
  fill_dense(x.ptr, kMaxTokens * kCols, DType::f16, 21, stream);
  json rows = json::array();
  for (const char* format : {"2:4", "vnm:128:2:8"}) {
    gpu::SparseLinear layer = gpu::SparseLinear::create(prune_magnitude(w, parse_format_spec(format)).compressed);
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t t : tokens) layer.kernel(t);
    const double plan_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // One call per count first, so that the timed calls find every plan and the workspace grown.
    for (int64_t t : tokens) layer.run(stream, x.ptr, y.ptr, t);
    NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::size_t call = 0;
    const double run_us =
        host_overhead_us([&] { layer.run(stream, x.ptr, y.ptr, tokens[call++ % tokens.size()]); }, stream);
    std::printf(
        "SparseLinear %s %lldx%lld, %d calls with T from 1..%lld: %zu plans made in %.1f ms (%.2f ms each); "
        "host time of run() %.2f us per call\n",
        format, static_cast<long long>(kRows), static_cast<long long>(kCols), kCalls,
        static_cast<long long>(kMaxTokens), layer.plans(), plan_ms, plan_ms / std::max<std::size_t>(layer.plans(), 1),
        run_us);
    rows.push_back({{"format", format}, {"plans", layer.plans()}, {"plan_ms", plan_ms}, {"run_host_us", run_us}});
  }
  out["serving_loop"] = rows;
}

int run(const Options& o) {
  const VariantSettings variant_settings = parse_variant(o.variant);
  if ((o.suite == "tile" || o.suite == "vnm" || o.suite == "8bit") && o.power_ms > 0)
    throw Error(ErrorCode::invalid_argument,
                "--power-ms applies to the 2:4 suites (bert, llm, decode, all), not --suite " + o.suite);
  if (o.suite == "vnm" && !variant_settings.empty())
    throw Error(ErrorCode::invalid_argument, "--variant applies to the 2:4, 8bit and tile suites, not --suite vnm");
  const gpu::Nm24Options variant_options =
      o.suite == "tile" || variant_settings.empty() ? gpu::Nm24Options{} : nm24_variant_options(variant_settings);
  if (o.suite != "models" && (!o.models.models.empty() || !o.models.tokens.empty()))
    throw Error(ErrorCode::invalid_argument, "--models and --tokens apply to --suite models, not --suite " + o.suite);
  const bool two_four_suite =
      o.suite == "bert" || o.suite == "llm" || o.suite == "decode" || o.suite == "all" || o.suite == "models";
  if (!o.resume_path.empty()) {
    require(two_four_suite, ErrorCode::invalid_argument,
            "--resume applies to the 2:4 suites (bert, llm, decode, all, models), not --suite " + o.suite);
    require(o.json_path.empty(), ErrorCode::invalid_argument, "--resume writes its own file: leave out --json");
  }
  const std::string json_path = o.resume_path.empty() ? o.json_path : o.resume_path;
  if (!json_path.empty()) resolve_output_path(json_path);  // a bad path fails now, not after the first row
  for (int64_t t : o.models.tokens)
    require(t >= 1, ErrorCode::invalid_argument, "--tokens: token counts must be >= 1, got " + std::to_string(t));
  std::vector<Shape> shapes = suite_shapes(
      o.shapes.empty()
          ? o.suite
          : (o.suite == "all" || o.suite == "vnm" || o.suite == "tile" || o.suite == "8bit" || o.suite == "transpose"
                 ? "none"
                 : o.suite),
      o.models);
  if (o.suite == "vnm" && o.shapes.empty() && o.vnm_shapes == "ksweep") {  // the seed's Figure 9: K varies
    shapes.clear();
    for (int64_t k : {1024, 2048, 4096, 8192, 16384}) shapes.push_back({4096, k, 4096, "vnm"});
  } else if (o.suite == "vnm" && o.shapes.empty() && o.vnm_shapes != "acceptance") {
    shapes = suite_shapes(o.vnm_shapes == "all" ? "llm" : o.vnm_shapes);
    if (o.vnm_shapes == "all")
      for (const Shape& s : suite_shapes("bert")) shapes.push_back(s);
  }
  for (const auto& text : o.shapes) {
    Shape s{0, 0, 0, "custom"};
    if (std::sscanf(text.c_str(), "%ld,%ld,%ld", &s.r, &s.k, &s.c) != 3 || s.r < 1 || s.k < 1 || s.c < 1)
      throw Error(ErrorCode::invalid_argument, "--shape '" + text + "': expected R,K,C with positive integers");
    shapes.push_back(s);
  }
  std::vector<DType> dtypes;
  if (o.dtype == "both")
    dtypes = {DType::f16, DType::bf16};
  else
    dtypes = {parse_dtype(o.dtype)};

  cudaDeviceProp prop{};
  NMKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver), cudaRuntimeGetVersion(&runtime);
  cudaStream_t stream;
  NMKIT_CUDA_CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t lt;
  CHECK_CUBLAS(cublasLtCreate(&lt));
  constexpr std::size_t kWorkspace = 64u << 20;
  DeviceArray workspace(kWorkspace);
  json out = {{"gpu", prop.name},
              {"sm_count", prop.multiProcessorCount},
              {"l2_bytes", prop.l2CacheSize},
              {"driver", driver},
              {"cuda_runtime", runtime},
              {"cublaslt", cublasLtGetVersion()},
              {"rows", json::array()}};
  QueueHold::instance().enable(o.hold_queue);
  out["timing"] = "medians of CUDA-event times, libraries interleaved in rotating rounds of " +
                  std::to_string(kLaunchesPerRound) + " launches" +
                  (o.hold_queue ? ", each round queued behind a held stream" : "");
  out["hold_queue"] = o.hold_queue;
  // What a row's times depend on besides its shape: a resumed run continues only under the same settings.
  out["settings"] = {{"iters", o.iters},
                     {"warmup", o.warmup},
                     {"steady_warmup_ms", steady_warmup_ms()},
                     {"hold_queue", o.hold_queue},
                     {"cusparselt", o.cusparselt},
                     {"autotune", o.autotune},
                     {"variant", o.variant},
                     {"chain", o.chain},
                     {"power_ms", o.power_ms},
                     {"launch_times", o.launch_times}};
  json resumed = o.resume_path.empty() ? json(nullptr) : load_run_to_resume(o.resume_path, prop.name, out["settings"]);
  if (resumed.is_object()) {
    if (resumed.value("complete", false)) {
      std::printf("--resume %s: the run is complete (%zu rows); nothing to time\n", o.resume_path.c_str(),
                  resumed["rows"].size());
      return 0;
    }
    out["rows"] = resumed["rows"];
    std::printf("--resume %s: %zu rows kept from earlier calls\n", o.resume_path.c_str(), out["rows"].size());
  }
  // The JSON is rewritten after every row ("complete": false until the end), so that a run cut by a time limit
  // still leaves the rows it measured.
  out["complete"] = false;
  const auto save = [&] {
    if (json_path.empty()) return;
    const std::string text = out.dump(2) + "\n";
    write_file_atomically(json_path, std::as_bytes(std::span(text)));
  };
  // The run fails if any nmkit (or --variant) output failed its check (rows JSON: nmkit_rel_error, null where
  // NaN).
  const auto finish = [&] {
    out["complete"] = true;
    if (QueueHold::instance().timed_out())
      std::fprintf(stderr, "warning: a queue hold gave up waiting for the host: some rounds were timed as queued\n");
    out["hold_timed_out"] = QueueHold::instance().timed_out();
    save();
    int wrong = 0;
    const auto is_wrong = [](const json& err) { return !err.is_number() || !(err.get<double>() < kBaselineTolerance); };
    for (const json& row : out["rows"])
      if (is_wrong(row["nmkit_rel_error"]) || (row.contains("variant_rel_error") && is_wrong(row["variant_rel_error"])))
        ++wrong;
    if (wrong > 0) std::fprintf(stderr, "%d row(s) with a wrong nmkit output\n", wrong);
    return wrong > 0 ? 1 : 0;
  };
  if (o.suite == "tile") {
    TileSuiteOptions t{shapes, dtypes};
    t.warmup = o.warmup, t.iters = o.iters, t.tile_sides = o.tile_sides;
    t.densities = o.tile_densities, t.block_n = o.tile_block_n, t.split = o.tile_split;
    t.persistent = !o.tile_unit_per_cta;
    t.timeline = o.tile_timeline;
    t.chain = o.tile_chain;
    t.blocked_ell = o.tile_blocked_ell;
    t.variant = variant_settings;
    t.stream_ctas = o.tile_stream_ctas, t.compare_kernel = o.tile_compare, t.kernel = o.tile_kernel;
    out["tile_run_host_overhead_us"] =
        run_tile_suite(t, lt, workspace.ptr, kWorkspace, prop.l2CacheSize, stream, out["rows"], save);
    return finish();
  }
  if (o.suite == "8bit") {
    QuantizedSuiteOptions q{shapes, {}, o.warmup, o.iters, o.cusparselt};
    for (const std::string& name : o.quant_types) q.types.push_back(parse_quant_type(name));
    if (!variant_settings.empty()) q.variant = variant_options, q.variant_text = o.variant;
    run_quantized_suite(q, lt, workspace.ptr, kWorkspace, prop.l2CacheSize, stream, out["rows"], save);
    return finish();
  }
  if (o.suite == "transpose") {
    run_transpose_suite({shapes, o.warmup, o.iters}, prop.l2CacheSize, stream, out["rows"], save);
    return finish();
  }
  if (o.suite == "vnm") {
    VnmSuiteOptions v{shapes, dtypes, o.vnm_v, o.vnm_m, {}, o.warmup, o.iters, o.vnm_block_n, o.vnm_shared_columns};
    if (!o.vnm_kernel.empty()) v.variant_kernel = kernel_of(o.vnm_kernel);
    if (o.vnm_b_layout != "row") v.b_layouts.push_back(Layout::col_major);
    if (o.vnm_b_layout != "col") v.b_layouts.push_back(Layout::row_major);
    out["vnm_run_host_overhead_us"] =
        run_vnm_suite(v, lt, workspace.ptr, kWorkspace, prop.l2CacheSize, stream, out["rows"], save);
    return finish();
  }
  // Sustained runs (--power-ms): the clock each library holds under load, and the power it draws.
  std::optional<PowerProbe> power;
  if (o.power_ms > 0) {
    power.emplace(0);
    if (!power->available()) {
      std::fprintf(stderr, "--power-ms: no sustained runs: %s\n", power->why_unavailable());
      power.reset();
    }
  }
#if defined(NMKIT_HAVE_CUSPARSELT)
  cusparseLtHandle_t lt_sparse;
  const bool have_lt = o.cusparselt && cusparseLtInit(&lt_sparse) == CUSPARSE_STATUS_SUCCESS;
  if (have_lt) {
    int version = 0;
    cusparseLtGetVersion(&lt_sparse, &version);
    out["cusparselt"] = version;
  }
#else
  const bool have_lt = false;
  out["cusparselt"] = "not built";
#endif

  std::printf("%-7s %-20s %-5s %10s %10s %8s %10s %8s %9s %9s  %s\n", "suite", "R x K x C", "dtype", "cuBLAS", "cuSPLt",
              "vs cuBL", "nmkit", "vs cuBL", "vs cuSPLt", "rel.err", "nmkit kernel");
  for (DType dtype : dtypes)
    for (const Shape& s : shapes) {
      if (resumed.is_object() && holds_row(out["rows"], {s.suite, s.r, s.k, s.c, dtype_name(dtype)})) continue;
      const std::size_t elem = 2;
      const std::size_t b_bytes = s.k * s.c * elem, d_bytes = s.r * s.c * elem, w_bytes = s.r * s.k * elem;
      // Enough operand sets that their bytes exceed 3x L2 (at most 8).
      const std::size_t per_set = w_bytes / 2 + b_bytes + d_bytes;
      const int sets = static_cast<int>(std::clamp<std::size_t>(3 * prop.l2CacheSize / per_set + 1, 1, 8));

      std::vector<gpu::DeviceNm24> weights;
      std::vector<DeviceArray> dense_w, b, d_nmkit, d_dense, d_lt;
      for (int i = 0; i < sets; ++i) {
        weights.push_back(gpu::DeviceNm24::allocate(s.r, s.k, dtype));
        bench::fill_packed(weights[i].values(), weights[i].metadata(), s.r, s.k, weights[i].rows_padded(),
                           weights[i].cols_padded(), dtype, 1234 + i, stream);
        dense_w.emplace_back(w_bytes);
        NMKIT_CUDA_CHECK(cudaMemsetAsync(dense_w[i].ptr, 0, w_bytes, stream));
        bench::expand_packed(weights[i].values(), weights[i].metadata(), dense_w[i].ptr, s.r, s.k,
                             weights[i].rows_padded(), weights[i].cols_padded(), dtype, stream);
        b.emplace_back(b_bytes);
        bench::fill_dense(b[i].ptr, s.k * s.c, dtype, 99 + i, stream);
        d_nmkit.emplace_back(d_bytes), d_dense.emplace_back(d_bytes), d_lt.emplace_back(d_bytes);
      }
      NMKIT_CUDA_CHECK(cudaGetLastError());
      NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));

      // Each library set up and checked first (cuBLASLt's fastest heuristic algorithm, nmkit's plan, cuSPARSELt's
      // searched configuration), then all of them timed side by side in rotating rounds.
      DenseGemm dense(lt, s, dtype, workspace.ptr, kWorkspace);
      const auto dense_launch = [&](int i) { dense.run(dense_w[i].ptr, b[i].ptr, d_dense[i].ptr, stream); };
      dense.choose_fastest(dense_launch, sets, stream);
      dense_launch(0);  // the reference of set 0

      gpu::SpmmDesc desc{s.r, s.k, s.c, dtype, dtype};
      const gpu::Nm24SpmmPlan plan = o.autotune ? gpu::Nm24SpmmPlan::autotune(desc) : gpu::Nm24SpmmPlan::create(desc);
      const auto nmkit_launch = [&](int i) { plan.run(stream, weights[i], b[i].ptr, nullptr, d_nmkit[i].ptr); };
      const double err = check_output(nmkit_launch, d_nmkit[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
      std::vector<std::function<void(int)>> launches{dense_launch, nmkit_launch};

      std::optional<double> lt_ms, lt_err;
      std::optional<int> lt_config;
      std::optional<std::size_t> lt_index, variant_index;
      bool lt_searched = false;
#if defined(NMKIT_HAVE_CUSPARSELT)
      std::optional<SparseLt> sparse;
      if (have_lt) {
        // The searched configuration; if its output fails the check, the default one (reported as such).
        std::vector<const void*> ws;
        for (auto& w : dense_w) ws.push_back(w.ptr);
        for (const bool searched : {true, false}) {
          try {
            sparse.emplace(&lt_sparse, s, dtype, ws, stream);
            if (searched) sparse->search(b[0].ptr, d_lt[0].ptr);
            lt_err = check_output([&](int i) { sparse->run(i, b[i].ptr, d_lt[i].ptr); }, d_lt[0].ptr, d_dense[0].ptr,
                                  s.r * s.c, dtype, stream);
            lt_searched = searched, lt_config = sparse->config_id();
            if (*lt_err < kBaselineTolerance) break;
            // A baseline whose output fails the check is not timing this product: compare nothing with it.
            std::fprintf(stderr, "cuSPARSELt (%s configuration %d) output wrong for %ldx%ldx%ld %s (rel. error %.2g)\n",
                         searched ? "searched" : "default", *lt_config, s.r, s.k, s.c, dtype_name(dtype), *lt_err);
          } catch (const Error& e) {
            std::fprintf(stderr, "cuSPARSELt (%s) skipped for %ldx%ldx%ld: %s\n", searched ? "searched" : "default",
                         s.r, s.k, s.c, e.what());
            cudaGetLastError();
          }
          sparse.reset();
        }
        if (sparse) {
          lt_index = launches.size();
          launches.push_back([&](int i) { sparse->run(i, b[i].ptr, d_lt[i].ptr); });
        }
      }
#endif
      // --variant: the same product planned with other options (a kernel experiment), timed in the same rounds.
      // Its output goes to cuSPARSELt's buffers, checked like nmkit's.
      std::optional<gpu::Nm24SpmmPlan> variant;
      std::optional<double> variant_err;
      if (!o.variant.empty()) {
        variant = gpu::Nm24SpmmPlan::create(desc, variant_options);
        const auto variant_launch = [&](int i) { variant->run(stream, weights[i], b[i].ptr, nullptr, d_lt[i].ptr); };
        variant_err = check_output(variant_launch, d_lt[0].ptr, d_dense[0].ptr, s.r * s.c, dtype, stream);
        variant_index = launches.size();
        launches.push_back(variant_launch);
      }
      std::vector<std::vector<float>> launch_ms;
      const std::vector<double> medians =
          time_interleaved_ms(launches, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream,
                              o.launch_times ? &launch_ms : nullptr);
      const double dense_ms = medians[0], nmkit_ms = medians[1];
      if (lt_index) lt_ms = medians[*lt_index];
      // --chain: each library's launches back to back, as a model's layers run: each launch then waits only for the
      // one before it (with nmkit's overlapping launches, only before it reads B; KernelConfig::overlap_launch).
      // Per product: cuBLAS, nmkit, [cuSPARSELt,] nmkit with overlapping launches off.
      std::vector<double> chain_ms;
      if (o.chain > 0) {
        const gpu::Nm24SpmmPlan plain = gpu::Nm24SpmmPlan::create(desc, {.overlap_launch = false});
        std::vector<std::function<void(int)>> chains;
        std::vector<std::size_t> libraries{0, 1};
        if (lt_index) libraries.push_back(*lt_index);
        for (const std::size_t l : libraries)
          chains.push_back([&, l](int i) {
            for (int j = 0; j < o.chain; ++j) launches[l](i);
          });
        chains.push_back([&](int i) {
          for (int j = 0; j < o.chain; ++j) plain.run(stream, weights[i], b[i].ptr, nullptr, d_nmkit[i].ptr);
        });
        chain_ms = time_interleaved_ms(chains, sets, o.warmup, interleaved_rounds(o.iters), kLaunchesPerRound, stream);
        for (double& ms : chain_ms) ms /= o.chain;
      }

      // Sustained runs (--power-ms), one library after the other.
      std::optional<SustainedRun> dense_power, nmkit_power, lt_power, variant_power;
      if (power) {
        dense_power = power->run(launches[0], sets, o.power_ms, stream);
        nmkit_power = power->run(launches[1], sets, o.power_ms, stream);
        if (lt_index) lt_power = power->run(launches[*lt_index], sets, o.power_ms, stream);
        if (variant_index) variant_power = power->run(launches[*variant_index], sets, o.power_ms, stream);
      }
      const double flop = 2.0 * s.r * s.k * s.c;
      auto tflops = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
      std::ostringstream kernel;
      kernel << plan.config();
      char shape_text[64];
      std::snprintf(shape_text, sizeof shape_text, "%ldx%ldx%ld", s.r, s.k, s.c);
      const std::string split = plan.config().split > 1 ? " split " + std::to_string(plan.config().split) : "";
      std::printf("%-7s %-20s %-5s %10.1f %10s %8s %10.1f %7.2fx %9s %9.1e  %s n%d%s%s\n", s.suite.c_str(), shape_text,
                  dtype_name(dtype), tflops(dense_ms),
                  lt_ms ? std::to_string(tflops(*lt_ms)).substr(0, 6).c_str() : "-",
                  lt_ms ? (std::to_string(dense_ms / *lt_ms).substr(0, 4) + "x").c_str() : "-", tflops(nmkit_ms),
                  dense_ms / nmkit_ms, lt_ms ? (std::to_string(*lt_ms / nmkit_ms).substr(0, 4) + "x").c_str() : "-",
                  err, kernel_name(plan.config().kernel), plan.config().block_n, split.c_str(),
                  lt_ms && !lt_searched ? "  (cuSPARSELt: its default configuration, the searched one failed)" : "");
      if (power) {
        std::string line = "        sustained " + sustained_text("cuBLAS", *dense_power, flop);
        if (lt_power) line += "; " + sustained_text("cuSPARSELt", *lt_power, flop);
        line += "; " + sustained_text("nmkit", *nmkit_power, flop);
        if (variant_power) line += "; " + sustained_text("variant", *variant_power, flop);
        std::printf("%s\n", line.c_str());
      }
      if (!chain_ms.empty())
        std::printf(
            "        chain of %d launches, us per product: cuBLAS %.2f, nmkit %.2f overlapped / %.2f not (%.2fx / "
            "%.2fx "
            "cuBLAS)%s\n",
            o.chain, 1e3 * chain_ms[0], 1e3 * chain_ms[1], 1e3 * chain_ms.back(), chain_ms[0] / chain_ms[1],
            chain_ms[0] / chain_ms.back(),
            lt_index ? (", cuSPARSELt " + std::to_string(1e3 * chain_ms[2]).substr(0, 6) + " (nmkit " +
                        std::to_string(chain_ms[2] / chain_ms[1]).substr(0, 4) + "x)")
                           .c_str()
                     : "");
      if (variant_index) {
        const double variant_ms = medians[*variant_index];
        std::printf("        variant (%s): %.1f TFLOP/s, %.3fx nmkit's time, rel. error %.1e, %s\n", o.variant.c_str(),
                    tflops(variant_ms), variant_ms / nmkit_ms, *variant_err,
                    (std::ostringstream() << variant->config()).str().c_str());
      }
      std::fflush(stdout);
      json row = {{"suite", s.suite},
                  {"r", s.r},
                  {"k", s.k},
                  {"c", s.c},
                  {"dtype", dtype_name(dtype)},
                  {"operand_sets", sets},
                  {"cublas_ms", dense_ms},
                  {"nmkit_ms", nmkit_ms},
                  {"nmkit_rel_error", err},
                  {"nmkit_config", kernel.str()},
                  {"speedup_vs_cublas", dense_ms / nmkit_ms}};
      if (lt_ms)
        row["cusparselt_ms"] = *lt_ms, row["cusparselt_rel_error"] = *lt_err,
        row["nmkit_vs_cusparselt"] = *lt_ms / nmkit_ms;
      else if (lt_err)
        row["cusparselt_rel_error"] = *lt_err, row["cusparselt_wrong"] = true;
      if (lt_config) row["cusparselt_config"] = *lt_config, row["cusparselt_searched"] = lt_searched;
      if (!chain_ms.empty()) {
        row["chain"] = o.chain, row["chain_cublas_ms"] = chain_ms[0], row["chain_nmkit_ms"] = chain_ms[1];
        row["chain_nmkit_plain_ms"] = chain_ms.back();
        if (lt_index) row["chain_cusparselt_ms"] = chain_ms[2];
      }
      if (variant_index)
        row["variant"] = o.variant, row["variant_ms"] = medians[*variant_index],
        row["variant_rel_error"] = *variant_err;
      if (!launch_ms.empty()) {
        row["launch_ms"] = {{"cublas", launch_ms[0]}, {"nmkit", launch_ms[1]}};
        if (lt_index) row["launch_ms"]["cusparselt"] = launch_ms[*lt_index];
        if (variant_index) row["launch_ms"]["variant"] = launch_ms[*variant_index];
      }
      if (power) {
        row["sustained_ms"] = o.power_ms;
        row["cublas_sustained"] = sustained_json(*dense_power), row["nmkit_sustained"] = sustained_json(*nmkit_power);
        if (lt_power) row["cusparselt_sustained"] = sustained_json(*lt_power);
        if (variant_power) row["variant_sustained"] = sustained_json(*variant_power);
      }
      out["rows"].push_back(row);
      save();
      if (!(err < kBaselineTolerance))
        std::fprintf(stderr, "nmkit output WRONG for %s %s (rel. error %.2g)\n", shape_text, dtype_name(dtype), err);
      if (variant_err && !(*variant_err < kBaselineTolerance))
        std::fprintf(stderr, "variant output WRONG for %s %s (rel. error %.2g)\n", shape_text, dtype_name(dtype),
                     *variant_err);
    }
  serving_loop(out, stream);
  // Host cost of one run() (validation, tensor map, launch), enqueueing tiny products back to back.
  {
    const gpu::SpmmDesc tiny{128, 64, 16};
    const gpu::Nm24SpmmPlan plan = gpu::Nm24SpmmPlan::create(tiny);
    gpu::DeviceNm24 w = gpu::DeviceNm24::allocate(128, 64, DType::f16);
    bench::fill_packed(w.values(), w.metadata(), 128, 64, w.rows_padded(), w.cols_padded(), DType::f16, 7, stream);
    DeviceArray b(64 * 16 * 2), d(128 * 16 * 2);
    bench::fill_dense(b.ptr, 64 * 16, DType::f16, 8, stream);
    const double us = host_overhead_us([&] { plan.run(stream, w, b.ptr, nullptr, d.ptr); }, stream);
    std::printf("host overhead of Nm24SpmmPlan::run(): %.2f us per call (%s)\n", us, kernel_name(plan.config().kernel));
    out["run_host_overhead_us"] = us;
  }
  return finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nmkit SpMM benchmark (2:4, V:N:M, tile-sparse) against cuBLASLt, cuSPARSELt and cuSPARSE"};
  Options o;
  app.add_option("--suite", o.suite,
                 "bert | llm | decode | all | models (2:4; models: every linear of Llama-2/3 and BERT at T = 1..8192) "
                 "| vnm (V:N:M) | tile | 8bit (fp8 / int8 2:4) | transpose (SparseLinear's x to x^T, against a copy; "
                 "--shape's K and C)")
      ->capture_default_str();
  app.add_option("--models", o.models.models,
                 "models suite: only these models (llama-2-7b, llama-2-13b, llama-3-8b, llama-3-70b, "
                 "\"llama-3-70b tp8\", bert-base, bert-large)")
      ->delimiter(',');
  app.add_option("--tokens", o.models.tokens, "models suite: only these token counts (default 1, 8, ..., 8192)")
      ->delimiter(',');
  app.add_option("--quant", o.quant_types, "8bit suite: e4m3 and/or int8")->delimiter(',')->capture_default_str();
  app.add_option("--v", o.vnm_v, "vnm suite: V values")->delimiter(',')->capture_default_str();
  app.add_option("--tile-sides", o.tile_sides, "tile suite: square tile sides")->delimiter(',')->capture_default_str();
  app.add_option("--tile-densities", o.tile_densities, "tile suite: fractions of stored tiles")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--tile-block-n", o.tile_block_n,
                 "tile suite: the sm90 kernel's tokens per CTA (32/64/128/256; 0: by shape)");
  app.add_option("--tile-split", o.tile_split,
                 "tile suite: the sm90 kernel's split-K cluster size (1..8; 0: by shape)");
  app.add_flag("--tile-unit-per-cta", o.tile_unit_per_cta,
               "tile suite: one sm90 CTA per work unit instead of one persistent CTA per SM");
  app.add_option("--tile-stream-ctas", o.tile_stream_ctas,
                 "tile suite: the stream kernel's CTAs per 32-token block (0: as many as the device holds at once)");
  app.add_option(
         "--tile-kernel", o.tile_kernel,
         "tile suite: the measured plan's kernel (automatic | sm80_mma | sm90_wgmma | stream_mma | warp_stream_mma)")
      ->capture_default_str();
  app.add_option("--tile-compare", o.tile_compare,
                 "tile suite: also time a plan forced to this kernel (sm80_mma | sm90_wgmma | stream_mma | "
                 "warp_stream_mma) in the same rounds");
  app.add_flag(
      "!--no-tile-blocked-ell", o.tile_blocked_ell,
      "tile suite: skip cuSPARSE Blocked-ELL (timed where every tile row has nearly as many tiles: padding <= 25 %)");
  app.add_option("--tile-chain", o.tile_chain,
                 "tile suite: also time chains of N dependent products (square weights: each output the next input), "
                 "nmkit with and without overlapping launches and cuBLAS, per product")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--tile-timeline", o.tile_timeline,
               "tile suite: after each f16 sm90 row, one run traced with clock64 marks and summarised (diagnosis)");
  app.add_option("--m", o.vnm_m, "vnm suite: M values (N = 2)")->delimiter(',')->capture_default_str();
  app.add_option("--vnm-shapes", o.vnm_shapes,
                 "vnm suite: acceptance (the issue's three) | llm | bert | all | ksweep (4096 x K x 4096, K = 1k..16k)")
      ->check(CLI::IsMember({"acceptance", "llm", "bert", "all", "ksweep"}))
      ->capture_default_str();
  app.add_option("--b-layout", o.vnm_b_layout, "vnm suite: col (x[T,K] row-major) | row (K x C) | both")
      ->check(CLI::IsMember({"col", "row", "both"}))
      ->capture_default_str();
  app.add_option("--vnm-block-n", o.vnm_block_n,
                 "vnm suite: the sm90 condensed kernel's n-tile (256/128/64; 0: heuristic)");
  app.add_option("--vnm-kernel", o.vnm_kernel,
                 "vnm suite: also time the condensed form on this kernel in the same rounds (sm80 | sm90 | skinny)")
      ->check(CLI::IsMember({"sm80", "sm90", "skinny"}));
  app.add_flag("--vnm-shared-columns", o.vnm_shared_columns,
               "vnm suite: every V-block selects the same columns (diagnosis: the gather without its L2 footprint)");
  app.add_option("--shape", o.shapes, "Extra shape R,K,C (repeatable)");
  app.add_option("--dtype", o.dtype, "f16 | bf16 | both")->capture_default_str();
  app.add_option("--json", o.json_path, "Write the results as JSON");
  app.add_option("--resume", o.resume_path,
                 "2:4 suites: continue the run in this JSON file (made by an earlier --resume on this GPU with the "
                 "same timing settings and build), timing only the rows it lacks and rewriting it after every row; "
                 "a missing file starts the run. A call cut by a time limit loses at most the row it was timing");
  app.add_option("--warmup", o.warmup, "Warm-up launches")->capture_default_str();
  app.add_option("--steady-warmup-ms", steady_warmup_ms(),
                 "Before each row's timing, run its libraries in rotating rounds for this many ms, so that every "
                 "library is timed at the clocks sustained load settles to (0: off: rows then straddle the "
                 "clocks' fall from boost)")
      ->check(CLI::Range(0.0, 60000.0))
      ->capture_default_str();
  app.add_option("--iters", o.iters, "Timed launches (median)")->capture_default_str();
  app.add_flag("!--no-cusparselt", o.cusparselt, "Skip cuSPARSELt");
  app.add_flag("!--no-hold-queue", o.hold_queue,
               "Time each round as the host queues it, without holding the stream until the round is queued (short "
               "launches then include host time)");
  app.add_option(
         "--power-ms", o.power_ms,
         "2:4 suites: also run cuBLAS, cuSPARSELt and nmkit back to back for this many ms per row each, with the "
         "SM clock and board power sampled through NVML (0: off)")
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--chain", o.chain,
                 "2:4 suites: also time chains of N back-to-back launches per library (nmkit with and without "
                 "overlapping launches), per product")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
      "--variant", o.variant,
      "2:4, 8bit and tile suites: KEY=VALUE[,KEY=VALUE...]; also time a second nmkit plan with these options in "
      "the same rounds (2:4 and 8bit: kernel, block_n, block_m, schedule, raster_rows, split, overlap_launch; tile: "
      "block_n, "
      "split, "
      "persistent, stream_ctas, overlap_launch)");
  app.add_flag("--launch-times", o.launch_times,
               "2:4 suites: also write every timed launch's ms per library to the JSON (launch_ms), in launch order");
  app.add_flag("--autotune", o.autotune,
               "Choose nmkit's tile by timing (Nm24SpmmPlan::autotune) instead of the heuristic");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nmkit_bench: error: %s\n", e.what());
    return 1;
  }
}
