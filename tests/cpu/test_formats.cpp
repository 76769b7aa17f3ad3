// Round trips, pattern checks and storage accounting of the three formats.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>

#include "nmkit/error.hpp"
#include "nmkit/format/bit_packing.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

using test::expect_same_matrix;
using test::random_matrix;

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr std::pair<int64_t, int64_t> kShapes[] = {{1, 1}, {3, 5}, {7, 33}, {16, 64}, {17, 100}, {40, 131}};

// ---------------------------------------------------------------- bit streams

// Every width the formats pack (1..kMaxPackedBits), values written in a scrambled order over a stream of noise, then
// each overwritten once: every value reads back and no neighbour's bits move.
TEST(BitPacking, WritesAndReadsEveryWidthWithoutTouchingNeighbours) {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= kMaxPackedBits; ++bits) {
    constexpr std::size_t kCount = 301;  // an odd count: the stream's last value ends inside a byte
    std::vector<uint8_t> stream(packed_bytes(kCount, bits));
    for (uint8_t& byte : stream) byte = static_cast<uint8_t>(rng());
    std::vector<unsigned> want(kCount);
    std::vector<std::size_t> order(kCount);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::shuffle(order.begin(), order.end(), rng);
    for (int pass = 0; pass < 2; ++pass)
      for (std::size_t i : order) {
        want[i] = static_cast<unsigned>(rng()) & ((1u << bits) - 1u);
        write_packed(stream, i, bits, want[i] | (1u << bits));  // a bit above the width must be dropped
      }
    for (std::size_t i = 0; i < kCount; ++i) ASSERT_EQ(read_packed(stream, i, bits), want[i]) << bits << " bits, " << i;
  }
}

// ---------------------------------------------------------------- N:M
TEST(NmFormat, RoundTripEveryDtypeShapeAndPattern) {
  const std::pair<int, int> patterns[] = {{2, 4}, {1, 2}, {2, 8}, {3, 7}, {4, 16}, {2, 32}, {1, 5}};
  uint32_t seed = 1;
  for (DType dtype : kDTypes)
    for (auto [rows, cols] : kShapes)
      for (auto [n, m] : patterns) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << rows << "x" << cols << " " << n << ":" << m);
        const DenseMatrix dense = random_matrix(rows, cols, dtype, seed++);
        const Mask mask = prune_nm_magnitude(dense, n, m);
        const NmMatrix a = compress_nm(dense, mask, n, m);
        EXPECT_NO_THROW(validate(a));
        const DenseMatrix pruned = apply_mask(dense, mask);
        expect_same_matrix(decompress(a), pruned);
        // Compressing the pruned matrix without a mask gives the same bytes.
        const NmMatrix again = compress_nm(pruned, n, m);
        EXPECT_EQ(again.indices, a.indices);
        EXPECT_EQ(again.values.to_float(), a.values.to_float());
      }
}

TEST(NmFormat, RejectsTooManyNonZerosNamingRowAndGroup) {
  DenseMatrix dense = DenseMatrix::zeros(5, 12, DType::f16);
  dense.set(3, 8, 1.0f), dense.set(3, 9, 2.0f), dense.set(3, 11, 3.0f);  // 3 of 4 in row 3, group 2
  EXPECT_NMKIT_ERROR(compress_nm(dense, 2, 4), ErrorCode::pattern_violation, "row 3, group 2");
  EXPECT_NO_THROW(compress_nm(dense, 3, 4));
}

TEST(NmFormat, ValidateNamesCorruption) {
  const DenseMatrix dense = random_matrix(4, 10, DType::f32, 3);
  const NmMatrix good = compress_nm(dense, prune_nm_magnitude(dense, 2, 5), 2, 5);  // 3-bit indices
  {
    NmMatrix a = good;  // index >= M
    write_packed(a.indices, 2 * 2 + 1, a.index_bits(), 7);
    EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "row 1, group 0");
  }
  {
    NmMatrix a = good;  // descending indices
    write_packed(a.indices, 0, a.index_bits(), 4);
    write_packed(a.indices, 1, a.index_bits(), 1);
    EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "ascending");
  }
  {
    NmMatrix a = good;  // truncated values
    a.values = TypedBuffer(DType::f32, a.values.size() - 1);
    EXPECT_NMKIT_ERROR(validate(a), ErrorCode::invalid_argument, "values");
  }
  EXPECT_NMKIT_ERROR(check_nm_pattern(4, 4), ErrorCode::invalid_argument, "N < M");
  EXPECT_NMKIT_ERROR(check_nm_pattern(2, 33), ErrorCode::invalid_argument, "M <= 32");
}

