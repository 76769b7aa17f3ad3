// nmkit_mma_probe: the tensor cores' own ceiling for 2:4, measured. Every CTA (one per SM) runs two warpgroups
// that issue wgmma back to back on operands already in shared memory, as a GEMM's consumers do when loads are free:
// dense and 2:4 sparse, 16-bit and 8-bit, A from shared memory (SS, the SpMM kernels' form) or from registers
// (RS, attention's P·V). No global memory is touched in the loop, so each line is the rate the instruction itself
// sustains: its issue rate, its shared-memory reads (a sparse wgmma reads B at twice the rate per useful FLOP of a
// dense one), and the clock the board holds under that load. Its ratio sparse / dense is the most any 2:4 kernel
// can gain over a dense kernel of the same efficiency on this GPU.
//
// Each variant runs back to back for --ms of wall time (NVML samples the SM clock and the board power in the
// second half; bench/gpu/power_probe.hpp); FLOP/s are dense-equivalent (2 x 64 x N x K per warpgroup and k-tile,
// sparse or not). FLOP/clk/SM comes from the CTAs' own clock64 counts, so it needs no NVML.
// `--section narrow` times the decode kernels' narrow tiles instead (n16-n64, clk/wgmma: what one k-step costs a
// warpgroup), their k-steps in one accumulator chain or spread over independent ones.
// Build: the `nmkit_mma_probe` target (sm_90a); run it on the GPU machine: `nmkit_mma_probe [--ms 1500]`.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "../../src/cuda/common/check.cuh"
#include "../../src/cuda/ptx/address.cuh"
#include "../../src/cuda/ptx/wgmma.cuh"
#include "../../src/cuda/ptx/wgmma_rs.cuh"
#include "../../src/cuda/ptx/wgmma_sp.cuh"
#include "../../src/cuda/ptx/wgmma_sp_8bit.cuh"
#include "../../src/cuda/ptx/wgmma_ss.cuh"
#include "../../src/cuda/ptx/wgmma_ss_8bit.cuh"
#include "power_probe.hpp"

namespace {

using namespace nmkit;

constexpr int kWarpgroups = 2;  // the SpMM kernels' consumers
constexpr int kThreads = 128 * kWarpgroups;
constexpr int kRowBytes = 128;  // one 128-byte-swizzled K-major row: a k-tile
constexpr int kATileRows = 64;  // one warpgroup's rows
constexpr int kMaxN = 256;
constexpr int kABytes = kATileRows * kRowBytes;
constexpr int kBBytes = kMaxN * kRowBytes;
constexpr int kSmemBytes = kWarpgroups * kABytes + kBBytes + 1024;  // + the 1024-byte alignment of swizzle atoms

enum class Element { f16, bf16, e4m3, s8 };

// Random values of a moderate magnitude (|x| in [0.25, 1) for the floating types, any byte for int8), so that the
// tensor cores toggle as on real data and the accumulators stay finite.
__device__ uint32_t mix(uint32_t x) {
  x ^= x >> 16, x *= 0x7feb352du, x ^= x >> 15, x *= 0x846ca68bu, x ^= x >> 16;
  return x;
}

template <Element kElement>
__device__ uint32_t random_word(uint32_t seed) {
  const uint32_t r = mix(seed), e = mix(seed ^ 0x9e3779b9u);
  if constexpr (kElement == Element::f16) {  // exponent 13 or 14 (bias 15)
    const uint32_t lo = (r & 0x83ffu) | ((13u + (e & 1u)) << 10),
                   hi = ((r >> 16) & 0x83ffu) | ((13u + ((e >> 1) & 1u)) << 10);
    return lo | (hi << 16);
  } else if constexpr (kElement == Element::bf16) {  // exponent 125 or 126 (bias 127)
    const uint32_t lo = (r & 0x807fu) | ((125u + (e & 1u)) << 7),
                   hi = ((r >> 16) & 0x807fu) | ((125u + ((e >> 1) & 1u)) << 7);
    return lo | (hi << 16);
  } else if constexpr (kElement == Element::e4m3) {  // exponent 5 or 6 (bias 7)
    uint32_t word = 0;
    for (int i = 0; i < 4; ++i) word |= (((r >> (8 * i)) & 0x87u) | ((5u + ((e >> i) & 1u)) << 3)) << (8 * i);
    return word;
  } else {
    return r;
  }
}

// Valid 2:4 metadata: every nibble names two distinct positions of its group of four, in order.
__device__ uint32_t random_metadata(uint32_t seed) {
  constexpr uint32_t kPairs[6] = {0x4, 0x8, 0xc, 0x9, 0xd, 0xe};
  uint32_t e = 0;
  for (int i = 0; i < 8; ++i) e |= kPairs[mix(seed + i) % 6] << (4 * i);
  return e;
}

// One variant: the instruction, its element, how many of it cover a k-tile of 128 bytes of B per row, and how many
// independent accumulator chains the k-steps alternate between (1: every wgmma accumulates into the one before).
template <Element kElement, bool kSparse_, bool kRegisterA, int kN_, int kChains_ = 1>
struct Variant {
  static constexpr bool kInt = kElement == Element::s8;
  static constexpr bool kSparse = kSparse_;
  static constexpr int kN = kN_;
  static constexpr Element kType = kElement;
  static constexpr int kElementBytes = kElement == Element::f16 || kElement == Element::bf16 ? 2 : 1;
  static constexpr int kKPerInstr = (kElementBytes == 2 ? 16 : 32) * (kSparse ? 2 : 1);
  static constexpr int kKTile = kRowBytes / kElementBytes;
  static constexpr int kInstrPerTile = kKTile / kKPerInstr;
  static constexpr int kBStepBytes = kKPerInstr * kElementBytes;
  static constexpr int kAStepBytes = kBStepBytes / (kSparse ? 2 : 1);  // A holds the kept half
  static constexpr int kAccumulators = kN / 2;
  static constexpr int kChains = kChains_;
  // Tiles per unrolled iteration, so that every step's chain is known at compile time.
  static constexpr int kTilesPerRound = kChains > kInstrPerTile ? kChains / kInstrPerTile : 1;
  static_assert(kChains <= kInstrPerTile ? kInstrPerTile % kChains == 0 : kChains % kInstrPerTile == 0);
  using Accumulator = std::conditional_t<kInt, int32_t, float>;
  using Mma16 = std::conditional_t<kElement == Element::bf16, ptx::MmaBF16, ptx::MmaF16>;
  using Mma8 = std::conditional_t<kElement == Element::s8, ptx::MmaS8, ptx::MmaE4M3>;

