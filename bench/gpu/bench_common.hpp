#pragma once
// Pieces shared by the GPU benchmark suites: device arrays, CUDA-event medians, the dense cuBLASLt baseline
// and the on-device error against it.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../../src/cuda/common/check.cuh"
#include "bench_kernels.hpp"
#include "nmkit/error.hpp"

namespace nmkit::bench {

#define CHECK_CUBLAS(x) nmkit_bench_check_status(static_cast<int>(x), #x)
inline void nmkit_bench_check_status(int status, const char* what) {
  if (status != 0) throw Error(ErrorCode::cuda_error, std::string(what) + " returned status " + std::to_string(status));
}

struct Shape {
  int64_t r, k, c;
  std::string suite;
};

struct DeviceArray {
  void* ptr = nullptr;
  DeviceArray() = default;
  explicit DeviceArray(std::size_t bytes) { NMKIT_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(bytes, 16))); }
  DeviceArray(DeviceArray&& o) noexcept : ptr(o.ptr) { o.ptr = nullptr; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(ptr, o.ptr);
    return *this;
  }
  ~DeviceArray() { cudaFree(ptr); }
};

// Holds a stream at a spinning kernel while the host queues the launches to time, then lets them run back to back,
// so that their events time the GPU's work and not the rate at which the host queues it. Without it, a launch
// shorter than the host's cost of queueing it (its library's host work plus two event records: ~10 us at C = 32)
// finds the GPU idle, and its start event is stamped before the launch has even been queued. (nvbench calls this
// a blocking kernel.) Held by default; `nmkit_bench --no-hold-queue` times without it, as the launches are
// queued. The spin gives up after kTimeoutNs, so that a library that blocks the host cannot hang
// the benchmark; `timed_out()` reports it, and the suites print it.
class QueueHold {
 public:
  static QueueHold& instance() {
    static QueueHold hold;
    return hold;
  }
  void enable(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }
  // Queues the hold on s (nothing when disabled); release() lets it end.
  void hold(cudaStream_t s) {
    if (!enabled_) return;
    ensure_flags();
    hold_stream(device_flags_, ++ticket_, kTimeoutNs, s);
  }
  void release() {
    if (!enabled_ || !flags_) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    flags_[0] = ticket_;
  }
  bool timed_out() const { return flags_ && flags_[1] != 0; }
  QueueHold(const QueueHold&) = delete;
  QueueHold& operator=(const QueueHold&) = delete;

 private:
  static constexpr uint64_t kTimeoutNs = 200'000'000;  // far past any round's queueing time
  QueueHold() = default;
  ~QueueHold() {
    if (flags_) cudaFreeHost(const_cast<int32_t*>(flags_));
  }
  void ensure_flags() {
    if (flags_) return;
    void* host = nullptr;
    NMKIT_CUDA_CHECK(cudaHostAlloc(&host, 2 * sizeof(int32_t), cudaHostAllocMapped));
    flags_ = static_cast<volatile int32_t*>(host);
    flags_[0] = 0;
    flags_[1] = 0;
    void* device = nullptr;
    NMKIT_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0));
    device_flags_ = static_cast<volatile int32_t*>(device);
  }
  bool enabled_ = true;
  int32_t ticket_ = 0;
  volatile int32_t* flags_ = nullptr;         // [0] the last ticket released, [1] a hold timed out
  volatile int32_t* device_flags_ = nullptr;  // the same memory, as the device sees it
};

// Called by a suite after each row it appends to the run's JSON: the caller saves the file, so that a run cut by a
// time limit keeps the rows it measured.
using RowDone = std::function<void()>;

// --variant's KEY=VALUE[,KEY=VALUE...]: the options of a second nmkit plan, timed beside the plan by shape in the
// same rounds. Each suite maps the keys it knows onto its plan options and names any other.
using VariantSettings = std::vector<std::pair<std::string, std::string>>;

inline VariantSettings parse_variant(const std::string& text) {
  VariantSettings parsed;
  std::istringstream list(text);
  for (std::string assignment; std::getline(list, assignment, ',');) {
    const std::size_t eq = assignment.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == assignment.size())
      throw Error(ErrorCode::invalid_argument, "--variant takes KEY=VALUE[,KEY=VALUE...], got '" + text + "'");
    parsed.emplace_back(assignment.substr(0, eq), assignment.substr(eq + 1));
  }
  return parsed;
}