TEST(NmFormat, PaddingMustStayZero) {
  // K = 6 with M = 4: the second group has two real columns and two padding positions.
  const DenseMatrix dense = random_matrix(2, 6, DType::f32, 5);
  NmMatrix a = compress_nm(dense, prune_nm_magnitude(dense, 2, 4), 2, 4);
  EXPECT_EQ(a.groups(), 2);
  write_packed(a.indices, 2, a.index_bits(), 2);  // row 0, group 1 now points into the padding
  write_packed(a.indices, 3, a.index_bits(), 3);
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "padding");
}

TEST(NmFormat, UnusedBitsOfTheIndexStreamMustBeZero) {
  // One row of 2:4 over K = 4: two 2-bit indices, so the stream's only byte has four unused high bits.
  const DenseMatrix dense = random_matrix(1, 4, DType::f32, 6);
  NmMatrix a = compress_nm(dense, prune_nm_magnitude(dense, 2, 4), 2, 4);
  ASSERT_EQ(a.indices.size(), 1u);
  EXPECT_NO_THROW(validate(a));
  a.indices[0] |= 0xF0;
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::invalid_argument, "unused high bits");
}

TEST(NmFormat, StorageAccountingMatchesTheLecture) {
  EXPECT_DOUBLE_EQ(nm_storage_ratio(2, 4, 16), 0.5625);  // FP16 2:4
  EXPECT_DOUBLE_EQ(nm_storage_ratio(2, 4, 8), 0.625);    // INT8 2:4
  const DenseMatrix dense = random_matrix(64, 128, DType::f16, 9);
  const NmMatrix a = compress_nm(dense, prune_nm_magnitude(dense, 2, 4), 2, 4);
  EXPECT_EQ(storage_bytes(a), 64u * 128u * 2u * 9u / 16u);  // exactly 56.25 % of dense bytes
  EXPECT_EQ(a.indices.size(), 64u * 64u * 2u / 8u);
}

// ---------------------------------------------------------------- V:N:M
TEST(VnmFormat, RoundTripEveryDtypeShapeAndPattern) {
  const std::tuple<int, int, int> patterns[] = {{16, 2, 8}, {32, 2, 5}, {4, 1, 7},   {64, 2, 10},
                                                {16, 2, 4}, {8, 2, 20}, {2, 2, 100}, {128, 2, 16}};
  uint32_t seed = 100;
  for (DType dtype : kDTypes)
    for (auto [rows, cols] : kShapes)
      for (auto [v, n, m] : patterns) {
        SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << rows << "x" << cols << " " << v << ":" << n
                                        << ":" << m);
        const DenseMatrix dense = random_matrix(rows, cols, dtype, seed++);
        const Mask mask = prune_vnm_magnitude(dense, v, n, m);
        const VnmMatrix a = compress_vnm(dense, mask, v, n, m);
        EXPECT_NO_THROW(validate(a));
        const DenseMatrix pruned = apply_mask(dense, mask);
        expect_same_matrix(decompress(a), pruned);
        expect_same_matrix(decompress(compress_vnm(pruned, v, n, m)), pruned);
      }
}

TEST(VnmFormat, RejectsAFifthColumnNamingTheBlock) {
  DenseMatrix dense = DenseMatrix::zeros(8, 16, DType::bf16);    // V=4, M=8: 2 row blocks x 2 groups
  for (int c = 8; c < 13; ++c) dense.set(4 + (c % 4), c, 1.0f);  // 5 columns of block (1, 1)
  EXPECT_NMKIT_ERROR(compress_vnm(dense, 4, 2, 8), ErrorCode::pattern_violation, "row block 1, group 1");
}

TEST(VnmFormat, RejectsThreeValuesInARow) {
  DenseMatrix dense = DenseMatrix::zeros(4, 8, DType::f16);
  dense.set(2, 0, 1.0f), dense.set(2, 3, 1.0f), dense.set(2, 5, 1.0f);
  EXPECT_NMKIT_ERROR(compress_vnm(dense, 4, 2, 8), ErrorCode::pattern_violation, "row 2, group 0");
}

TEST(VnmFormat, ValidateRejectsBadColumnLoc) {
  const DenseMatrix dense = random_matrix(8, 16, DType::f16, 11);
  const VnmMatrix good = compress_vnm(dense, prune_vnm_magnitude(dense, 4, 2, 8), 4, 2, 8);
  VnmMatrix a = good;
  a.column_loc[5] = 8;  // block 0 / group 1, slot 1: out of range
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, ">= M=8");
  a = good;
  std::swap(a.column_loc[0], a.column_loc[1]);  // unsorted
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "not strictly ascending");
  a = good;
  a.column_loc[1] = a.column_loc[0];  // duplicate
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "row block 0, group 0");
  a = good;
  a.column_loc.pop_back();
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::invalid_argument, "column_loc holds");
  EXPECT_NMKIT_ERROR(check_vnm_pattern(64, 3, 8), ErrorCode::invalid_argument, "N in {1, 2}");
  EXPECT_NMKIT_ERROR(check_vnm_pattern(64, 2, 3), ErrorCode::invalid_argument, "4 <= M");
}

