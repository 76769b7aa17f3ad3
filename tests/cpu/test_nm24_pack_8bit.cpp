// The 8-bit 2:4 packed layout: round trip, every byte and metadata nibble against the PTX ISA's description of
// wgmma.mma_async.sp m64nNk64, and a CPU emulation of the instruction over the packed bytes against the reference
// product.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "nmkit/cpu/quantized_spmm.hpp"
#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/nm24_layout_8bit.hpp"
#include "nmkit/gpu/detail/nm24_pack_8bit.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {
namespace {

// The test's own reading of the PTX ISA (9.0): a 2:4 chunk is 4 logical K elements, an instruction covers K = 64
// (32 stored bytes per row), A is K-major and unswizzled, T = 128 / 8 = 16 elements per core-matrix row.
constexpr int kChunk = 4, kInstructionK = 64, kStoredPerInstruction = 32, kT = 16;
// The tile the kernel stages (128 rows x two instructions along K) and the descriptor strides it passes.
constexpr int kTileRows = 128, kTileK = 2 * kInstructionK, kTileBytes = kTileRows * kTileK / 2;
constexpr int kLbo = 128, kSbo = 256;
constexpr int kValidNibbles[] = {0b0100, 0b1000, 0b1001, 0b1100, 0b1101, 0b1110};  // ascending index pairs

QuantizedNmMatrix random_q24(int64_t rows, int64_t cols, QuantType type, uint32_t seed) {
  const DenseMatrix w = test::random_matrix(rows, cols, DType::f32, seed);
  return quantize_nm(compress_nm(w, prune_nm_magnitude(w, 2, 4), 2, 4), type);
}

uint8_t packed_byte(const PackedNm24x8& p, int64_t at) {
  uint8_t b;
  std::memcpy(&b, reinterpret_cast<const unsigned char*>(p.values.data()) + at, 1);
  return b;
}

// Codes of row r at dense columns [0, K_padded): the stored ones at their columns, 0 elsewhere.
std::vector<uint8_t> dense_codes(const QuantizedNmMatrix& a, int64_t cols) {
  std::vector<uint8_t> d(static_cast<std::size_t>(a.rows * cols), 0);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t g = 0; g < a.groups(); ++g)
      for (int s = 0; s < 2; ++s)
        d[static_cast<std::size_t>(r * cols + a.column_of(r, g, s))] =
            a.values.codes[static_cast<std::size_t>((r * a.groups() + g) * 2 + s)];
  return d;
}

// PTX ISA §9.7.15.5.1.2.1.3 "Canonical Layouts", K-major without swizzling: ((8,m),(T,2k)):((1T,SBO),(1,LBO)) in
// elements; element (row, k) of the operand that a descriptor with start `start` describes.
int64_t canonical_k_major_offset(int64_t start, int row, int k) {
  return start + row % 8 * kT + row / 8 * kSbo + k % kT + k / kT * kLbo;
}

// PTX ISA §9.7.15.6.2.3, Figures 180 and 181 (the mma.sp m16n8k64 metadata layout of §9.7.14.6.2.6): in warp w of the
// warpgroup, bits [4q, 4q + 4) of lane 4g + t describe the chunk of row 16w + g + 8 (t % 2) that starts at logical
// column 32 (t / 2) + 4q of the instruction's 64.
struct Chunk {
  int row, first_col;
};
Chunk chunk_of(int warp, int lane, int q) {
  const int g = lane / 4, t = lane % 4;
  return {16 * warp + g + 8 * (t % 2), 32 * (t / 2) + 4 * q};
}

// Metadata fragment (slab, kblock) of the packed array, as docs/formats.md gives it: tile-major, 8 slabs x 2 k-blocks
// of 32 words per 128-row x 128-K tile.
int64_t fragment_word(int64_t slab, int64_t kblock, int64_t k_tiles, int lane) {
  const int64_t fragment = ((slab / 8 * k_tiles + kblock / 2) * 8 + slab % 8) * 2 + kblock % 2;
  return fragment * 32 + lane;
}

