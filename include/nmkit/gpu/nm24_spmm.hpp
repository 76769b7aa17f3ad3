#pragma once
// 2:4 SpMM on the GPU: D = act(alpha * A * B + beta * C + bias), A a 2:4 weight (R x K), B dense (K x C).
//   PackedNm24 p = pack_nm24(compress_nm(w, mask, 2, 4));   // once per weight, host side
//   DeviceNm24 a = DeviceNm24::upload(p);                    // once per weight
//   Nm24SpmmPlan plan = Nm24SpmmPlan::create(desc);          // once per shape: validates, picks the kernel
//   plan.run(stream, a, b, c, d, bias);                      // one launch: no allocation, search or sync
#include <cstdint>
#include <iosfwd>
#include <vector>
#include "nmkit/format/nm.hpp"
#include "nmkit/gpu/detail/device_buffer.hpp"
#include "nmkit/matrix.hpp"

struct CUstream_st;
namespace nmkit::gpu {
using Stream = CUstream_st*;  // cudaStream_t without CUDA headers; nullptr is the legacy default stream
// A 2:4 weight in the sparse MMA fragment order (docs/formats.md; index maths: detail/nm24_layout.hpp).
struct PackedNm24 {
  int64_t rows = 0, cols = 0;                // logical R, K
  int64_t rows_padded = 0, cols_padded = 0;  // multiples of 128 and 64; padding is zero
  DType dtype = DType::f16;                  // f16 or bf16
  std::vector<uint32_t> values;              // (slabs x kblocks x 32 lanes x 4) words
  std::vector<uint32_t> metadata;            // (fragments, 16 words: lanes 4g + {0, 1})
};

// Packs a 2:4 matrix (f16 or bf16, any R and K). Throws Error for other patterns or dtypes.
PackedNm24 pack_nm24(const NmMatrix& a);
NmMatrix unpack_nm24(const PackedNm24& p);  // the inverse (tests, inspection)
// A packed weight in device memory (owning; move-only). Throws Error(cuda_error) where the device fails.
class DeviceNm24 {
 public:
  static DeviceNm24 upload(const PackedNm24& packed);
  static DeviceNm24 allocate(int64_t rows, int64_t cols, DType dtype);  // contents unset, for GPU producers
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int64_t rows_padded() const noexcept { return rows_padded_; }
  int64_t cols_padded() const noexcept { return cols_padded_; }
  DType dtype() const noexcept { return dtype_; }
  void* values() const noexcept { return values_.data(); }
  void* metadata() const noexcept { return metadata_.data(); }
  std::size_t value_bytes() const noexcept { return values_.size(); }
  std::size_t metadata_bytes() const noexcept { return metadata_.size(); }

