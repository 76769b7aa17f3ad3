#pragma once
// Pieces shared by the nm24 kernels: launch parameters, the packed-A fragment loader and the epilogue.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

#include <cuda_fp8.h>

#include "../common/convert.cuh"
#include "../ptx/mma_sp.cuh"
#include "../ptx/mma_sp_8bit.cuh"
#include "../ptx/wgmma_sp.cuh"
#include "../ptx/wgmma_sp_8bit.cuh"
#include "nmkit/gpu/detail/nm24_heuristics.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::gpu::nm24 {

// Everything a kernel needs; built by the plan, passed by value.
struct Params {
  const uint32_t* a_values;  // packed values (packed_value_word)
  const uint32_t* a_meta;    // packed metadata (packed_meta_word)
  const void* b;             // K x C, col-major or row-major
  const void* c;             // R x C in D's layout, read when beta != 0
  void* d;                   // R x C
  const float* bias;         // R, or null
  int64_t rows, cols, n;     // R, K, C
  int64_t kblocks;           // packed k-blocks of 32 (cols_padded / 32)
  float alpha, beta;
  Activation activation;
  bool d_col_major;
  bool b_col_major = true;  // B's layout (the sm90 kernel stages it K-major or MN-major accordingly)
  // B's leading dimension (>= K col-major, >= C row-major; check_b_shape bounds it to int32). 32 bits, where the bools
  // leave room: a wider Params tipped ptxas into spilling the n192 and n256 consumers.
  int32_t ldb = 0;
  // V:N:M (src/cuda/vnm): A is the condensed 2:4 matrix and condensed column k' of row block rb multiplies
  // B row b_gather[rb * gather_stride + k'] (kNoBRow: zeros). Null for 2:4, where column k reads B row k.
  const int32_t* b_gather = nullptr;
  int64_t gather_stride = 0;
  int gather_block_rows = kPackRowAlign;  // rows per gather row block: min(V, 128)
  // The sm90 kernel's raster: CTAs in groups of group_rows row tiles that sweep all column tiles.
  int group_rows = kSm90GroupRows;
  // The sm90 kernel's epilogue and grid (KernelConfig): register_epilogue stores D's final 16-bit values by TMA from
  // 64-column parts staged per warpgroup (sm90_epilogue::outputs_final_in_registers, D 16-byte aligned, block_n a
  // multiple of 64) instead of the fp32 round trip through the pipeline's stages;
  // persistent_ctas > 0 (which needs it) launches min(tiles, persistent_ctas) CTAs that loop over the tiles, the
  // producer streaming the next tile while the consumers store the last.
  bool register_epilogue = false;
  int persistent_ctas = 0;
};
// Where a kernel is launched: its stream, and whether it may start while the kernel before it there still runs
// (programmatic dependent launch, KernelConfig::overlap_launch). Not a Params field: one more field there tipped
// ptxas into spilling the n192 and n256 consumers (up to 940 bytes).
struct LaunchOn {
  cudaStream_t stream;
  bool overlap = false;
  int split = 1;  // split-K: CTAs per cluster, each a share of a tile's k-tiles (KernelConfig::split)
};

template <class Element>
struct ElementTraits;
// Per operand type: the MMA tag, the accumulators and the sm90 kernel's sparse wgmma (k32 steps of 16-bit values,
// k64 of 8-bit ones; either way a step is 64 bytes of a row).
template <>
struct ElementTraits<__half> {
  using Mma = ptx::MmaF16;
  using Accumulator = float;
  template <int N>
  using Wgmma = ptx::WgmmaSpSS<N, Mma>;
};
template <>
struct ElementTraits<__nv_bfloat16> {
  using Mma = ptx::MmaBF16;
  using Accumulator = float;
  template <int N>
  using Wgmma = ptx::WgmmaSpSS<N, Mma>;
};
template <>
struct ElementTraits<__nv_fp8_e4m3> {
  using Accumulator = float;
  template <int N>
  using Wgmma = ptx::WgmmaSpSS8<N, ptx::MmaE4M3>;
};
template <>
struct ElementTraits<__nv_fp8_e5m2> {
  using Accumulator = float;
  template <int N>
  using Wgmma = ptx::WgmmaSpSS8<N, ptx::MmaE5M2>;
};
// int8 codes accumulate exactly in int32; the epilogue converts each sum to fp32 once, when it applies the scales.
template <>
struct ElementTraits<int8_t> {
  using Accumulator = int32_t;
  template <int N>
  using Wgmma = ptx::WgmmaSpSS8<N, ptx::MmaS8>;
};
template <class Element>
inline constexpr bool kEightBit = sizeof(Element) == 1;