TEST(Nm24Pack8bit, RoundTripsWithTailsAndZeroPadding) {
  for (QuantType type : {QuantType::e4m3, QuantType::e5m2, QuantType::int8})
    for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 4}, {5, 37}, {130, 70}, {129, 257}, {200, 1000}}) {
      SCOPED_TRACE(std::string(quant_type_name(type)) + " " + std::to_string(r) + " x " + std::to_string(k));
      const QuantizedNmMatrix a = random_q24(r, k, type, static_cast<uint32_t>(r * k));
      const PackedNm24x8 p = pack_nm24(a);
      EXPECT_EQ(p.rows_padded, round_up(r, kTileRows));
      EXPECT_EQ(p.cols_padded, round_up(k, kTileK));
      ASSERT_EQ(p.values.size() * 4, static_cast<std::size_t>(p.rows_padded * p.cols_padded / 2));
      ASSERT_EQ(p.metadata.size() * 4, static_cast<std::size_t>(p.rows_padded * p.cols_padded / 8));
      const QuantizedNmMatrix back = unpack_nm24(p);
      EXPECT_EQ(back.values.codes, a.values.codes);
      EXPECT_EQ(back.indices, a.indices);
      EXPECT_EQ(back.scales, a.scales);
      EXPECT_EQ(back.type(), type);
      // Every byte that holds no stored value is zero, every padding row's scale is zero.
      std::set<int64_t> stored;
      for (int64_t row = 0; row < r; ++row)
        for (int64_t j = 0; j < a.groups() * 2; ++j) stored.insert(x8::packed_value_byte(row, j, p.cols_padded / 128));
      ASSERT_EQ(stored.size(), static_cast<std::size_t>(a.value_count()));
      for (int64_t at = 0; at < p.rows_padded * p.cols_padded / 2; ++at)
        if (!stored.count(at)) ASSERT_EQ(packed_byte(p, at), 0) << "padding byte " << at;
      for (int64_t row = r; row < p.rows_padded; ++row) ASSERT_EQ(p.scales[static_cast<std::size_t>(row)], 0.0f);
    }
}

TEST(Nm24Pack8bit, ValuesSitWhereTheWgmmaDescriptorReadsThem) {
  // Stored value j of row r belongs to tile (r / 128, j / 64), instruction b = j % 64 / 32 of it, warpgroup
  // w = r % 128 / 64, operand row r % 64 and operand column j % 32; the kernel's descriptor for (b, w) starts at
  // b * 4096 + w * 2048 in the tile, and the hardware reads the canonical layout from there.
  for (QuantType type : {QuantType::e4m3, QuantType::int8}) {
    const QuantizedNmMatrix a = random_q24(256, 384, type, 7);  // two row tiles, three k-tiles
    const PackedNm24x8 p = pack_nm24(a);
    const int64_t k_tiles = p.cols_padded / kTileK, stored_per_row = a.groups() * 2;
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t j = 0; j < stored_per_row; ++j) {
        const int64_t tile = r / kTileRows * k_tiles + j / (kTileK / 2);
        const int b = static_cast<int>(j % (kTileK / 2) / kStoredPerInstruction);
        const int w = static_cast<int>(r % kTileRows / 64);
        const int64_t start = tile * kTileBytes + b * kTileBytes / 2 + w * kTileBytes / 4;
        const int64_t at =
            canonical_k_major_offset(start, static_cast<int>(r % 64), static_cast<int>(j % kStoredPerInstruction));
        ASSERT_EQ(packed_byte(p, at), a.values.codes[static_cast<std::size_t>(r * stored_per_row + j)])
            << "row " << r << " stored value " << j;
      }
  }
  // The layout's constants are the descriptor's: what the kernel passes is what this test reads with.
  EXPECT_EQ(x8::kLeadingByteOffset, kLbo);
  EXPECT_EQ(x8::kStrideByteOffset, kSbo);
  EXPECT_EQ(x8::a_operand_offset(1, 1), kTileBytes / 2 + kTileBytes / 4);
  EXPECT_EQ(x8::kTileValueBytes, kTileBytes);
}

