// nmkit_copy_probe: how fast one SM streams global memory into shared memory through Hopper's copy paths, as a
// function of the bytes and copies per pipeline round and of the rounds kept in flight. It answers "is a
// pipeline step bound by its bytes, by its copies, or by the rounds themselves?" for the kernels' producers.
//
// Each CTA streams `rounds` chunks from its own region of a 2 GiB buffer (or, L2-resident, all CTAs the same
// 1 MiB) through a ring of `depth` stages, one mbarrier each: thread 0 posts a chunk's copies into a free stage
// and, before reusing a stage, waits for the chunk in it to land. Paths:
//   tma   cp.async.bulk.tensor 2-D boxes (64 columns x rows, 128-byte swizzle), `copies` per chunk, one thread
//   bulk  one cp.async.bulk (contiguous, no tensor map) per chunk, one thread
//   lsu   cp.async 16 B per thread from 128 threads, then cp.async.mbarrier.arrive.noinc (the LSU path)
// Each line: GB/s over the grid and per SM (CUDA events, median of 5 launches after one warm-up).
// The trace section prints, for one CTA, when each round's wait returned and when its copies were issued.
//
// The issue-rate section times the copy instruction alone: one thread issues the same copy 16 times.
// Build: the `nmkit_copy_probe` target (bench/CMakeLists.txt); run it on the GPU machine, no arguments (or
// `issue` for the issue-rate section alone).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#define PROBE_CHECK(call)                                                                        \
  do {                                                                                           \
    const cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace {

enum class Path { tma, bulk, lsu };
constexpr int kThreads = 128;
[[maybe_unused]] constexpr int kMaxDepth = 16;
constexpr int kRowBytes = 128;                            // one swizzled row: 64 16-bit elements
constexpr int kRounds = 256;                              // chunks per CTA
constexpr int kTraceRounds = 16;                          // rounds of CTA 0 whose times are traced
[[maybe_unused]] constexpr uint64_t kL2Bytes = 1u << 20;  // the L2-resident stream's working set

struct Stream {
  Path path;
  uint32_t chunk_bytes;  // per round
  int copies;            // per round (tma)
  int depth;             // stages in flight
  bool l2_resident;
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
#endif

template <Path kPath>
__global__ void __launch_bounds__(kThreads, 1)
    stream_kernel(const __grid_constant__ CUtensorMap map, const unsigned char* src, uint64_t region_bytes, Stream st,
                  long long* trace, unsigned* sink) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t full[kMaxDepth];
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < st.depth; ++s)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(&full[s])),
                   "r"(kPath == Path::lsu ? kThreads : 1));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const long long start = clock64();
  const uint64_t region = st.l2_resident ? 0 : uint64_t{blockIdx.x} * region_bytes;
  const uint64_t wrap = st.l2_resident ? kL2Bytes : region_bytes;

  // Chunks are issued in order, so the issuing thread keeps running offsets and stage numbers: a division or a
  // 64-bit modulo per round would cost the single issuing thread more than the copy itself and be measured as
  // the copy's cost.
  uint64_t next_offset = 0;
  int next_stage = 0;
  const auto issue = [&]() {
    const int s = next_stage;
    next_stage = next_stage + 1 == st.depth ? 0 : next_stage + 1;
    unsigned char* dst = smem + static_cast<size_t>(s) * st.chunk_bytes;
    const uint64_t offset = region + next_offset;
    next_offset = next_offset + 2 * st.chunk_bytes > wrap ? 0 : next_offset + st.chunk_bytes;
    if constexpr (kPath == Path::lsu) {
      for (uint32_t b = tid * 16; b < st.chunk_bytes; b += kThreads * 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst + b)), "l"(src + offset + b)
                     : "memory");
      asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(&full[s])) : "memory");
    } else if (tid == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&full[s])),
                   "r"(st.chunk_bytes)
                   : "memory");
      if constexpr (kPath == Path::tma) {
        const uint32_t piece = st.chunk_bytes / st.copies;
        const auto first_row = static_cast<int32_t>(offset / kRowBytes),
                   piece_rows = static_cast<int32_t>(piece / kRowBytes);
        for (int p = 0; p < st.copies; ++p)
          asm volatile(
              "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
              "[%2];\n" ::"r"(smem_u32(dst + p * piece)),
              "l"(&map), "r"(smem_u32(&full[s])), "r"(0), "r"(first_row + p * piece_rows)
              : "memory");
      } else {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                         smem_u32(dst)),
                     "l"(src + offset), "r"(st.chunk_bytes), "r"(smem_u32(&full[s]))
                     : "memory");
      }
    }
  };

  // The TMA and bulk paths stream from thread 0 alone; the LSU path needs every thread at every round.
  unsigned touched = 0;
  if (kPath == Path::lsu || tid == 0) {
    for (int c = 0; c < st.depth && c < kRounds; ++c) issue();
    int s = 0;
    uint32_t phase = 0;
    for (int c = 0; c < kRounds; ++c) {
      asm volatile("{\n.reg .pred p;\nw:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra w;\n}\n" ::"r"(
                       smem_u32(&full[s])),
                   "r"(phase)
                   : "memory");
      touched += smem[static_cast<size_t>(s) * st.chunk_bytes + tid];
      if constexpr (kPath == Path::lsu) __syncthreads();  // every thread has waited before the stage is refilled
      const long long waited = clock64();
      if (c + st.depth < kRounds) issue();
      if (++s == st.depth) s = 0, phase ^= 1;
      if (tid == 0 && blockIdx.x == 0 && c < kTraceRounds)
        trace[2 * c] = waited - start, trace[2 * c + 1] = clock64() - start;
    }
  }
  if (touched == 0xffffffffu) sink[blockIdx.x] = touched;  // keeps the reads