// 8-bit products accumulate dot products of codes (fp32 for fp8, int32 for int8): each becomes dot * the scale of its
// row * the scale of its token before the epilogue, which then applies alpha, bias, beta * C and the activation as for
// 16-bit operands.
struct CodeScales {
  const float* rows = nullptr;    // R_padded: the weight's per-row scales, zero in the padding
  const float* tokens = nullptr;  // C: the activations' per-token scales
};

// One lane's share of a 16 x 32 sparse fragment: 4 value registers and the metadata register.
struct AFragment {
  uint32_t values[4];
  uint32_t meta;
};

// From global memory: each register is one core matrix of the packed values, 128 contiguous bytes over the warp.
__device__ __forceinline__ AFragment load_a_fragment(const Params& p, int64_t slab, int64_t kblock, int lane) {
  AFragment a;
#pragma unroll
  for (int r = 0; r < kRegistersPerFragment; ++r)
    a.values[r] = __ldg(p.a_values + packed_value_word(slab, kblock, p.kblocks, lane, r));
  a.meta = __ldg(p.a_meta + packed_meta_word(slab, kblock, p.kblocks, lane));
  return a;
}

__device__ __forceinline__ float activate(Activation a, float x) {
  switch (a) {
    case Activation::relu:
      return fmaxf(x, 0.0f);
    case Activation::gelu:
      return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    default:
      return x;
  }
}

template <class Out>
__device__ __forceinline__ float load_out(const void* base, int64_t index) {
  if constexpr (std::is_same_v<Out, float>)
    return static_cast<const float*>(base)[index];
  else
    return static_cast<float>(static_cast<const Out*>(base)[index]);
}

template <class Out>
__device__ __forceinline__ void store_out(void* base, int64_t index, float v) {
  if constexpr (std::is_same_v<Out, float>)
    static_cast<float*>(base)[index] = v;
  else
    static_cast<Out*>(base)[index] = static_cast<Out>(v);
}

// Applies the epilogue to accumulator `acc` of D(row, col) and stores it; rows/cols past R/C are skipped.
// P: any kernel's parameters with Params' epilogue fields (d, c, bias, rows, n, alpha, beta, activation,
// d_col_major).
template <class Out, class P>
__device__ __forceinline__ void epilogue_store(const P& p, int64_t row, int64_t col, float acc) {
  if (row >= p.rows || col >= p.n) return;
  const int64_t index = p.d_col_major ? col * p.rows + row : row * p.n + col;
  float v = p.alpha * acc;
  if (p.bias) v += __ldg(p.bias + row);
  if (p.beta != 0.0f) v += p.beta * load_out<Out>(p.c, index);
  store_out<Out>(p.d, index, activate(p.activation, v));
}

using cuda::pack_pair;  // D's 16-bit pairs

// Whether the epilogue is D = alpha * acc alone (no bias, beta 0, no activation): the common case, whose stores
// (plain_store_m16n8) are a few instructions each where epilogue_store's are ~90 once unrolled over a warp's
// fragments; in kernels whose warps store rarely those cold instructions cost more than the stores.
template <class P>
__device__ __forceinline__ bool epilogue_is_plain(const P& p) {
  return p.bias == nullptr && p.beta == 0.0f && p.activation == Activation::none;
}

template <class Out, class P>
__device__ __forceinline__ void plain_store(const P& p, int64_t row, int64_t col, float acc) {
  if (row >= p.rows || col >= p.n) return;
  store_out<Out>(p.d, p.d_col_major ? col * p.rows + row : row * p.n + col, p.alpha * acc);
}