TEST(Nm24Pack8bit, RegisterFragmentsFollowMmaSpM16n8k64) {
  // PTX ISA §9.7.14.6.2.6: a_i (i = 0..15, register i / 4, byte i % 4) of lane 4g + t is in row g for i < 4 or
  // 8 <= i < 12, else g + 8, among the logical columns from 8t (i < 8) or 8t + 32 (i >= 8), i.e. stored value
  // 4t + i % 4 (+ 16 for i >= 8) of the instruction's 32.
  const QuantizedNmMatrix a = random_q24(130, 200, QuantType::e4m3, 9);
  const PackedNm24x8 p = pack_nm24(a);
  const std::vector<uint8_t> codes = [&] {  // stored codes by (row, stored column), zero in the padding
    std::vector<uint8_t> c(static_cast<std::size_t>(p.rows_padded * p.cols_padded / 2), 0);
    for (int64_t r = 0; r < a.rows; ++r)
      for (int64_t j = 0; j < a.groups() * 2; ++j)
        c[static_cast<std::size_t>(r * p.cols_padded / 2 + j)] =
            a.values.codes[static_cast<std::size_t>(r * a.groups() * 2 + j)];
    return c;
  }();
  const int64_t kblocks = p.cols_padded / kInstructionK;
  for (int64_t slab = 0; slab < p.rows_padded / 16; ++slab)
    for (int64_t kb = 0; kb < kblocks; ++kb)
      for (int lane = 0; lane < 32; ++lane)
        for (int i = 0; i < 16; ++i) {
          // Over the warp, each register is one 128-byte core matrix: lane l reads its word l.
          ASSERT_EQ(x8::packed_value_word(slab, kb, kblocks, lane, i / 4),
                    x8::packed_value_word(slab, kb, kblocks, 0, i / 4) + lane);
          // The skinny kernel's form of the same address: register 0's word plus a per-register constant.
          ASSERT_EQ(x8::packed_value_word(slab, kb, kblocks, lane, i / 4),
                    x8::packed_fragment_word(slab, kb, kblocks, lane) + x8::packed_register_words(i / 4));
          const int g = lane / 4, t = lane % 4;
          const int64_t row = 16 * slab + ((i < 4 || (i >= 8 && i < 12)) ? g : g + 8);
          const int64_t stored = kb * kStoredPerInstruction + 4 * t + i % 4 + (i >= 8 ? 16 : 0);
          const uint32_t word =
              p.values[static_cast<std::size_t>(x8::packed_value_word(slab, kb, kblocks, lane, i / 4))];
          ASSERT_EQ(static_cast<uint8_t>(word >> (8 * (i % 4))),
                    codes[static_cast<std::size_t>(row * p.cols_padded / 2 + stored)])
              << "slab " << slab << " k-block " << kb << " lane " << lane << " a" << i;
        }
}

