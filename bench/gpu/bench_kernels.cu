// Device helpers of the benchmark: random 2:4 weights generated directly in the packed layout, their
// dense expansion for the dense and cuSPARSELt baselines, random dense operands, and a comparison.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "../../src/cuda/common/check.cuh"
#include "bench_kernels.hpp"
#include "nmkit/gpu/detail/nm24_layout.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"

namespace nmkit::bench {
namespace {

__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Uniform in +-[0.125, 1): never zero.
__device__ float random_value(uint64_t key) {
  const uint32_t h = hash32(key);
  const float mag = 0.125f + 0.875f * static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
  return (h & 1) ? -mag : mag;
}

template <class T>
__device__ uint16_t bits_of(float v) {
  const T x = static_cast<T>(v);
  return *reinterpret_cast<const uint16_t*>(&x);
}

template <class T>
__global__ void fill_dense_kernel(T* out, int64_t count, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<T>(random_value(seed * 0x9e3779b97f4a7c15ull + i));
}

// The 6 ordered index pairs of a 2:4 group.
__constant__ uint8_t kPairs[6][2] = {{0, 1}, {0, 2}, {0, 3}, {1, 2}, {1, 3}, {2, 3}};

// One thread per (slab, kblock, lane): values of the lane's 4 registers and, for lanes 4g + {0, 1}, its metadata
// word, zero (with the padding pattern) past R and K.
template <class T>
__global__ void fill_packed_kernel(uint32_t* values, uint32_t* meta, int64_t rows, int64_t cols, int64_t slabs,
                                   int64_t kblocks, uint64_t seed) {
  const int64_t id = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (id >= slabs * kblocks * 32) return;
  const int lane = static_cast<int>(id % 32);
  const int64_t block = id / 32, slab = block / kblocks, kblock = block % kblocks;
  const int g = lane / 4, t = lane % 4;
  // Metadata: this lane holds groups 4 (t % 2) .. +3 of rows g and g + 8.
  uint32_t m = 0;
  for (int upper = 0; upper < 2; ++upper)
    for (int q = 0; q < 4; ++q) {
      const int64_t row = slab * 16 + g + 8 * upper, group = kblock * 8 + 4 * (t % 2) + q;
      const bool inside = row < rows && group * 4 < cols;
      const int pair = inside ? static_cast<int>(hash32(seed ^ (row * 0x100000001b3ull + group)) % 6) : 0;
      m |= static_cast<uint32_t>(kPairs[pair][0] | (kPairs[pair][1] << 2)) << (16 * upper + 4 * q);
    }
  if (t < 2) meta[gpu::packed_meta_word(slab, kblock, kblocks, lane)] = m;
  // Values: register r = upper + 2 * high holds (row g + 8 upper, group 4 high + t, slots 0 and 1).
  for (int r = 0; r < 4; ++r) {
    const int upper = r % 2, high = r / 2;
    const int64_t row = slab * 16 + g + 8 * upper, group = kblock * 8 + 4 * high + t;
    uint32_t word = 0;
    for (int s = 0; s < 2; ++s) {
      const bool inside = row < rows && group * 4 < cols;
      const float v = inside ? random_value((seed + 17) * 0x2545f4914f6cdd1dull + (row * cols + group * 4 + s)) : 0.0f;
      word |= static_cast<uint32_t>(bits_of<T>(v)) << (16 * s);
    }
    values[gpu::packed_value_word(slab, kblock, kblocks, lane, r)] = word;
  }
}

// Expands the packed weight into a dense row-major R x K matrix (zeros elsewhere); dense must be zeroed.
template <class T>
__global__ void expand_packed_kernel(const uint32_t* values, const uint32_t* meta, T* dense, int64_t rows, int64_t cols,
                                     int64_t slabs, int64_t kblocks) {
  const int64_t id = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int lane = threadIdx.x % 32;
  const bool active = id < slabs * kblocks * 32;
  const int64_t block = id / 32, slab = block / kblocks, kblock = block % kblocks;
  const uint32_t my_meta = active ? meta[gpu::packed_meta_word(slab, kblock, kblocks, lane)] : 0;
  const int g = lane / 4, t = lane % 4;
  const uint32_t meta_low = __shfl_sync(0xffffffffu, my_meta, g * 4 + 0);   // groups 0..3
  const uint32_t meta_high = __shfl_sync(0xffffffffu, my_meta, g * 4 + 1);  // groups 4..7
  if (!active) return;
  for (int r = 0; r < 4; ++r) {
    const int upper = r % 2, high = r / 2;
    const int64_t row = slab * 16 + g + 8 * upper, group = kblock * 8 + 4 * high + t;
    const uint32_t nibble = ((high ? meta_high : meta_low) >> (16 * upper + 4 * t)) & 0xf;
    const uint32_t word = values[gpu::packed_value_word(slab, kblock, kblocks, lane, r)];
    for (int s = 0; s < 2; ++s) {
      const int64_t col = group * 4 + ((nibble >> (2 * s)) & 3);
      const uint16_t bits = static_cast<uint16_t>(word >> (16 * s));
      if (row < rows && col < cols) dense[row * cols + col] = *reinterpret_cast<const T*>(&bits);
    }
  }
}

template <class T>
__global__ void compare_kernel(const T* got, const T* want, int64_t count, double* sums) {
  double num = 0.0, den = 0.0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const double a = static_cast<float>(got[i]), b = static_cast<float>(want[i]);
    num += (a - b) * (a - b), den += b * b;
  }
  atomicAdd(&sums[0], num);
  atomicAdd(&sums[1], den);
}

// dense[r, gather[block(r), k']] = condensed[r, k']: the V:N:M weight from its condensed 2:4 matrix.
template <class T>
__global__ void scatter_columns_kernel(const T* condensed, const int32_t* gather, T* dense, int64_t rows, int64_t cols,
                                       int64_t condensed_cols, int64_t gather_stride, int gather_block_rows) {
  const int64_t count = rows * condensed_cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / condensed_cols, kc = i % condensed_cols;
    const int32_t k = gather[(r / gather_block_rows) * gather_stride + kc];
    if (k >= 0) dense[r * cols + k] = condensed[i];
  }
}

