#pragma once
// 2:4 SpMM on the GPU: D = act(alpha * A * B + beta * C + bias), A a 2:4 weight (R x K), B dense (K x C).
//
//   PackedNm24 p = pack_nm24(compress_nm(w, mask, 2, 4));   // once per weight, host side
//   DeviceNm24 a = DeviceNm24::upload(p);                    // once per weight
//   Nm24SpmmPlan plan = Nm24SpmmPlan::create(desc);          // once per shape: validates, picks the kernel
//   plan.run(stream, a, b, c, d, bias);                      // one launch: no allocation, search or sync
//
// Public headers carry no CUDA headers: streams are passed as cudaStream_t's underlying pointer type.
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "nmkit/format/nm.hpp"
#include "nmkit/matrix.hpp"

struct CUstream_st;

namespace nmkit::gpu {

using Stream = CUstream_st*;  // cudaStream_t; nullptr is the legacy default stream

// Packed layout constants (docs/formats.md, "2:4 packed for the nm24 kernels").
inline constexpr int kSlabRows = 16;       // rows of one mma.sp / wgmma.sp warp fragment
inline constexpr int kFragmentK = 32;      // logical K of one sparse MMA
inline constexpr int kPackRowAlign = 128;  // R is padded to whole thread-block tiles
inline constexpr int kPackKAlign = 64;     // K is padded to whole k-tiles
inline constexpr int kLanes = 32;
inline constexpr int kRegistersPerFragment = 4;

inline constexpr int kTileSlabs = kPackRowAlign / kSlabRows;   // 8 slabs per 128-row tile
inline constexpr int kTileKBlocks = kPackKAlign / kFragmentK;  // 2 k-blocks per 64-wide k-tile

// Position of fragment (slab, kblock) in the packed metadata, tile-major: the 16 fragments of one 128 x 64 tile
// are contiguous (2 KiB), so a kernel stages a tile's metadata with one bulk copy.
constexpr int64_t packed_fragment_index(int64_t slab, int64_t kblock, int64_t kblocks) noexcept {
  const int64_t row_tile = slab / kTileSlabs, k_tile = kblock / kTileKBlocks, k_tiles = kblocks / kTileKBlocks;
  return ((row_tile * k_tiles + k_tile) * kTileSlabs + slab % kTileSlabs) * kTileKBlocks + kblock % kTileKBlocks;
}

// The packed values of a 128 x 64 tile (8 KiB, 32 stored values per row) are contiguous too, tile-major, and laid
// out as the canonical K-major, unswizzled operand of wgmma (PTX ISA §9.7.15.5.1.2): core matrices of 8 rows x 8
// stored values (16 bytes per row, 128 contiguous bytes), ordered [k-block (2)][8-row group (16)][8-value half
// (2)]. A warpgroup's m64 x k32 operand is then one shared-memory descriptor (wgmma.mma_async.sp with A in shared
// memory: the tensor cores read it; no register loads), and a warp's mma.sp A fragment of a 16-row slab is four
// core matrices (register r = u + 2 h: row group 2 (slab % 8) + u, half h), each read by the warp as 128
// contiguous bytes (docs/formats.md).
inline constexpr int kCoreMatrixBytes = 128;                                  // 8 rows x 16 bytes
inline constexpr int kKBlockValueBytes = kPackRowAlign * kFragmentK / 2 * 2;  // 4 KiB: 128 rows x 16 stored values
inline constexpr int kTileValueBytes = kTileKBlocks * kKBlockValueBytes;      // 8 KiB
// The 32-bit word (two stored values) that register `reg` of lane `lane` holds in the A fragment (slab, kblock).
constexpr int64_t packed_value_word(int64_t slab, int64_t kblock, int64_t kblocks, int lane, int reg) noexcept {
  const int64_t tile = slab / kTileSlabs * (kblocks / kTileKBlocks) + kblock / kTileKBlocks;
  const int64_t row_group = 2 * (slab % kTileSlabs) + reg % 2, half = reg / 2;
  const int64_t byte = tile * kTileValueBytes + kblock % kTileKBlocks * kKBlockValueBytes +
                       (2 * row_group + half) * kCoreMatrixBytes + lane / 4 * 16 + lane % 4 * 4;
  return byte / 4;
}

// A 2:4 weight as the sparse MMA instructions take it: for every 16-row slab and every 32-wide k-block, each lane's
// 4 value registers (packed_value_word: in wgmma's shared-memory layout) and its metadata register (register order,
// packed_fragment_index).
struct PackedNm24 {
  int64_t rows = 0, cols = 0;                // logical R, K
  int64_t rows_padded = 0, cols_padded = 0;  // multiples of kPackRowAlign and kPackKAlign; padding is zero
  DType dtype = DType::f16;                  // f16 or bf16
  std::vector<uint32_t> values;              // (slabs x kblocks x 32 lanes x 4) words at packed_value_word()
  std::vector<uint32_t> metadata;            // (fragments, 32 lanes)
};

// Packs a 2:4 matrix (f16 or bf16, any R and K). Throws Error for other patterns or dtypes.
PackedNm24 pack_nm24(const NmMatrix& a);
// The inverse (for tests and inspection).
NmMatrix unpack_nm24(const PackedNm24& p);

// A packed weight in device memory (owning; move-only).
class DeviceNm24 {
 public:
  static DeviceNm24 upload(const PackedNm24& packed);
  // Device storage for an R x K weight in the packed layout, contents unset (for producers on the GPU).
  static DeviceNm24 allocate(int64_t rows, int64_t cols, DType dtype);
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
  // One 32-bit word per lane and fragment, half of them duplicates (lanes t and t + 2 of each quad).
  std::size_t metadata_bytes() const noexcept { return value_bytes() / 4; }