#endif
}

// Issue rate: thread 0 issues kIssueCopies identical copies (the same box into the same buffer, one barrier)
// with nothing between them but a clock read, so the marks time the copy instruction alone.
constexpr int kIssueCopies = 16;
template <bool kBulk>
__global__ void __launch_bounds__(kThreads, 1)
    issue_rate_kernel(const __grid_constant__ CUtensorMap map, const unsigned char* src, uint32_t bytes,
                      long long* marks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(1024) unsigned char smem[];
  __shared__ uint64_t bar;
  if (threadIdx.x != 0) return;
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bar)));
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(&map) : "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(&bar)),
               "r"(kIssueCopies * bytes)
               : "memory");
  const uint32_t dst = smem_u32(smem), mbar = smem_u32(&bar);
  long long t[kIssueCopies + 1];
  t[0] = clock64();
#pragma unroll
  for (int i = 0; i < kIssueCopies; ++i) {
    if constexpr (kBulk)
      asm volatile(
          "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
          "l"(src), "r"(bytes), "r"(mbar)
          : "memory");
    else
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::
              "r"(dst),
          "l"(&map), "r"(mbar), "r"(0), "r"(0)
          : "memory");
    t[i + 1] = clock64();
  }
  asm volatile("{\n.reg .pred p;\nw:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n@!p bra w;\n}\n" ::"r"(mbar)
               : "memory");
  const long long landed = clock64();
#pragma unroll
  for (int i = 0; i <= kIssueCopies; ++i) marks[i] = t[i] - t[0];
  marks[kIssueCopies + 1] = landed - t[0];
#endif
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// The buffer as rows of 128 bytes (64 f16 columns), boxes of `box_rows` rows.
CUtensorMap rows_map(void* base, uint64_t bytes, uint32_t box_rows) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  PROBE_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  if (fn == nullptr) std::fprintf(stderr, "cuTensorMapEncodeTiled is not available\n"), std::exit(1);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {64, bytes / kRowBytes};
  const cuuint64_t strides[1] = {kRowBytes};
  const cuuint32_t box[2] = {64, box_rows}, element_strides[2] = {1, 1};
  const CUresult r =
      reinterpret_cast<EncodeTiled>(fn)(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, base, dims, strides, box,
                                        element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", r), std::exit(1);
  return map;
}