TEST(Nm24Pack8bit, MetadataFollowsThePtxFigures) {
  for (QuantType type : {QuantType::e4m3, QuantType::int8}) {
    const QuantizedNmMatrix a = random_q24(150, 330, type, 5);  // tails in both dimensions
    const PackedNm24x8 p = pack_nm24(a);
    const int64_t k_tiles = p.cols_padded / kTileK, kblocks = p.cols_padded / kInstructionK;
    for (int64_t slab = 0; slab < p.rows_padded / 16; ++slab)
      for (int64_t kb = 0; kb < kblocks; ++kb)
        for (int lane = 0; lane < 32; ++lane) {
          const uint32_t word = p.metadata[static_cast<std::size_t>(fragment_word(slab, kb, k_tiles, lane))];
          for (int q = 0; q < 8; ++q) {
            const Chunk c = chunk_of(static_cast<int>(slab % 4), lane, q);
            const int64_t row = slab / 4 * 64 + c.row, group = (kb * kInstructionK + c.first_col) / kChunk;
            const uint32_t nibble = (word >> (4 * q)) & 0xf;
            uint32_t want = 0b0100;  // padding: positions 0 and 1 of zero codes
            if (row < a.rows && group < a.groups()) {
              const int64_t vi = (row * a.groups() + group) * 2;
              want = a.index(vi) | (a.index(vi + 1) << 2);
            }
            ASSERT_EQ(nibble, want) << "slab " << slab << " k-block " << kb << " lane " << lane << " nibble " << q;
            ASSERT_NE(std::find(std::begin(kValidNibbles), std::end(kValidNibbles), nibble), std::end(kValidNibbles));
          }
        }
  }
  // By hand: row 9 (g = 1, lower half), logical columns 36 and 38 (chunk 9: second 32 columns, q = 1) sit in lane
  // 4 + 1 + 2 = 7, bits [4, 8): indices 0 and 2; stored values 18 and 19, i.e. bytes 2 and 3 of register 2 + 1 = 3
  // of lane 4 + 0 = 4 (t = 0 covers the logical columns 32..39).
  DenseMatrix w = DenseMatrix::zeros(16, 64, DType::f32);
  w.set(9, 36, 1.0f), w.set(9, 38, -2.0f);
  const QuantizedNmMatrix q = quantize_nm(compress_nm(w, 2, 4), QuantType::int8);
  const PackedNm24x8 p = pack_nm24(q);
  EXPECT_EQ((p.metadata[7] >> 4) & 0xf, 0u | (2u << 2));
  EXPECT_EQ(p.metadata[5], 0x44444444u);  // lane 5: row 9, columns 0..31, all padding pattern (0, 1)
  const uint32_t reg = p.values[static_cast<std::size_t>(x8::packed_value_word(0, 0, 2, 4, 3))];
  EXPECT_EQ(static_cast<int8_t>(reg >> 16), 64);  // 1 / (2 / 127) rounds to 64 (ties to even from 63.5)
  EXPECT_EQ(static_cast<int8_t>(reg >> 24), -127);
}

// The A side of one sparse wgmma m64nNk64 step as the hardware sees a staged tile: the compressed operand read
// through the descriptor (start, LBO, SBO) in the canonical layout, expanded by the metadata registers that warps
// 0..3 load (the kernel's ld.shared.b32 of fragment (slab, b) at its lane). Returns the dense 64 x 64 A (the
// codes' values) that the instruction multiplies with B.
std::vector<double> expand_a(const PackedNm24x8& p, int64_t tile, int b, int w, QuantType type) {
  const auto* tile_bytes = reinterpret_cast<const unsigned char*>(p.values.data()) + tile * kTileBytes;
  const uint32_t* tile_metadata = p.metadata.data() + tile * (kTileRows / 16) * 2 * 32;
  std::vector<double> a(64 * kInstructionK, 0.0);
  const int64_t start = x8::a_operand_offset(b, w);
  for (int warp = 0; warp < 4; ++warp)
    for (int lane = 0; lane < 32; ++lane) {
      const int slab_in_tile = 4 * w + warp;
      const uint32_t e = tile_metadata[(slab_in_tile * 2 + b) * 32 + lane];
      for (int q = 0; q < 8; ++q) {
        const Chunk c = chunk_of(warp, lane, q);
        const unsigned i0 = (e >> (4 * q)) & 3u, i1 = (e >> (4 * q + 2)) & 3u;
        EXPECT_LT(i0, i1) << "metadata must name two distinct ascending positions";
        for (int s = 0; s < 2; ++s) {
          const int stored_col = c.first_col / 2 + s;  // two stored values per chunk, in chunk order
          const uint8_t code = tile_bytes[canonical_k_major_offset(start, c.row, stored_col)];
          a[static_cast<std::size_t>(c.row * kInstructionK + c.first_col + (s == 0 ? i0 : i1))] =
              code_value(type, code);
        }
      }
    }
  return a;
}