 private:
  DeviceNm24() = default;
  int64_t rows_ = 0, cols_ = 0, rows_padded_ = 0, cols_padded_ = 0;
  DType dtype_ = DType::f16;
  DeviceBuffer values_, metadata_;
};

struct SpmmDesc {                       // the problem a plan is made for
  int64_t rows = 0, cols = 0, n = 0;    // R (the weight's rows), K, C (tokens)
  DType dtype = DType::f16;             // A and B: f16 or bf16
  DType out_dtype = DType::f16;         // C and D: f16, bf16 or f32
  Layout b_layout = Layout::col_major;  // col_major: B[k, j] at j * ldb + k (x[T, K] row-major)
  Layout d_layout = Layout::col_major;  // col_major: D[r, j] at j * ldd + r (y[T, R] row-major)
  float alpha = 1.0f, beta = 0.0f;      // C is read when beta != 0; it has D's layout and dtype
  bool bias = false;                    // fp32 bias of length R, added per row
  Activation activation = Activation::none;
  int64_t ldb = 0;  // B's leading dimension in elements: 0 for dense (K col-major, C row-major), else at least that
};
// sm90_wgmma_sp: Hopper, B col-major with ldb (K) % 8 == 0 or row-major with ldb (C) % 8 == 0; sm80_mma_sp: any.
// sm80_mma_sp_skinny: any description, made for decode-sized C (up to 64 columns a CTA): 16 or 32 rows a CTA whose
// warps split K, A loaded straight into registers, B through each warp's own shared memory (or registers); on sm_90
// a cluster of CTAs may split K further.
enum class Nm24Kernel : uint8_t { automatic, sm80_mma_sp, sm90_wgmma_sp, sm80_mma_sp_skinny };
const char* kernel_name(Nm24Kernel k) noexcept;
// How the sm90 kernel's tiles leave the CTA: staged (D through the stages' shared memory, one CTA per tile, any
// epilogue), registers (16-bit D stored by TMA from the accumulators) or persistent (registers, a CTA per SM looping
// over the tiles); the last two need a 16-bit D, 64-column parts and an epilogue final in registers.
enum class Sm90Schedule : uint8_t { automatic, staged, registers, persistent };
const char* schedule_name(Sm90Schedule s) noexcept;

// How a plan runs its product. Each field defaults to the choice made by shape and device; setting it pins it, and
// create() throws Error(unsupported) where the pinned choice cannot run the description.
struct Nm24Options {
  Nm24Kernel kernel = Nm24Kernel::automatic;
  // sm90 n-tile: 256, 192, 128, 64, 32 or 16 (B row-major: 256, 192, 128 or 64); skinny: 8, 16, 32 or 64
  int block_n = 0;
  int block_m = 0;  // skinny: 16 or 32 rows a CTA
  Sm90Schedule schedule = Sm90Schedule::automatic;
  int raster_rows = 0;  // sm90: row tiles per raster group, 1..1024
  // split-K: 1..8 CTAs per tile (a cluster, sm_90), each a share of K; sm90: B col-major and block_n <= 64
  int split = 0;
  bool overlap_launch = true;  // sm90: start as the kernel before ends (which must not write the weight)
};

// What a plan launches (each plan's `config()`); printable.
struct KernelConfig {
  Nm24Kernel kernel = Nm24Kernel::automatic;
  int block_m = 0, block_n = 0, block_k = 0;
  int stages = 0, threads = 0, smem_bytes = 0;
  int raster_rows = 0;             // sm90: row tiles per raster group (0: the kernel's default)
  int split = 1;                   // sm90 and skinny: CTAs per tile (a cluster), each summing a share of K
  bool register_epilogue = false;  // sm90: 16-bit D stored from the accumulators by TMA
  int persistent_ctas = 0;         // sm90: > 0 CTAs, one per SM, loop over the tiles
  bool overlap_launch = false;     // programmatic dependent launch: the prior kernel must not write the weight
};
std::ostream& operator<<(std::ostream& os, const KernelConfig& c);
class Nm24SpmmPlan {
 public:
  // Validates desc and options, picks the kernel; throws Error (invalid_argument, unsupported).
  //   Nm24SpmmPlan::create(desc, {.kernel = Nm24Kernel::sm90_wgmma_sp, .block_n = 128});
  static Nm24SpmmPlan create(const SpmmDesc& desc, const Nm24Options& options = {});
  // create(), with the sm90 n-tile chosen by timing each on this device (synchronises; cached per description).
  static Nm24SpmmPlan autotune(const SpmmDesc& desc);
  // The plan for C = n instead of desc().n, without device queries (a layer's token counts near its planned one):
  // the portable kernel where Hopper's cannot take n, the staged epilogue where D no longer allows registers.
  // ldb: B's leading dimension for it (0: dense).
  Nm24SpmmPlan for_tokens(int64_t n, int64_t ldb = 0) const;
  // Device pointers: b (K x C, leading dimension desc.ldb), c (R x C, read when beta != 0), d (R x C), bias (R
  // floats, when desc.bias); C and D dense. Throws Error on a mismatched weight, null or misaligned pointers; never
  // synchronises.
  void run(Stream stream, const DeviceNm24& a, const void* b, const void* c, void* d,
           const float* bias = nullptr) const;
  const SpmmDesc& desc() const noexcept { return desc_; }
  const KernelConfig& config() const noexcept { return config_; }

 private:
  SpmmDesc desc_;
  KernelConfig config_;
};

}  // namespace nmkit::gpu