  __device__ static void mma(Accumulator (&d)[kAccumulators], uint64_t desc_a, const uint32_t (&a)[4], uint64_t desc_b,
                             uint32_t e) {
    if constexpr (kRegisterA && kSparse)
      ptx::WgmmaSpRS<kN, Mma16>::template mma<0>(d, a, desc_b, e, 1);
    else if constexpr (kRegisterA)
      ptx::WgmmaRS<kN, Mma16>::template mma<0>(d, a, desc_b, 1);
    else if constexpr (kElementBytes == 2 && kSparse)
      ptx::WgmmaSpSS<kN, Mma16>::template mma<0>(d, desc_a, desc_b, e, 1);
    else if constexpr (kElementBytes == 2)
      ptx::WgmmaSS<kN, Mma16>::mma(d, desc_a, desc_b, 1);
    else if constexpr (kSparse)
      ptx::WgmmaSpSS8<kN, Mma8>::template mma<0>(d, desc_a, desc_b, e, 1);
    else
      ptx::WgmmaSS8<kN, Mma8>::mma(d, desc_a, desc_b, 1);
  }
};

struct CtaCount {
  unsigned long long cycles;
  float sink;  // keeps the accumulators live; never read
};

template <class V>
__global__ void __launch_bounds__(kThreads, 1) mma_loop(int k_tiles, uint32_t seed, CtaCount* counts) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  constexpr Element kElement = V::kType;
  auto* words = reinterpret_cast<uint32_t*>(smem);
  for (int i = threadIdx.x; i < (kWarpgroups * kABytes + kBBytes) / 4; i += kThreads)
    words[i] = random_word<kElement>(seed + i * 2654435761u + blockIdx.x);
  ptx::fence_proxy_async_shared();
  __syncthreads();

  const int warpgroup = threadIdx.x / 128;
  const uint64_t desc_a = ptx::make_smem_desc_k_major_sw128(ptx::smem_address(smem + warpgroup * kABytes));
  const uint64_t desc_b = ptx::make_smem_desc_k_major_sw128(ptx::smem_address(smem + kWarpgroups * kABytes));
  uint32_t a[4];
  for (int i = 0; i < 4; ++i) a[i] = random_word<kElement>(seed ^ (threadIdx.x * 4 + i));
  const uint32_t e = random_metadata(seed + threadIdx.x);
  typename V::Accumulator d[V::kChains][V::kAccumulators] = {};