inline std::string variant_text(const VariantSettings& settings) {
  std::string text;
  for (const auto& [key, value] : settings) text += (text.empty() ? "" : ",") + key + "=" + value;
  return text;
}

// One setting's value as an integer in [lo, hi], or 0/1 as a flag; errors name the key.
inline int variant_int(const std::string& key, const std::string& value, int lo, int hi) {
  std::size_t used = 0;
  int parsed = 0;
  try {
    parsed = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || parsed < lo || parsed > hi)
    throw Error(ErrorCode::invalid_argument, "--variant " + key + " must be an integer in " + std::to_string(lo) +
                                                 ".." + std::to_string(hi) + ", got '" + value + "'");
  return parsed;
}
inline bool variant_flag(const std::string& key, const std::string& value) { return variant_int(key, value, 0, 1); }

// Under sustained load the H200's clocks fall from boost by 6-25 % within the first ~30 ms (power and heat), so a
// row timed straight after its warm-up launches straddles that fall, and whichever library ran in the boost window
// gains up to ~10 %. Before timing, every library therefore runs in rotating rounds for this long (wall clock)
// first; --steady-warmup-ms sets it, 0 turns it off.
inline constexpr double kSteadyWarmupMs = 300.0;
inline double& steady_warmup_ms() {
  static double ms = kSteadyWarmupMs;
  return ms;
}

inline void warm_to_steady_state(const std::vector<std::function<void(int)>>& launches, int sets, cudaStream_t s) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  for (int round = 0; elapsed_ms() < steady_warmup_ms(); ++round) {
    for (std::size_t turn = 0; turn < launches.size(); ++turn) launches[(round + turn) % launches.size()](round % sets);
    NMKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  }
}

// Median kernel time in ms of `launch(set)` over `iters` launches after `warmup`, rotating operand sets; the timed
// launches are queued behind a QueueHold.
inline double time_median_ms(const std::function<void(int)>& launch, int sets, int warmup, int iters, cudaStream_t s) {
  for (int i = 0; i < warmup; ++i) launch(i % sets);
  warm_to_steady_state({launch}, sets, s);
  std::vector<cudaEvent_t> events(2 * iters);
  for (auto& e : events) NMKIT_CUDA_CHECK(cudaEventCreate(&e));
  QueueHold::instance().hold(s);
  for (int i = 0; i < iters; ++i) {
    NMKIT_CUDA_CHECK(cudaEventRecord(events[2 * i], s));
    launch(i % sets);
    NMKIT_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], s));
  }
  QueueHold::instance().release();
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) NMKIT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], events[2 * i], events[2 * i + 1]));
  for (auto& e : events) cudaEventDestroy(e);
  std::nth_element(ms.begin(), ms.begin() + iters / 2, ms.end());
  return ms[iters / 2];
}