// Stores one m16n8 accumulator tile (c0,c1: row g, cols 2t, 2t+1; c2,c3: row g+8) at (row0, col0); the plain
// epilogue's version first.
template <class Out, class P>
__device__ __forceinline__ void plain_store_m16n8(const P& p, int64_t row0, int64_t col0, int lane, const float* acc) {
  const int g = lane / 4, t = lane % 4;
  plain_store<Out>(p, row0 + g, col0 + 2 * t, acc[0]);
  plain_store<Out>(p, row0 + g, col0 + 2 * t + 1, acc[1]);
  plain_store<Out>(p, row0 + g + 8, col0 + 2 * t, acc[2]);
  plain_store<Out>(p, row0 + g + 8, col0 + 2 * t + 1, acc[3]);
}

template <class Out, class P>
__device__ __forceinline__ void epilogue_store_m16n8(const P& p, int64_t row0, int64_t col0, int lane,
                                                     const float* acc) {
  const int g = lane / 4, t = lane % 4;
  epilogue_store<Out>(p, row0 + g, col0 + 2 * t, acc[0]);
  epilogue_store<Out>(p, row0 + g, col0 + 2 * t + 1, acc[1]);
  epilogue_store<Out>(p, row0 + g + 8, col0 + 2 * t, acc[2]);
  epilogue_store<Out>(p, row0 + g + 8, col0 + 2 * t + 1, acc[3]);
}

// A kernel family's CTA tile and resources, for KernelConfig.
struct TileShape {
  int block_m, block_n, block_k, stages, threads, smem_bytes;
};
TileShape sm80_tile_shape();
// The sm90 kernel's tile for block_n; a split-K launch (n-tiles of 16, 32 or 64) stages two k-tiles a stage.
TileShape sm90_tile_shape(int block_n, bool split_k = false);
bool sm90_compiled();  // whether this build holds sm_90a code for the wgmma.sp kernel

// Plan helpers shared by the nm24 and vnm plans (plan.cu); the shape heuristics are in nm24_heuristics.hpp.
inline constexpr int kMaxRasterRows = 1024;
DeviceFacts device_facts();
bool device_is_sm90();
// Throw Error (invalid_argument / unsupported) naming `who` and what is wrong.
void check_desc(const SpmmDesc& desc, const char* who);
void check_options(const Nm24Options& options, const char* who);  // the checks that need no device
void check_operands(const SpmmDesc& desc, const void* b, const void* c, const void* d, const float* bias,
                    const char* who);

// Calls f.template operator()<Element, Out>() for the description's input and output types.
template <class F>
void dispatch_types(const SpmmDesc& desc, F&& f) {
  const bool f32_out = desc.out_dtype == DType::f32;
  if (desc.dtype == DType::f16) {
    if (f32_out)
      f.template operator()<__half, float>();
    else
      f.template operator()<__half, __half>();
  } else {
    if (f32_out)
      f.template operator()<__nv_bfloat16, float>();
    else
      f.template operator()<__nv_bfloat16, __nv_bfloat16>();
  }
}
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
// The launch parameters of D = epilogue(A * B) for a packed 2:4 weight (no gather table).
Params make_params(const SpmmDesc& desc, const DeviceNm24& a, const void* b, const void* c, void* d, const float* bias);
// The sm90 kernel's epilogue, grid, raster and launch for a plan of `desc` (config.register_epilogue,
// persistent_ctas, raster_rows, overlap_launch), and for one run: the plan's choice where this D and this stream
// allow it (known only then). Throws Error(unsupported) for a pinned choice the description cannot take.
// split_k_built: the kernel of this description has a split-K instantiation.
void choose_sm90_schedule(const SpmmDesc& desc, const Nm24Options& options, int64_t k_tiles, bool split_k_built,
                          KernelConfig& config);
// A tile shape into config (a split-K schedule changes the stages of the n-tile chosen before it); config_of: a
// kernel's configuration before its schedule is chosen.
void take_tile_shape(const TileShape& t, KernelConfig& config);
KernelConfig config_of(Nm24Kernel kernel, const TileShape& t);
// Whether options pin a choice only the sm90 kernel has (its n-tile, schedule, raster or split-K): an automatic
// plan then keeps that kernel where the skinny one would otherwise take the shape.
bool sm90_choice_pinned(const Nm24Options& options);
// The skinny kernel's configuration for desc over `cols` packed columns (K, or a V:N:M weight's condensed K'): its
// tile by shape unless pinned, its split-K over a cluster (sm_90 only). Throws Error naming `who` for options the
// kernel cannot take.
KernelConfig skinny_config(const SpmmDesc& desc, int64_t cols, const Nm24Options& options, bool sm90_device,
                           const char* who);