  const unsigned long long start = clock64();
  for (int tile = 0; tile < k_tiles; tile += V::kTilesPerRound) {
#pragma unroll
    for (int t = 0; t < V::kTilesPerRound; ++t) {
      ptx::wgmma_fence();
#pragma unroll
      for (int k = 0; k < V::kInstrPerTile; ++k)
        V::mma(d[(t * V::kInstrPerTile + k) % V::kChains], ptx::advance_smem_desc(desc_a, k * V::kAStepBytes), a,
               ptx::advance_smem_desc(desc_b, k * V::kBStepBytes), e);
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<1>();  // one group in flight, as the SpMM consumers keep
    }
  }
  ptx::wgmma_wait_group<0>();
  const unsigned long long cycles = clock64() - start;
  float sum = 0;
  for (int c = 0; c < V::kChains; ++c)
    for (int i = 0; i < V::kAccumulators; ++i) sum += static_cast<float>(d[c][i]);
  if (threadIdx.x == 0) counts[blockIdx.x] = {cycles, sum};
#endif
}

struct Result {
  std::string name;
  std::string family;  // the variants of a family compare sparse against dense
  bool sparse = false;
  double tflops = 0, sm_mhz = 0, watts = 0, flop_per_clk_per_sm = 0;
  double clk_per_wgmma = 0;  // a warpgroup's cycles per instruction
};