TEST(VnmFormat, StorageOverheadMatchesThePaper) {
  // Seed 000 §3: for V=128 the metadata overhead over the values is about 13.28 %.
  EXPECT_NEAR(vnm_storage_ratio(128, 2, 8, 16) / (2.0 / 8.0) - 1.0, 0.1328, 1e-4);
  const DenseMatrix dense = random_matrix(256, 64, DType::f16, 12);
  const VnmMatrix a = compress_vnm(dense, prune_vnm_magnitude(dense, 128, 2, 8), 128, 2, 8);
  EXPECT_EQ(storage_bytes(a), static_cast<std::size_t>(vnm_storage_ratio(128, 2, 8, 16) * 256 * 64 * 2));
  EXPECT_EQ(a.column_loc.size(), 2u * 8u * 4u);
}

// ---------------------------------------------------------------- tile
TEST(TileFormat, RoundTripEveryDtypeShapeAndTile) {
  const std::pair<int, int> tiles[] = {{16, 16}, {32, 16}, {8, 64}, {1, 1}, {64, 128}};
  uint32_t seed = 200;
  for (DType dtype : kDTypes)
    for (auto [rows, cols] : kShapes)
      for (auto [tr, tc] : tiles)
        for (double density : {1.0, 0.5, 0.1}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " " << rows << "x" << cols << " tile " << tr << "x"
                                          << tc << " density " << density);
          const DenseMatrix dense = random_matrix(rows, cols, dtype, seed++);
          const TileMask tiles_kept = prune_tiles_by_norm(dense, tr, tc, density);
          const TileMatrix a = compress_tiles(dense, tiles_kept, tr, tc);
          EXPECT_NO_THROW(validate(a));
          const DenseMatrix pruned = apply_mask(dense, expand(tiles_kept, rows, cols, tr, tc));
          expect_same_matrix(decompress(a), pruned);
          const TileMatrix again = compress_tiles(pruned, tr, tc);
          EXPECT_EQ(again.ptr, a.ptr);
          EXPECT_EQ(again.indices, a.indices);
        }
}

TEST(TileFormat, EmptyRowsAndColumns) {
  DenseMatrix dense = DenseMatrix::zeros(40, 50, DType::f16);
  dense.set(39, 49, 2.0f);  // only the corner tile, which is partial
  const TileMatrix a = compress_tiles(dense, 16, 16);
  EXPECT_EQ(a.nnz_tiles(), 1);
  EXPECT_EQ(a.indices[0], 2);
  EXPECT_EQ(a.ptr, (std::vector<int32_t>{0, 0, 0, 0, 1}));
  expect_same_matrix(decompress(a), dense);
  EXPECT_EQ(storage_bytes(a), 16u * 16u * 2u + (5u + 1u) * 4u);
  const TileMatrix empty = compress_tiles(DenseMatrix::zeros(40, 50, DType::f32), 16, 16);
  EXPECT_EQ(empty.nnz_tiles(), 0);
  expect_same_matrix(decompress(empty), DenseMatrix::zeros(40, 50, DType::f32));
}

TEST(TileFormat, ValidateRejectsInconsistentEncoding) {
  const DenseMatrix dense = random_matrix(64, 64, DType::f32, 13);
  const TileMatrix good = compress_tiles(dense, 16, 16);  // 4x4 grid, every tile
  TileMatrix a = good;
  a.indices[1] = 9;
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "out of range");
  a = good;
  std::swap(a.indices[4], a.indices[5]);
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "tile column 1");
  a = good;
  a.ptr[2] = 3;
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::invalid_argument, "decreases at tile column 1");
  a = good;
  a.ptr.back() = 15;
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::invalid_argument, "ptr ends at 15");
  a = good;
  a.data = TypedBuffer(DType::f32, 10);
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::invalid_argument, "data holds");
  a = compress_tiles(random_matrix(20, 20, DType::f32, 14), 16, 16);
  a.data.set(static_cast<std::size_t>(3 * 256 + 15 * 16 + 15), 1.0f);  // tile (1,1) at (31, 31): padding
  EXPECT_NMKIT_ERROR(validate(a), ErrorCode::pattern_violation, "padding of tile (1, 1)");
  EXPECT_NMKIT_ERROR(check_tile_shape(0, 16), ErrorCode::invalid_argument, "tile sides");
}