// Column k' of the row-major R x K' output is column gather[k'] of the first row block's table (the ablation's
// B rows, contiguous).
template <class T>
__global__ void gather_rows_kernel(const T* b, const int32_t* gather, T* out, int64_t k_rows, int64_t n,
                                   int64_t condensed_rows) {
  const int64_t count = condensed_rows * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t j = i / condensed_rows, kc = i % condensed_rows;  // B col-major: column j, row kc
    const int32_t k = gather[kc];
    out[i] = k >= 0 ? b[j * k_rows + k] : static_cast<T>(0.0f);
  }
}

// The dense row-major R x K weight of packed tiles (CSR of tiles): one thread per stored element.
__global__ void expand_tiles_kernel(const int32_t* row_ptr, const int32_t* col_index, const uint16_t* tiles,
                                    uint16_t* dense, int64_t rows, int64_t cols, int tile_rows, int tile_cols,
                                    int64_t nnz_tiles, int64_t grid_rows) {
  const int64_t elems = int64_t{tile_rows} * tile_cols, count = nnz_tiles * elems;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / elems, e = i % elems;
    int64_t lo = 0, hi = grid_rows;  // the tile row owning tile t: row_ptr[lo] <= t < row_ptr[lo + 1]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (row_ptr[mid] <= t)
        lo = mid;
      else
        hi = mid;
    }
    const int64_t r = lo * tile_rows + e / tile_cols, k = int64_t{col_index[t]} * tile_cols + e % tile_cols;
    if (r < rows && k < cols) dense[r * cols + k] = tiles[i];
  }
}

// out (row-major rows x cols) = in (col-major rows x cols), 16-bit elements.
__global__ void transpose_kernel(const uint16_t* in, uint16_t* out, int64_t rows, int64_t cols) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    out[i] = in[c * rows + r];
  }
}

constexpr int kThreads = 256;
unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

__device__ uint64_t global_ns() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void hold_kernel(volatile int32_t* flags, int32_t ticket, uint64_t timeout_ns) {
  const uint64_t start = global_ns();
  while (flags[0] < ticket) {
    if (global_ns() - start > timeout_ns) {
      flags[1] = 1;
      return;
    }
    __nanosleep(1000);
  }
}

}  // namespace

void hold_stream(volatile int32_t* flags, int32_t ticket, uint64_t timeout_ns, cudaStream_t s) {
  hold_kernel<<<1, 1, 0, s>>>(flags, ticket, timeout_ns);
  NMKIT_CUDA_CHECK(cudaGetLastError());
}