template <class V>
Result measure(const std::string& name, const std::string& family, int sms, double ms, bench::PowerProbe& power,
               cudaStream_t stream) {
  constexpr int kTilesPerLaunch = 4096;
  NMKIT_CUDA_CHECK(cudaFuncSetAttribute(mma_loop<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  CtaCount* counts = nullptr;
  NMKIT_CUDA_CHECK(cudaMalloc(&counts, sms * sizeof(CtaCount)));
  const auto launch = [&](int set) {
    mma_loop<V><<<sms, kThreads, kSmemBytes, stream>>>(kTilesPerLaunch, 0x1234u + set, counts);
    NMKIT_CUDA_CHECK(cudaGetLastError());
  };
  for (int i = 0; i < 3; ++i) launch(i);
  NMKIT_CUDA_CHECK(cudaStreamSynchronize(stream));

  const double flops_per_cta = 2.0 * kATileRows * V::kN * V::kKTile * kWarpgroups * double(kTilesPerLaunch);
  Result r{name, family, V::kSparse};
  if (power.available()) {
    const bench::SustainedRun run = power.run(launch, 4, ms, stream);
    r.tflops = flops_per_cta * sms / (run.ms_per_launch * 1e-3) / 1e12;
    r.sm_mhz = run.sm_mhz, r.watts = run.watts;
  } else {  // events over a fixed count of launches
    cudaEvent_t start, stop;
    NMKIT_CUDA_CHECK(cudaEventCreate(&start));
    NMKIT_CUDA_CHECK(cudaEventCreate(&stop));
    constexpr int kLaunches = 200;
    NMKIT_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < kLaunches; ++i) launch(i);
    NMKIT_CUDA_CHECK(cudaEventRecord(stop, stream));
    NMKIT_CUDA_CHECK(cudaEventSynchronize(stop));
    float elapsed = 0;
    NMKIT_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
    r.tflops = flops_per_cta * sms * kLaunches / (elapsed * 1e-3) / 1e12;
    NMKIT_CUDA_CHECK(cudaEventDestroy(start));
    NMKIT_CUDA_CHECK(cudaEventDestroy(stop));
  }
  std::vector<CtaCount> host(sms);
  NMKIT_CUDA_CHECK(cudaMemcpy(host.data(), counts, sms * sizeof(CtaCount), cudaMemcpyDeviceToHost));
  NMKIT_CUDA_CHECK(cudaFree(counts));
  std::vector<double> cycles;
  for (const CtaCount& c : host) cycles.push_back(static_cast<double>(c.cycles));
  std::nth_element(cycles.begin(), cycles.begin() + sms / 2, cycles.end());
  r.flop_per_clk_per_sm = flops_per_cta / cycles[sms / 2];
  r.clk_per_wgmma = cycles[sms / 2] / (double(kTilesPerLaunch) * V::kInstrPerTile);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"nmkit_mma_probe: dense and 2:4 wgmma rates with operands in shared memory (the tensor cores' ceiling)"};
  double ms = 1500;
  app.add_option("--ms", ms, "Wall time each variant runs for (NVML samples its second half)")
      ->check(CLI::Range(50.0, 60000.0))
      ->capture_default_str();
  std::string section = "ceiling";
  app.add_option("--section", section,
                 "ceiling: the n256 / n128 rates; narrow: n16-n64 2:4 tiles with 1, 2 or 4 accumulator chains (the "
                 "latency of a k-step when the tile is too narrow to hide it); all")
      ->check(CLI::IsMember({"ceiling", "narrow", "all"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  int device = 0, sms = 0, major = 0;
  NMKIT_CUDA_CHECK(cudaGetDevice(&device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  NMKIT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major != 9) {
    std::fprintf(stderr, "nmkit_mma_probe: needs an sm_90 GPU (wgmma), this one is sm_%d.x\n", major);
    return 2;
  }
  cudaStream_t stream;
  NMKIT_CUDA_CHECK(cudaStreamCreate(&stream));
  bench::PowerProbe power(device);
  if (!power.available()) std::printf("# NVML unavailable (%s): no clock or power columns\n", power.why_unavailable());

  std::vector<Result> results;
  if (section != "narrow") {
    // 16-bit, A in shared memory (the SpMM kernels), n256 as their 128 x 256 tiles.
    results.push_back(
        measure<Variant<Element::f16, false, false, 256>>("f16 SS m64n256k16", "f16 SS n256", sms, ms, power, stream));
    results.push_back(measure<Variant<Element::f16, true, false, 256>>("f16 SS sp m64n256k32", "f16 SS n256", sms, ms,
                                                                       power, stream));
    results.push_back(measure<Variant<Element::bf16, false, false, 256>>("bf16 SS m64n256k16", "bf16 SS n256", sms, ms,
                                                                         power, stream));
    results.push_back(measure<Variant<Element::bf16, true, false, 256>>("bf16 SS sp m64n256k32", "bf16 SS n256", sms,
                                                                        ms, power, stream));
    // 8-bit, the fp8 / int8 2:4 kernels' instructions.
    results.push_back(measure<Variant<Element::e4m3, false, false, 256>>("e4m3 SS m64n256k32", "e4m3 SS n256", sms, ms,
                                                                         power, stream));
    results.push_back(measure<Variant<Element::e4m3, true, false, 256>>("e4m3 SS sp m64n256k64", "e4m3 SS n256", sms,
                                                                        ms, power, stream));
    results.push_back(
        measure<Variant<Element::s8, false, false, 256>>("s8 SS m64n256k32", "s8 SS n256", sms, ms, power, stream));
    results.push_back(
        measure<Variant<Element::s8, true, false, 256>>("s8 SS sp m64n256k64", "s8 SS n256", sms, ms, power, stream));
    // A from registers, n128: attention's P·V at d = 128.
    results.push_back(measure<Variant<Element::bf16, false, true, 128>>("bf16 RS m64n128k16", "bf16 RS n128", sms, ms,
                                                                        power, stream));
    results.push_back(measure<Variant<Element::bf16, true, true, 128>>("bf16 RS sp m64n128k32", "bf16 RS n128", sms, ms,
                                                                       power, stream));
  }
  // Narrow tiles (the decode and small-grid kernels): what one k-step costs a warpgroup, its wgmma accumulating into
  // one chain or spread over 2 or 4 independent ones (would the chain's latency bind a narrow tile's k-loop?).
  if (section != "ceiling") {
    // The family "f16 nN xC" pairs the sparse instruction with the dense one of its width (n16 only).
    const auto narrow = [&]<bool kSparse, int kN, int kChains>() {
      const std::string n = std::to_string(kN), chains = " x" + std::to_string(kChains);
      results.push_back(measure<Variant<Element::f16, kSparse, false, kN, kChains>>(
          (kSparse ? "f16 SS sp m64n" + n + "k32" : "f16 SS m64n" + n + "k16") + chains, "f16 n" + n + chains, sms, ms,
          power, stream));
    };
    narrow.template operator()<false, 16, 1>();
    narrow.template operator()<true, 16, 1>();
    narrow.template operator()<true, 16, 2>();
    narrow.template operator()<true, 16, 4>();
    narrow.template operator()<true, 32, 1>();
    narrow.template operator()<true, 32, 2>();
    narrow.template operator()<true, 32, 4>();
    narrow.template operator()<true, 64, 1>();
    narrow.template operator()<true, 64, 2>();
    narrow.template operator()<true, 64, 4>();
    narrow.template operator()<true, 256, 1>();
  }

  std::printf("%-24s %10s %8s %7s %13s %10s %13s %13s\n", "variant", "TFLOP/s", "SM MHz", "W", "FLOP/clk/SM",
              "clk/wgmma", "sp/dense rate", "sp/dense clk");
  for (const Result& r : results) {
    std::printf("%-24s %10.0f %8.0f %7.0f %13.0f %10.1f", r.name.c_str(), r.tflops, r.sm_mhz, r.watts,
                r.flop_per_clk_per_sm, r.clk_per_wgmma);
    const auto dense = std::find_if(results.begin(), results.end(),
                                    [&](const Result& o) { return o.family == r.family && !o.sparse; });
    if (r.sparse && dense != results.end())
      std::printf(" %12.2fx %12.2fx", r.tflops / dense->tflops, r.flop_per_clk_per_sm / dense->flop_per_clk_per_sm);
    std::printf("\n");
  }
  NMKIT_CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