const char* path_name(Path p) { return p == Path::tma ? "tma" : p == Path::bulk ? "bulk" : "lsu"; }

struct Device {
  unsigned char* buffer;
  uint64_t bytes;
  int sms, clock_khz;
};

template <Path kPath>
void measure(const Device& dev, Stream st, int grid, bool print_trace = false) {
  const uint64_t region = dev.bytes / grid / st.chunk_bytes * st.chunk_bytes;
  const CUtensorMap map = rows_map(dev.buffer, dev.bytes, st.chunk_bytes / st.copies / kRowBytes);
  const size_t smem = static_cast<size_t>(st.depth) * st.chunk_bytes;
  PROBE_CHECK(
      cudaFuncSetAttribute(stream_kernel<kPath>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  long long* trace;
  unsigned* sink;
  PROBE_CHECK(cudaMalloc(&trace, 2 * kTraceRounds * sizeof(long long)));
  PROBE_CHECK(cudaMalloc(&sink, grid * sizeof(unsigned)));
  cudaEvent_t start, stop;
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int rep = 0; rep < 6; ++rep) {
    PROBE_CHECK(cudaEventRecord(start));
    stream_kernel<kPath><<<grid, kThreads, smem>>>(map, dev.buffer, region, st, trace, sink);
    PROBE_CHECK(cudaEventRecord(stop));
    PROBE_CHECK(cudaEventSynchronize(stop));
    PROBE_CHECK(cudaGetLastError());
    float ms = 0;
    PROBE_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  const double ms = times[times.size() / 2];
  const double gbs = static_cast<double>(kRounds) * st.chunk_bytes * grid / ms * 1e-6;
  std::printf(
      "%-4s %3d KiB/round %2d copies depth %2d %-3s grid %3d: %8.1f GB/s, %6.1f GB/s per SM, %.2f us per round\n",
      path_name(kPath), st.chunk_bytes / 1024, kPath == Path::tma ? st.copies : 1, st.depth,
      st.l2_resident ? "L2" : "HBM", grid, gbs, gbs / grid, ms * 1e3 / kRounds);
  if (print_trace) {
    long long t[2 * kTraceRounds];
    PROBE_CHECK(cudaMemcpy(t, trace, sizeof t, cudaMemcpyDeviceToHost));
    std::printf("     round: wait returned / next copies issued (us from the CTA's start):");
    for (int c = 0; c < kTraceRounds; ++c)
      std::printf(" %.2f/%.2f", t[2 * c] * 1e3 / dev.clock_khz, t[2 * c + 1] * 1e3 / dev.clock_khz);
    std::printf("\n");
  }
  PROBE_CHECK(cudaFree(trace));
  PROBE_CHECK(cudaFree(sink));
  PROBE_CHECK(cudaEventDestroy(start));
  PROBE_CHECK(cudaEventDestroy(stop));
}

template <bool kBulk>
void issue_rate(const Device& dev, uint32_t bytes) {
  const CUtensorMap map = rows_map(dev.buffer, dev.bytes, bytes / kRowBytes);
  PROBE_CHECK(cudaFuncSetAttribute(issue_rate_kernel<kBulk>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(bytes)));
  long long* marks;
  PROBE_CHECK(cudaMalloc(&marks, (kIssueCopies + 2) * sizeof(long long)));
  for (int rep = 0; rep < 2; ++rep) issue_rate_kernel<kBulk><<<1, kThreads, bytes>>>(map, dev.buffer, bytes, marks);
  PROBE_CHECK(cudaDeviceSynchronize());
  PROBE_CHECK(cudaGetLastError());
  long long m[kIssueCopies + 2];
  PROBE_CHECK(cudaMemcpy(m, marks, sizeof m, cudaMemcpyDeviceToHost));
  std::printf("issue rate, %s, %2u KiB, the same copy %d times (cycles after the first clock read):",
              kBulk ? "bulk" : "tma ", bytes / 1024, kIssueCopies);
  for (int i = 1; i <= kIssueCopies; ++i) std::printf(" %lld", m[i]);
  std::printf(" | all landed %lld\n", m[kIssueCopies + 1]);
  PROBE_CHECK(cudaFree(marks));
}

}  // namespace

int main(int argc, char** argv) {
  const bool issue_only = argc > 1 && std::string_view(argv[1]) == "issue";
  Device dev{};
  int device = 0, major = 0;
  PROBE_CHECK(cudaGetDevice(&device));
  PROBE_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) {
    std::printf("nmkit_copy_probe needs an sm_90 device (TMA); skipped\n");
    return 0;
  }
  PROBE_CHECK(cudaDeviceGetAttribute(&dev.sms, cudaDevAttrMultiProcessorCount, device));
  PROBE_CHECK(cudaDeviceGetAttribute(&dev.clock_khz, cudaDevAttrClockRate, device));
  dev.bytes = uint64_t{2} << 30;  // far beyond L2
  PROBE_CHECK(cudaMalloc(&dev.buffer, dev.bytes));
  PROBE_CHECK(cudaMemset(dev.buffer, 1, dev.bytes));
  const int all = dev.sms;

  std::printf("== issue rate: one thread, the same copy back to back, no other instruction between\n");
  for (uint32_t kib : {4u, 16u}) {
    issue_rate<false>(dev, kib * 1024);
    issue_rate<true>(dev, kib * 1024);
  }
  if (issue_only) return 0;
  std::printf("== depth: one TMA copy per round, 1 CTA and every SM, from HBM\n");
  for (int grid : {1, all})
    for (uint32_t kib : {4u, 16u, 32u})
      for (int depth : {1, 2, 4, 8})
        if (depth * kib <= 200) measure<Path::tma>(dev, {Path::tma, kib * 1024, 1, depth, false}, grid);
  std::printf("== bytes per round, every SM, L2-resident (64 KiB and more: several 32 KiB boxes)\n");
  for (uint32_t kib : {16u, 32u, 64u, 96u})
    measure<Path::tma>(dev, {Path::tma, kib * 1024, static_cast<int>(std::max(1u, kib / 32)), 2, true}, all);
  std::printf("== copies per round (the same bytes in more, smaller boxes), every SM, L2-resident\n");
  measure<Path::tma>(dev, {Path::tma, 16 * 1024, 4, 8, true}, all);
  measure<Path::tma>(dev, {Path::tma, 64 * 1024, 8, 2, true}, all);
  measure<Path::tma>(dev, {Path::tma, 96 * 1024, 12, 2, true}, all);
  std::printf("== paths, 1 CTA, from HBM\n");
  for (uint32_t kib : {4u, 16u}) {
    measure<Path::tma>(dev, {Path::tma, kib * 1024, 1, 8, false}, 1);
    measure<Path::bulk>(dev, {Path::bulk, kib * 1024, 1, 8, false}, 1);
    measure<Path::lsu>(dev, {Path::lsu, kib * 1024, 1, 8, false}, 1);
  }
  // The V:N:M row gather stages 32 KiB of B per k-tile with 16-byte cp.async from 128 threads, where the 2:4
  // kernel's TMA boxes move the same bytes: the two paths at that round size on every SM, from L2.
  std::printf("== paths, every SM, L2-resident, 32 KiB rounds (the gathering kernel's B per k-tile)\n");
  for (int depth : {2, 4}) {
    measure<Path::tma>(dev, {Path::tma, 32 * 1024, 1, depth, true}, all);
    measure<Path::lsu>(dev, {Path::lsu, 32 * 1024, 1, depth, true}, all);
  }
  std::printf("== where a round's time goes: 4 KiB rounds, depth 8, 1 CTA, L2-resident\n");
  measure<Path::tma>(dev, {Path::tma, 4 * 1024, 1, 8, true}, 1, true);
  PROBE_CHECK(cudaFree(dev.buffer));
  return 0;
}