// Side-by-side timing of several libraries on one product. Each round times `iters_per_round` launches of every
// library, in an order that rotates from round to round, so all of them run under the same clocks and the same
// heat. (A library timed alone in its own burst is at the mercy of what ran before it: on the H200 the bursts of
// one process gave cuSPARSELt 4-10 % more over nmkit than sustained runs of both did.) Returns each library's
// median launch time in ms.
// launch_ms, if given, receives every timed launch's time per library, in launch order (--launch-times).
inline std::vector<double> time_interleaved_ms(const std::vector<std::function<void(int)>>& launches, int sets,
                                               int warmup, int rounds, int iters_per_round, cudaStream_t s,
                                               std::vector<std::vector<float>>* launch_ms = nullptr) {
  const int libraries = static_cast<int>(launches.size());
  for (const auto& launch : launches)
    for (int i = 0; i < warmup; ++i) launch(i % sets);
  warm_to_steady_state(launches, sets, s);
  const int per_library = rounds * iters_per_round;
  std::vector<cudaEvent_t> events(2 * libraries * per_library);
  for (auto& e : events) NMKIT_CUDA_CHECK(cudaEventCreate(&e));
  auto event = [&](int library, int i, int end) -> cudaEvent_t& {
    return events[2 * (library * per_library + i) + end];
  };
  // The operand set advances with every launch, whichever library makes it, so that a library never finds the
  // inputs (B is shared) of the launches just before it in L2.
  // Each round is queued behind a QueueHold.
  int launch_count = 0;
  for (int round = 0; round < rounds; ++round) {
    QueueHold::instance().hold(s);
    for (int turn = 0; turn < libraries; ++turn) {
      const int library = (round + turn) % libraries;
      for (int j = 0; j < iters_per_round; ++j) {
        const int i = round * iters_per_round + j;
        NMKIT_CUDA_CHECK(cudaEventRecord(event(library, i, 0), s));
        launches[library](launch_count++ % sets);
        NMKIT_CUDA_CHECK(cudaEventRecord(event(library, i, 1), s));
      }
    }
    QueueHold::instance().release();
  }
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> medians(libraries);
  std::vector<float> ms(per_library);
  if (launch_ms) launch_ms->assign(libraries, {});
  for (int library = 0; library < libraries; ++library) {
    for (int i = 0; i < per_library; ++i)
      NMKIT_CUDA_CHECK(cudaEventElapsedTime(&ms[i], event(library, i, 0), event(library, i, 1)));
    if (launch_ms) (*launch_ms)[library] = ms;
    std::nth_element(ms.begin(), ms.begin() + per_library / 2, ms.end());
    medians[library] = ms[per_library / 2];
  }
  for (auto& e : events) cudaEventDestroy(e);
  return medians;
}
// The rounds that --iters launches per library make: rounds of kLaunchesPerRound, at least kMinRounds.
inline constexpr int kLaunchesPerRound = 4, kMinRounds = 3;
inline int interleaved_rounds(int iters) {
  return std::max(kMinRounds, (iters + kLaunchesPerRound - 1) / kLaunchesPerRound);
}

inline cudaDataType cuda_type(DType d) { return d == DType::f16 ? CUDA_R_16F : CUDA_R_16BF; }

// Dense D = W * B with cuBLASLt: W row-major R x K (op T on a K x R column-major view), B and D col-major.
class DenseGemm {
 public:
  DenseGemm(cublasLtHandle_t lt, const Shape& s, DType dtype, void* workspace, std::size_t workspace_bytes)
      : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&a_, cuda_type(dtype), s.k, s.r, s.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&b_, cuda_type(dtype), s.k, s.c, s.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&d_, cuda_type(dtype), s.r, s.c, s.r));
    cublasLtMatmulPreference_t pref;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_,
                                                      sizeof workspace_bytes_));
    heuristics_.resize(8);
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt_, desc_, a_, b_, d_, d_, pref, 8, heuristics_.data(), &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) throw Error(ErrorCode::cuda_error, "cuBLASLt found no algorithm");
    heuristics_.resize(found);
  }
  ~DenseGemm() {
    cublasLtMatrixLayoutDestroy(a_), cublasLtMatrixLayoutDestroy(b_), cublasLtMatrixLayoutDestroy(d_);
    cublasLtMatmulDescDestroy(desc_);
  }
  int algorithms() const { return static_cast<int>(heuristics_.size()); }
  void select(int i) { chosen_ = i; }
  void choose_fastest(const std::function<void(int)>& launch, int sets, cudaStream_t s);
  void run(const void* w, const void* b, void* d, cudaStream_t s) const {
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasLtMatmul(lt_, desc_, &alpha, w, a_, b, b_, &beta, d, d_, d, d_, &heuristics_[chosen_].algo,
                                workspace_, workspace_bytes_, s));
  }

 private:
  cublasLtHandle_t lt_;
  void* workspace_;
  std::size_t workspace_bytes_;
  cublasLtMatmulDesc_t desc_{};
  cublasLtMatrixLayout_t a_{}, b_{}, d_{};
  std::vector<cublasLtMatmulHeuristicResult_t> heuristics_;
  int chosen_ = 0;
};