 private:
  DeviceNm24() = default;
  int64_t rows_ = 0, cols_ = 0, rows_padded_ = 0, cols_padded_ = 0;
  DType dtype_ = DType::f16;
  void* values_ = nullptr;
  void* metadata_ = nullptr;
};

// The problem a plan is made for.
struct SpmmDesc {
  int64_t rows = 0;                     // R (the weight's rows)
  int64_t cols = 0;                     // K
  int64_t n = 0;                        // C (tokens)
  DType dtype = DType::f16;             // A and B: f16 or bf16
  DType out_dtype = DType::f16;         // C and D: f16, bf16 or f32
  Layout b_layout = Layout::col_major;  // col_major: B[k, j] at j * ldb + k (x[T, K] row-major)
  Layout d_layout = Layout::col_major;  // col_major: D[r, j] at j * ldd + r (y[T, R] row-major)
  float alpha = 1.0f;
  float beta = 0.0f;  // C is read when beta != 0; it has D's layout and dtype
  bool bias = false;  // fp32 bias of length R, added per row
  Activation activation = Activation::none;
};

// sm90_wgmma_sp: the Hopper kernel, for B col-major with K % 8 == 0 and for B row-major with C % 8 == 0 (n-tiles
// 64-256 there); `automatic` takes it wherever it applies. sm80_mma_sp: the portable kernel, every shape and layout.
enum class Nm24Kernel : uint8_t { automatic, sm80_mma_sp, sm90_wgmma_sp };
const char* kernel_name(Nm24Kernel k) noexcept;

// What a plan launches; printable, and logged when NMKIT_LOG_CONFIG is set.
struct KernelConfig {
  Nm24Kernel kernel = Nm24Kernel::automatic;
  int block_m = 0, block_n = 0, block_k = 0;
  int stages = 0;
  int threads = 0;
  int smem_bytes = 0;
  int cluster = 1;  // 2: two CTAs share each B tile through TMA multicast
  // sm90: row tiles per raster group (the CTAs' tiles go in groups of this many row tiles that sweep all column
  // tiles, for L2 reuse); 0 keeps the kernel's default.
  int raster_rows = 0;
  // sm90: D's final 16-bit values go from the accumulators to D by TMA stores of 64-column parts (16-bit D,
  // beta == 0, no GELU, D's leading dimension a multiple of 8, an n-tile of 64-256) instead of the fp32 round trip
  // through the pipeline's stages; run() falls back to that staged epilogue for a D not 16-byte aligned.
  bool register_epilogue = false;
  // sm90, with the register epilogue: > 0 launches this many CTAs (one per SM) that loop over the tiles, so that
  // the next tile's operands stream in while the last tile's outputs are stored.
  int persistent_ctas = 0;
  // sm90 without multicast, on any stream but the legacy default one (NMKIT_OVERLAP_LAUNCH=0 turns it off):
  // launched with programmatic dependent launch, so that in a stream of dependent products (a model's layers) its
  // CTAs start while the kernel before it finishes (chains of decode products 8-10 % faster); their producers wait
  // for it before their first copy. The kernel launched just before run() must not write the weight.
  bool overlap_launch = false;
};
std::ostream& operator<<(std::ostream& os, const KernelConfig& c);

class Nm24SpmmPlan {
 public:
  // Validates the description and picks the kernel; throws Error (invalid_argument, unsupported).
  // block_n = 0 lets the heuristic choose the sm90 n-tile; otherwise one of 256, 192, 128, 64, 32, 16 (B row-major:
  // 256, 192, 128, 64).
  static Nm24SpmmPlan create(const SpmmDesc& desc, Nm24Kernel kernel = Nm24Kernel::automatic, int block_n = 0);
  // Like create(), but on an sm90 device times every n-tile width on the problem's shape (temporary device
  // buffers, a few launches each, synchronising) and keeps the fastest. The choice is cached per description
  // for the rest of the process, so later calls cost a map lookup.
  static Nm24SpmmPlan autotune(const SpmmDesc& desc);

  // Device pointers: b (K x C), c (R x C, only when beta != 0), d (R x C), bias (R floats, when the desc
  // says so). Leading dimensions are dense (K or C for B, R or C for C/D). Throws Error on mismatched
  // weights, null or misaligned pointers; never synchronises.
  void run(Stream stream, const DeviceNm24& a, const void* b, const void* c, void* d,
           const float* bias = nullptr) const;

  const SpmmDesc& desc() const noexcept { return desc_; }
  const KernelConfig& config() const noexcept { return config_; }

 private:
  SpmmDesc desc_;
  KernelConfig config_;
};

// True when a CUDA device is usable; `why_not` says why not otherwise.
bool cuda_available(std::string* why_not = nullptr);

}  // namespace nmkit::gpu