void apply_sm90_schedule(const KernelConfig& config, const void* d, Params& p);
// A plan's configuration for desc.n and desc.ldb other than the ones it was made for (Nm24SpmmPlan::for_tokens):
// false where the Hopper kernel can no longer take desc and the caller must plan the portable kernel instead.
// b_element_gather: B is gathered element by element (V:N:M, B col-major), which takes any leading dimension.
bool sm90_config_takes_tokens(const SpmmDesc& desc, KernelConfig& config, bool b_element_gather = false);
LaunchOn launch_on(const KernelConfig& config, cudaStream_t stream);
// desc.ldb within its bounds (Error invalid_argument; unsupported past kMaxLeadingDim) and C at most kMaxTokens
// (the Hopper kernels' tensor-map coordinates are 32-bit, a last tile's boxes past C included); and B's leading
// dimension (desc.ldb, or the dense one).
inline constexpr int64_t kMaxLeadingDim = INT32_MAX;
inline constexpr int64_t kMaxTokens = int64_t{1} << 30;
void check_b_shape(const SpmmDesc& desc, const char* who);
int64_t b_leading_dim(const SpmmDesc& desc);
// Whether B's leading dimension and address allow 16-byte loads.
bool b_vector_loads(const SpmmDesc& desc, const void* b);

// Launchers, one per kernel family (explicitly instantiated in their .cu files).
template <class Element, class Out>
void launch_sm80(const Params& p, Layout b_layout, bool b_vector_loads, cudaStream_t stream);
// How the skinny kernel reads B (skinny_b_path): 16-byte chunks staged in shared memory and read by ldmatrix (B
// col-major with b_vector_loads), pairs along K by 32-bit loads into registers (B col-major with an even leading
// dimension and a 4-byte aligned base), or single elements (any B); V:N:M's rows of B gathered element by element
// through the table into the chunks' staging (any B; block_n 8 or 16).
enum class SkinnyB : uint8_t { elements, pairs, chunks, gathered };
SkinnyB skinny_b_path(const SpmmDesc& desc, const void* b);
// The skinny kernel (decode-sized C, any B and D layout): block_m 16 or 32 rows per CTA, block_n 8, 16, 32 or 64
// columns (gathered: 8 or 16). 8-bit codes (Element __nv_fp8_e4m3, __nv_fp8_e5m2 or int8_t; p.kblocks of 64): B in
// chunks, block_n 8 or 16, the dot products scaled by `scales` as launch_sm90_8bit's.
template <class Element, class Out>
void launch_skinny(const Params& p, int block_m, int block_n, SkinnyB b_path, const LaunchOn& on,
                   const CodeScales& scales = {});
TileShape skinny_tile_shape(int block_m, int block_n);
// The sm90 kernel reads B through a TMA tensor map (B col-major, K % 8 == 0, 16-byte aligned).
template <class Element, class Out>
void launch_sm90(const Params& p, int block_n, const LaunchOn& on);
// V:N:M on sm90 (p.b_gather set, p.gather_block_rows 64 or 128): B row-major needs 16-byte aligned rows and
// C % 8 == 0; B col-major has no alignment needs. block_n in {256, 128, 64} (one B tile per stage) or
// {128, 64} (two, V = 64).
template <class Element, class Out>
void launch_sm90_gather(const Params& p, int block_n, Layout b_layout, const LaunchOn& on);
// split_k: the split-K kernel's stages (row gather, n-tiles of 64, one B tile per stage).
TileShape sm90_gather_tile_shape(int block_n, int b_tiles, bool split_k = false);
// 8-bit 2:4 on sm90 (Element __nv_fp8_e4m3, __nv_fp8_e5m2 or int8_t; B col-major codes, K % 16 == 0, 16-byte
// aligned): the dot products scaled by row_scales[row] * token_scales[token] before the epilogue. block_n as
// launch_sm90's.
template <class Element, class Out>
void launch_sm90_8bit(const Params& p, const float* row_scales, const float* token_scales, int block_n,
                      const LaunchOn& on);
TileShape sm90_8bit_tile_shape(int block_n, bool split_k = false);

}  // namespace nmkit::gpu::nm24