// ---------------------------------------------------------------- specs
TEST(FormatSpec, FormatDensityIsTheFractionOfEntriesKept) {
  const DenseMatrix dense = random_matrix(256, 64, DType::f16, 13);
  EXPECT_DOUBLE_EQ(format_density(compress_nm(dense, prune_nm_magnitude(dense, 1, 4), 1, 4)), 0.25);
  EXPECT_DOUBLE_EQ(format_density(compress_vnm(dense, prune_vnm_magnitude(dense, 128, 2, 8), 128, 2, 8)), 0.25);
  // K = 130 at 2:4: 32 whole groups keep 2 of 4, the tail group's 2 real columns are both kept: 66 of 130.
  const DenseMatrix tail = random_matrix(3, 130, DType::f16, 14);
  const PruneResult pruned = prune_magnitude(tail, NmSpec{2, 4});
  EXPECT_DOUBLE_EQ(format_density(pruned.compressed), 66.0 / 130.0);
  EXPECT_EQ(pruned.mask.count(), 3 * 66);
  // K = 129: the tail group has one real column, so one of its two slots is padding.
  const DenseMatrix tail1 = random_matrix(2, 129, DType::f16, 15);
  EXPECT_DOUBLE_EQ(format_density(prune_magnitude(tail1, NmSpec{2, 4}).compressed), 65.0 / 129.0);
  // One corner tile of 16 x 16 in a 40 x 50 matrix holds only its 8 x 2 entries inside the matrix.
  DenseMatrix corner = DenseMatrix::zeros(40, 50, DType::f16);
  corner.set(39, 49, 2.0f);
  EXPECT_DOUBLE_EQ(format_density(compress_tiles(corner, 16, 16)), 16.0 / 2000.0);
}

TEST(FormatSpec, CompressBySpecGivesEachFormat) {
  const DenseMatrix dense = random_matrix(128, 72, DType::f16, 15);
  for (const char* spec : {"2:4", "vnm:64:2:8", "tile:16x16:0.5"}) {
    const PruneResult pruned = prune_magnitude(dense, parse_format_spec(spec));
    const SparseMatrix again = compress(decompress(pruned.compressed), parse_format_spec(spec));
    EXPECT_EQ(format_name(again), format_name(pruned.compressed)) << spec;
    expect_same_matrix(decompress(again), decompress(pruned.compressed));
  }
  EXPECT_NMKIT_ERROR(compress(dense, parse_format_spec("2:4")), ErrorCode::pattern_violation, "row 0");
}

TEST(FormatSpec, ConvertValuesRoundsAndKeepsThePattern) {
  const DenseMatrix dense = random_matrix(128, 72, DType::f32, 14);
  for (const char* spec : {"2:4", "vnm:64:2:8", "tile:16x16:0.5"}) {
    const SparseMatrix a = prune_magnitude(dense, parse_format_spec(spec)).compressed;
    const SparseMatrix half = convert_values(a, DType::bf16);
    validate(half);
    EXPECT_EQ(dtype_of(half), DType::bf16) << spec;
    EXPECT_EQ(format_name(half), format_name(a)) << spec;
    const DenseMatrix want = decompress(a), got = decompress(half);
    for (int64_t r = 0; r < want.rows; ++r)
      for (int64_t c = 0; c < want.cols; ++c)
        ASSERT_EQ(got.at(r, c), round_to(DType::bf16, want.at(r, c))) << spec << " (" << r << ", " << c << ")";
  }
}

TEST(FormatSpec, ParsesAndPrints) {
  EXPECT_EQ(to_string(parse_format_spec("2:4")), "2:4");
  EXPECT_EQ(to_string(parse_format_spec("vnm:128:2:8")), "vnm:128:2:8");
  EXPECT_EQ(to_string(parse_format_spec("tile:64x32:0.25")), "tile:64x32:0.25");
  EXPECT_EQ(to_string(parse_format_spec("tile:32:0.5")), "tile:32x32:0.5");
  EXPECT_NMKIT_ERROR(parse_format_spec("2:x"), ErrorCode::invalid_argument, "not an integer");
  EXPECT_NMKIT_ERROR(parse_format_spec("vnm:128:3:8"), ErrorCode::invalid_argument, "N in {1, 2}");
  EXPECT_NMKIT_ERROR(parse_format_spec("tile:64x64:1.5"), ErrorCode::invalid_argument, "density");
  EXPECT_NMKIT_ERROR(parse_format_spec("csr"), ErrorCode::invalid_argument, "unknown format");
}

}  // namespace
}  // namespace nmkit