// Picks the fastest of a cuBLASLt wrapper's heuristic algorithms (algorithms(), select(i)) on a short timing of
// `launch(set)` (which calls its run()) and keeps it. The candidates are timed side by side in rotating rounds, so
// they share one warm-up to settled clocks (one per candidate would add 8 x 300 ms to a row) and the same heat; each
// gets kProbeIters launches: with 5, at ~15 us per product the pick moved between processes.
inline constexpr int kProbeWarmup = 3, kProbeIters = 15;
template <class Gemm>
void choose_fastest_algorithm(Gemm& gemm, const std::function<void(int)>& launch, int sets, cudaStream_t s) {
  if (gemm.algorithms() <= 1) return;
  std::vector<std::function<void(int)>> candidates;
  for (int a = 0; a < gemm.algorithms(); ++a)
    candidates.push_back([&gemm, &launch, a](int set) {
      gemm.select(a);
      launch(set);
    });
  const std::vector<double> ms =
      time_interleaved_ms(candidates, sets, kProbeWarmup, interleaved_rounds(kProbeIters), kLaunchesPerRound, s);
  gemm.select(static_cast<int>(std::min_element(ms.begin(), ms.end()) - ms.begin()));
}
inline void DenseGemm::choose_fastest(const std::function<void(int)>& launch, int sets, cudaStream_t s) {
  choose_fastest_algorithm(*this, launch, sets, s);
}

inline double relative_error(const void* got, const void* want, int64_t count, DType dtype, cudaStream_t s) {
  DeviceArray sums(2 * sizeof(double));
  NMKIT_CUDA_CHECK(cudaMemsetAsync(sums.ptr, 0, 2 * sizeof(double), s));
  compare(got, want, count, dtype, static_cast<double*>(sums.ptr), s);
  double host[2];
  NMKIT_CUDA_CHECK(cudaMemcpyAsync(host, sums.ptr, sizeof host, cudaMemcpyDeviceToHost, s));
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  return host[1] > 0 ? std::sqrt(host[0] / host[1]) : std::sqrt(host[0]);
}

// Relative error above which a library's output is called wrong (fp16/bf16 outputs of fp32 sums land near 1e-4).
inline constexpr double kBaselineTolerance = 1e-2;

// A library call timed and checked: the median time of `launch(set)` over the operand sets, then one more launch
// of set 0, whose output `out0` is compared with the dense reference `reference0` (count elements).
struct Measured {
  double ms, rel_error;
};
// The output check alone: `out0` poisoned (all bytes 0xff, a NaN in both dtypes), one launch of set 0, the
// relative error against `reference0` (NaN where an element was left unwritten).
inline double check_output(const std::function<void(int)>& launch, void* out0, const void* reference0, int64_t count,
                           DType dtype, cudaStream_t s) {
  NMKIT_CUDA_CHECK(cudaMemsetAsync(out0, 0xff, static_cast<std::size_t>(count) * 2, s));
  launch(0);
  NMKIT_CUDA_CHECK(cudaGetLastError());
  return relative_error(out0, reference0, count, dtype, s);
}

inline Measured time_and_check(const std::function<void(int)>& launch, int sets, int warmup, int iters,
                               const void* out0, const void* reference0, int64_t count, DType dtype, cudaStream_t s) {
  const double ms = time_median_ms(launch, sets, warmup, iters, s);
  launch(0);
  return {ms, relative_error(out0, reference0, count, dtype, s)};
}

// Host time of one call of `enqueue` (validation, launch set-up, the launches themselves) in microseconds. The
// calls are queued in bursts behind a QueueHold, so that the GPU never sets the pace: without the hold, calls whose
// GPU time exceeds their host time fill the launch queue, and each call then waits for the GPU (the SparseLinear
// serving loop at T up to 4096 measured 12-17 us of GPU time this way instead of its host time). A burst stays far
// below the launch queue's depth (about a thousand launches). With --no-hold-queue the bursts are not held.
inline double host_overhead_us(const std::function<void()>& enqueue, cudaStream_t s) {
  constexpr int kWarmup = 100, kBursts = 20, kCallsPerBurst = 100;
  for (int i = 0; i < kWarmup; ++i) enqueue();
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  double total_us = 0;
  for (int burst = 0; burst < kBursts; ++burst) {
    QueueHold::instance().hold(s);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCallsPerBurst; ++i) enqueue();
    total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    QueueHold::instance().release();
    NMKIT_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  if (QueueHold::instance().timed_out())
    std::fprintf(stderr, "host_overhead_us: a queue hold timed out; the host time includes GPU time\n");
  return total_us / (kBursts * kCallsPerBurst);
}

}  // namespace nmkit::bench