TEST(Nm24Pack8bit, EmulatedSparseWgmmaStepsReproduceTheReferenceProduct) {
  struct Case {
    QuantType weights, activations;
  };
  for (Case k : {Case{QuantType::e4m3, QuantType::e4m3}, Case{QuantType::e5m2, QuantType::e4m3},
                 Case{QuantType::int8, QuantType::int8}}) {
    SCOPED_TRACE(quant_type_name(k.weights));
    const int64_t rows = 200, cols = 300, tokens = 24;  // tails in R and K
    const QuantizedNmMatrix a = random_q24(rows, cols, k.weights, 21);
    const QuantizedRows x = quantize_rows(test::random_nonzero(tokens * cols, 22), tokens, cols, k.activations);
    const PackedNm24x8 p = pack_nm24(a);
    const std::vector<uint8_t> want_a = dense_codes(a, p.cols_padded);
    const int64_t k_tiles = p.cols_padded / kTileK;
    std::vector<double> acc(static_cast<std::size_t>(p.rows_padded * tokens), 0.0);
    for (int64_t rt = 0; rt < p.rows_padded / kTileRows; ++rt)
      for (int64_t kt = 0; kt < k_tiles; ++kt)
        for (int w = 0; w < 2; ++w)
          for (int b = 0; b < 2; ++b) {
            const std::vector<double> a64 = expand_a(p, rt * k_tiles + kt, b, w, k.weights);
            const int64_t row0 = rt * kTileRows + 64 * w, k0 = kt * kTileK + b * kInstructionK;
            for (int m = 0; m < 64; ++m) {
              const int64_t row = row0 + m;
              for (int kk = 0; kk < kInstructionK; ++kk) {
                const double want =
                    row < rows ? code_value(k.weights, want_a[static_cast<std::size_t>(row * p.cols_padded + k0 + kk)])
                               : 0.0;
                ASSERT_EQ(a64[static_cast<std::size_t>(m * kInstructionK + kk)], want)
                    << "A (" << row << ", " << k0 + kk << ")";
              }
              for (int64_t t = 0; t < tokens; ++t) {
                double dot = 0.0;  // exact: fp8 products and their sums here fit a double, int8 ones too
                for (int kk = 0; kk < kInstructionK; ++kk)
                  if (k0 + kk < cols)
                    dot += a64[static_cast<std::size_t>(m * kInstructionK + kk)] *
                           x.values.get(static_cast<std::size_t>(t * cols + k0 + kk));
                acc[static_cast<std::size_t>(row * tokens + t)] += dot;
              }
            }
          }
    std::vector<float> d(static_cast<std::size_t>(rows * tokens));
    quantized_spmm(a, x, {}, {d.data(), rows, tokens, Layout::row_major});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t t = 0; t < tokens; ++t) {
        // The reference's epilogue with the packed scales: alpha * scale_w * scale_x * dot in double, one rounding.
        const double scaled = static_cast<double>(1.0f) * p.scales[static_cast<std::size_t>(r)] *
                              x.scales[static_cast<std::size_t>(t)] * acc[static_cast<std::size_t>(r * tokens + t)];
        ASSERT_EQ(static_cast<float>(scaled), d[static_cast<std::size_t>(r * tokens + t)]) << r << ", " << t;
      }
  }
}

TEST(Nm24Pack8bit, RejectsOtherPatternsAndInconsistentPackings) {
  const DenseMatrix w = test::random_matrix(16, 32, DType::f32, 3);
  EXPECT_NMKIT_ERROR(pack_nm24(quantize_nm(compress_nm(w, prune_nm_magnitude(w, 2, 8), 2, 8), QuantType::int8)),
                     ErrorCode::unsupported, "2:4");
  PackedNm24x8 p = pack_nm24(random_q24(16, 32, QuantType::e4m3, 4));
  p.scales.pop_back();
  EXPECT_NMKIT_ERROR(unpack_nm24(p), ErrorCode::invalid_argument, "sizes");
}

}  // namespace
}  // namespace nmkit::gpu
