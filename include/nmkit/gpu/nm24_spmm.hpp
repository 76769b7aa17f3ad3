#pragma once
// 2:4 SpMM on the GPU: D = act(alpha * A * B + beta * C + bias), A a 2:4 weight (R x K), B dense (K x C).
//   PackedNm24 p = pack_nm24(compress_nm(w, mask, 2, 4));   // once per weight, host side
//   DeviceNm24 a = DeviceNm24::upload(p);                    // once per weight
//   Nm24SpmmPlan plan = Nm24SpmmPlan::create(desc);          // once per shape: validates, picks the kernel
//   plan.run(stream, a, b, c, d, bias);                      // one launch: no allocation, search or sync
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>
#include "nmkit/format/nm.hpp"
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
  std::vector<uint32_t> metadata;            // (fragments, 32 lanes)
};

// Packs a 2:4 matrix (f16 or bf16, any R and K). Throws Error for other patterns or dtypes.
PackedNm24 pack_nm24(const NmMatrix& a);
NmMatrix unpack_nm24(const PackedNm24& p);  // the inverse (tests, inspection)
// A packed weight in device memory (owning; move-only). Throws Error(cuda_error) where the device fails.
class DeviceNm24 {
 public:
  static DeviceNm24 upload(const PackedNm24& packed);
  static DeviceNm24 allocate(int64_t rows, int64_t cols, DType dtype);  // contents unset, for GPU producers
  DeviceNm24(DeviceNm24&&) noexcept;
  DeviceNm24& operator=(DeviceNm24&&) noexcept;
  ~DeviceNm24();
  int64_t rows() const noexcept { return rows_; }
  int64_t cols() const noexcept { return cols_; }
  int64_t rows_padded() const noexcept { return rows_padded_; }
  int64_t cols_padded() const noexcept { return cols_padded_; }
  DType dtype() const noexcept { return dtype_; }
  const void* values() const noexcept { return values_; }
  const void* metadata() const noexcept { return metadata_; }
  void* values() noexcept { return values_; }
  void* metadata() noexcept { return metadata_; }
  std::size_t value_bytes() const noexcept { return static_cast<std::size_t>(rows_padded_ * cols_padded_); }
  std::size_t metadata_bytes() const noexcept { return value_bytes() / 4; }

 private:
  DeviceNm24() = default;
  int64_t rows_ = 0, cols_ = 0, rows_padded_ = 0, cols_padded_ = 0;
  DType dtype_ = DType::f16;
  void* values_ = nullptr;
  void* metadata_ = nullptr;
};

struct SpmmDesc {                       // the problem a plan is made for
  int64_t rows = 0, cols = 0, n = 0;    // R (the weight's rows), K, C (tokens)
  DType dtype = DType::f16;             // A and B: f16 or bf16
  DType out_dtype = DType::f16;         // C and D: f16, bf16 or f32
  Layout b_layout = Layout::col_major;  // col_major: B[k, j] at j * ldb + k (x[T, K] row-major)
  Layout d_layout = Layout::col_major;  // col_major: D[r, j] at j * ldd + r (y[T, R] row-major)
  float alpha = 1.0f;
  float beta = 0.0f;  // C is read when beta != 0; it has D's layout and dtype
  bool bias = false;  // fp32 bias of length R, added per row
  Activation activation = Activation::none;
};
// sm90_wgmma_sp: Hopper, B col-major with K % 8 == 0 or row-major with C % 8 == 0; sm80_mma_sp: any shape.
enum class Nm24Kernel : uint8_t { automatic, sm80_mma_sp, sm90_wgmma_sp };
const char* kernel_name(Nm24Kernel k) noexcept;
// What a plan launches; printable (logged when NMKIT_LOG_CONFIG is set).
struct KernelConfig {
  Nm24Kernel kernel = Nm24Kernel::automatic;
  int block_m = 0, block_n = 0, block_k = 0;
  int stages = 0, threads = 0, smem_bytes = 0;
  int cluster = 1;                 // 2: two CTAs share each B tile by TMA multicast
  int raster_rows = 0;             // sm90: row tiles per raster group (0: the kernel's default)
  bool register_epilogue = false;  // sm90: 16-bit D stored from the accumulators by TMA
  int persistent_ctas = 0;         // sm90: > 0 CTAs, one per SM, loop over the tiles
  bool overlap_launch = false;     // programmatic dependent launch: the prior kernel must not write the weight
};
std::ostream& operator<<(std::ostream& os, const KernelConfig& c);
class Nm24SpmmPlan {
 public:
  // Validates desc, picks the kernel; throws Error (invalid_argument, unsupported). block_n: 0 (heuristic) or one
  // of 256, 192, 128, 64, 32, 16 (B row-major: 256, 192, 128, 64).
  static Nm24SpmmPlan create(const SpmmDesc& desc, Nm24Kernel kernel = Nm24Kernel::automatic, int block_n = 0);
  static Nm24SpmmPlan autotune(const SpmmDesc& desc);  // create(), sm90 n-tiles timed (synchronises; cached per desc)
  // Device pointers: b (K x C), c (R x C, read when beta != 0), d (R x C), bias (R floats, when desc.bias); dense
  // leading dimensions. Throws Error on a mismatched weight, null or misaligned pointers; never synchronises.
  void run(Stream stream, const DeviceNm24& a, const void* b, const void* c, void* d,
           const float* bias = nullptr) const;
  const SpmmDesc& desc() const noexcept { return desc_; }
  const KernelConfig& config() const noexcept { return config_; }

 private:
  SpmmDesc desc_;
  KernelConfig config_;
};

bool cuda_available(std::string* why_not = nullptr);  // whether a CUDA device is usable, else why not
}  // namespace nmkit::gpu