void fill_dense(void* out, int64_t count, DType dtype, uint64_t seed, cudaStream_t s) {
  if (dtype == DType::f16)
    fill_dense_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<__half*>(out), count, seed);
  else
    fill_dense_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(out), count, seed);
}

void fill_packed(void* values, void* meta, int64_t rows, int64_t cols, int64_t rows_padded, int64_t cols_padded,
                 DType dtype, uint64_t seed, cudaStream_t s) {
  const int64_t slabs = rows_padded / 16, kblocks = cols_padded / 32, n = slabs * kblocks * 32;
  const unsigned grid = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  if (dtype == DType::f16)
    fill_packed_kernel<__half><<<grid, kThreads, 0, s>>>(static_cast<uint32_t*>(values), static_cast<uint32_t*>(meta),
                                                         rows, cols, slabs, kblocks, seed);
  else
    fill_packed_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(
        static_cast<uint32_t*>(values), static_cast<uint32_t*>(meta), rows, cols, slabs, kblocks, seed);
}

void expand_packed(const void* values, const void* meta, void* dense, int64_t rows, int64_t cols, int64_t rows_padded,
                   int64_t cols_padded, DType dtype, cudaStream_t s) {
  const int64_t slabs = rows_padded / 16, kblocks = cols_padded / 32, n = slabs * kblocks * 32;
  const unsigned grid = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  if (dtype == DType::f16)
    expand_packed_kernel<__half><<<grid, kThreads, 0, s>>>(static_cast<const uint32_t*>(values),
                                                           static_cast<const uint32_t*>(meta),
                                                           static_cast<__half*>(dense), rows, cols, slabs, kblocks);
  else
    expand_packed_kernel<__nv_bfloat16>
        <<<grid, kThreads, 0, s>>>(static_cast<const uint32_t*>(values), static_cast<const uint32_t*>(meta),
                                   static_cast<__nv_bfloat16*>(dense), rows, cols, slabs, kblocks);
}

void compare(const void* got, const void* want, int64_t count, DType dtype, double* sums_device, cudaStream_t s) {
  if (dtype == DType::f16)
    compare_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const __half*>(got),
                                                          static_cast<const __half*>(want), count, sums_device);
  else
    compare_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(got),
                                                          static_cast<const __nv_bfloat16*>(want), count, sums_device);
}

}  // namespace nmkit::bench

namespace nmkit::bench {

void scatter_columns(const void* condensed, const int32_t* gather, void* dense, int64_t rows, int64_t cols,
                     int64_t condensed_cols, int64_t gather_stride, int gather_block_rows, cudaStream_t s) {
  const int64_t n = rows * condensed_cols;
  // Same 16-bit payload for f16 and bf16: copy the bits.
  scatter_columns_kernel<<<blocks_for(n), kThreads, 0, s>>>(static_cast<const uint16_t*>(condensed), gather,
                                                            static_cast<uint16_t*>(dense), rows, cols, condensed_cols,
                                                            gather_stride, gather_block_rows);
}

void expand_tiles(const int32_t* row_ptr, const int32_t* col_index, const void* tiles, void* dense, int64_t rows,
                  int64_t cols, int tile_rows, int tile_cols, int64_t nnz_tiles, int64_t grid_rows, cudaStream_t s) {
  const int64_t count = nnz_tiles * tile_rows * tile_cols;
  if (count == 0) return;
  expand_tiles_kernel<<<blocks_for(count), kThreads, 0, s>>>(row_ptr, col_index, static_cast<const uint16_t*>(tiles),
                                                             static_cast<uint16_t*>(dense), rows, cols, tile_rows,
                                                             tile_cols, nnz_tiles, grid_rows);
}

void transpose(const void* col_major, void* row_major, int64_t rows, int64_t cols, cudaStream_t s) {
  transpose_kernel<<<blocks_for(rows * cols), kThreads, 0, s>>>(static_cast<const uint16_t*>(col_major),
                                                                static_cast<uint16_t*>(row_major), rows, cols);
}

void gather_b_rows(const void* b, const int32_t* gather, void* out, int64_t k_rows, int64_t n, int64_t condensed_rows,
                   cudaStream_t s) {
  const int64_t count = condensed_rows * n;
  gather_rows_kernel<<<blocks_for(count), kThreads, 0, s>>>(static_cast<const uint16_t*>(b), gather,
                                                            static_cast<uint16_t*>(out), k_rows, n, condensed_rows);
}

}  // namespace nmkit::bench
