// pack_tiles: the CSR-of-tiles layout of the tile kernels, round trip and rejections.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {
namespace {

TileMatrix random_tiles(int64_t r, int64_t k, int tr, int tc, double density, DType dtype, uint32_t seed) {
  const DenseMatrix w = test::random_matrix(r, k, dtype, seed);
  return compress_tiles(w, prune_tiles_by_norm(w, tr, tc, density), tr, tc);
}

TEST(TilePack, RoundTripsWithTailsAndEmptyRows) {
  for (DType dtype : {DType::f16, DType::bf16})
    for (auto [tr, tc] : {std::pair{16, 16}, {32, 32}, {64, 64}, {128, 128}, {64, 128}, {128, 16}})
      for (double density : {0.05, 0.5, 1.0})
        for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 1}, {200, 333}, {256, 512}}) {
          const TileMatrix a = random_tiles(r, k, tr, tc, density, dtype, static_cast<uint32_t>(r + k + tr));
          const PackedTiles p = pack_tiles(a);
          EXPECT_EQ(p.row_ptr.back(), p.nnz_tiles());
          for (int64_t i = 0; i < p.grid_rows(); ++i)
            for (int32_t t = p.row_ptr[i] + 1; t < p.row_ptr[i + 1]; ++t) EXPECT_LT(p.col_index[t - 1], p.col_index[t]);
          test::expect_same_matrix(decompress(unpack_tiles(p)), decompress(a));
        }
}

TEST(TilePack, OrdersTilesByTileRow) {
  // Tiles (row, col) kept: (1, 0), (0, 1), (1, 1) in a 2 x 2 grid of 16 x 16 tiles.
  DenseMatrix w = DenseMatrix::zeros(32, 32, DType::f16);
  w.set(20, 3, 1.0f), w.set(2, 20, 2.0f), w.set(17, 17, 3.0f);
  const PackedTiles p = pack_tiles(compress_tiles(w, 16, 16));
  EXPECT_EQ(p.row_ptr, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(p.col_index, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(p.data[0 * 256 + 2 * 16 + 4], Half::from_float(2.0f).bits);  // tile (0, 1): element (2, 4)
  EXPECT_EQ(p.data[1 * 256 + 4 * 16 + 3], Half::from_float(1.0f).bits);  // tile (1, 0): element (4, 3)
}

TEST(TilePack, LongestTileRowsFirst) {
  // Row lengths 1, 3, 0, 3, 2: rows 1 and 3 (3 tiles, in row order), then 4, 0 and the empty row 2.
  EXPECT_EQ(tile_rows_longest_first({0, 1, 4, 4, 7, 9}), (std::vector<int32_t>{1, 3, 4, 0, 2}));
  EXPECT_TRUE(tile_rows_longest_first({0}).empty());
}

TEST(TilePack, TileRowOfEachStoredTile) {
  // Row lengths 1, 3, 0, 3, 2 (row 2 empty).
  EXPECT_EQ(tile_row_of_tiles({0, 1, 4, 4, 7, 9}), (std::vector<int32_t>{0, 1, 1, 1, 3, 3, 3, 4, 4}));
  EXPECT_TRUE(tile_row_of_tiles({0, 0, 0}).empty());
  EXPECT_TRUE(tile_row_of_tiles({0}).empty());
}

TEST(TilePack, WarpStreamScheduleGivesEachCtaWholeRows) {
  // 8 rows of 16 tiles: one row per CTA, at 8 target CTAs and at 9 (a share of 14.2 chunks; 16 is within the slack).
  std::vector<int32_t> row_ptr{0};
  for (int r = 0; r < 8; ++r) row_ptr.push_back(row_ptr.back() + 16);
  for (int64_t target : {8, 9}) {
    const WarpStreamSchedule s = warp_stream_schedule(row_ptr, 1, target, 132);
    EXPECT_EQ(s.cta_begin, (std::vector<int32_t>{0, 16, 32, 48, 64, 80, 96, 112, 128})) << target;
    EXPECT_EQ(s.row_ctas, std::vector<int32_t>(16, -1)) << target;
  }
  // Two chunks per tile (64-column tiles) and 4 target CTAs: two rows (64 chunks) per CTA.
  EXPECT_EQ(warp_stream_schedule(row_ptr, 2, 4, 132).cta_begin, (std::vector<int32_t>{0, 64, 128, 192, 256}));
}

TEST(TilePack, WarpStreamScheduleCutsRowsOnlyWhereItMust) {
  constexpr int64_t kCut = WarpStreamSchedule::kCutCost, kMinCut = WarpStreamSchedule::kMinCutChunks;
  static_assert(kCut == 24 && kMinCut == 16, "the expectations below are worked out for these constants");
  // Row lengths 64, 2, 3, 0, 2, 1 and 6 target CTAs: a floor of 15 chunks, which row 0 exceeds. The least
  // bottleneck that cuts it is kMinCut + kCut = 40: three parts of 16 chunks that cut it, then its last 16 chunks
  // with nothing cut at their end (16 <= 40 - kCut), then the short rows whole within the floor.
  const WarpStreamSchedule s = warp_stream_schedule({0, 64, 66, 69, 69, 71, 72}, 1, 6, 132);
  EXPECT_EQ(s.cta_begin, (std::vector<int32_t>{0, 16, 32, 48, 64, 72}));
  // Row 0 is held by CTAs 0..3, the first of which starts with it; the others lie in one CTA each.
  EXPECT_EQ(s.row_ctas, (std::vector<int32_t>{0, 3, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}));
  // Even rows within the floor are never cut: 10 rows of 30 with 10 target CTAs (floor 37).
  std::vector<int32_t> even{0};
  for (int r = 0; r < 10; ++r) even.push_back(even.back() + 30);
  EXPECT_EQ(warp_stream_schedule(even, 1, 10, 132).row_ctas, std::vector<int32_t>(20, -1));
  // Rows 20, 50, 20, 50 with 2 target CTAs and at most 2: the floor (87) holds two whole rows per range.
  const WarpStreamSchedule u = warp_stream_schedule({0, 20, 70, 90, 140}, 1, 2, 2);
  EXPECT_EQ(u.cta_begin, (std::vector<int32_t>{0, 70, 140}));
  EXPECT_EQ(u.row_ctas, std::vector<int32_t>(8, -1));
  // Rows 100, 100, 100 in at most 2 CTAs, target 4 (floor 93): whole rows need a bottleneck of 200, a cut in the
  // middle row 150 + kCut = 174, which the middle row's CTAs share.
  const WarpStreamSchedule v = warp_stream_schedule({0, 100, 200, 300}, 1, 4, 2);
  EXPECT_EQ(v.cta_begin, (std::vector<int32_t>{0, 150, 300}));
  EXPECT_EQ(v.row_ctas, (std::vector<int32_t>{-1, -1, 2 * 0 + 1, 1, -1, -1}));
  // With a floor above that (target 2: 187), the first range takes the floor's worth: 187 - kCut chunks.
  EXPECT_EQ(warp_stream_schedule({0, 100, 200, 300}, 1, 2, 2).cta_begin, (std::vector<int32_t>{0, 163, 300}));
}

namespace {

// Row pointers of 1..max_rows tile rows, a quarter of them long (up to long_rows - 1 tiles), the rest short (up to
// short_rows - 1): uneven rows for the warp-stream schedule.
std::vector<int32_t> random_row_ptr(std::mt19937& rng, int max_rows, int long_rows, int short_rows) {
  std::vector<int32_t> row_ptr{0};
  const int rows = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_rows));
  for (int r = 0; r < rows; ++r)
    row_ptr.push_back(row_ptr.back() + static_cast<int32_t>(rng() % 4 == 0
                                                                ? rng() % static_cast<unsigned>(long_rows)
                                                                : rng() % static_cast<unsigned>(short_rows)));
  return row_ptr;
}

// What a range of chunks [begin, end) costs the warp-stream schedule, and whether the schedule may end it there.
struct RangeCost {
  std::vector<bool> at_boundary;
  int64_t cost(int64_t begin, int64_t end) const {
    const bool cut = !at_boundary[static_cast<std::size_t>(begin)] || !at_boundary[static_cast<std::size_t>(end)];
    return end - begin + (cut ? WarpStreamSchedule::kCutCost : 0);
  }
  bool allowed(int64_t begin, int64_t end) const {
    return at_boundary[static_cast<std::size_t>(end)] || end - begin >= WarpStreamSchedule::kMinCutChunks;
  }
  // The fewest ranges within the bottleneck over every possible end (the schedule looks at two per start).
  int64_t fewest_ranges(int64_t bottleneck) const {
    const int64_t n = static_cast<int64_t>(at_boundary.size()) - 1, none = int64_t{1} << 40;
    std::vector<int64_t> fewest(static_cast<std::size_t>(n) + 1, none);
    fewest[static_cast<std::size_t>(n)] = 0;
    for (int64_t x = n - 1; x >= 0; --x)
      for (int64_t e = x + 1; e <= n; ++e)
        if (allowed(x, e) && cost(x, e) <= bottleneck)
          fewest[static_cast<std::size_t>(x)] =
              std::min(fewest[static_cast<std::size_t>(x)], fewest[static_cast<std::size_t>(e)] + 1);
    return fewest[0];
  }
};

}  // namespace

TEST(TilePack, WarpStreamScheduleHasTheLeastBottleneck) {
  // Random weights, small enough for an exhaustive check: every chunk covered by non-empty ranges in order, at
  // most max_ctas of them, the row CTAs right, and the largest range cost the least for which max_ctas ranges
  // suffice (by a search over every possible end), or the floor where that is higher.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const std::vector<int32_t> row_ptr = random_row_ptr(rng, 24, 90, 9);
    const int rows = static_cast<int>(row_ptr.size()) - 1;
    const int cpt = 1 << (rng() % 2);
    const int64_t chunks = int64_t{row_ptr.back()} * cpt;
    if (chunks == 0) {
      EXPECT_EQ(warp_stream_schedule(row_ptr, cpt, 5, 132).ctas(), 0);
      continue;
    }
    const int64_t target = 1 + static_cast<int64_t>(rng() % std::min<int64_t>(chunks, 40));
    const int64_t max_ctas = rng() % 2 ? 132 : 1 + static_cast<int64_t>(rng() % 12);
    const WarpStreamSchedule s = warp_stream_schedule(row_ptr, cpt, target, max_ctas);
    ASSERT_GT(s.ctas(), 0);
    EXPECT_LE(s.ctas(), max_ctas) << "trial " << trial;
    EXPECT_EQ(s.cta_begin.front(), 0);
    EXPECT_EQ(s.cta_begin.back(), chunks);
    RangeCost model{std::vector<bool>(static_cast<std::size_t>(chunks) + 1, false)};
    for (int32_t t : row_ptr) model.at_boundary[static_cast<std::size_t>(int64_t{t} * cpt)] = true;
    int64_t bottleneck = 0;
    for (int64_t i = 0; i < s.ctas(); ++i) {
      ASSERT_GT(s.cta_begin[i + 1], s.cta_begin[i]) << "empty range, trial " << trial;
      EXPECT_TRUE(model.allowed(s.cta_begin[i], s.cta_begin[i + 1]))
          << "a short range ending inside a row, trial " << trial;
      bottleneck = std::max(bottleneck, model.cost(s.cta_begin[i], s.cta_begin[i + 1]));
    }
    const auto floor = std::max<int64_t>(
        1, static_cast<int64_t>(static_cast<double>(chunks) / target * (1.0 + WarpStreamSchedule::kRowSlack)));
    EXPECT_LE(model.fewest_ranges(bottleneck), max_ctas) << "trial " << trial;
    if (bottleneck > floor)
      EXPECT_GT(model.fewest_ranges(bottleneck - 1), max_ctas) << "not the least, trial " << trial;
    const auto cta_of = [&](int64_t chunk) {
      return std::upper_bound(s.cta_begin.begin(), s.cta_begin.end(), chunk) - s.cta_begin.begin() - 1;
    };
    for (int r = 0; r < rows; ++r) {
      const int64_t b = int64_t{row_ptr[r]} * cpt, e = int64_t{row_ptr[r + 1]} * cpt;
      if (b == e || cta_of(b) == cta_of(e - 1)) {
        EXPECT_EQ(s.row_ctas[2 * r], -1);
        continue;
      }
      EXPECT_EQ(s.row_ctas[2 * r], 2 * cta_of(b) + (s.cta_begin[cta_of(b)] < b ? 1 : 0)) << "trial " << trial;
      EXPECT_EQ(s.row_ctas[2 * r + 1], cta_of(e - 1)) << "trial " << trial;
    }
  }
  EXPECT_EQ(warp_stream_schedule({0}, 1, 1, 1).ctas(), 0);
  EXPECT_THROW(warp_stream_schedule({0, 4}, 0, 1, 1), Error);
  EXPECT_THROW(warp_stream_schedule({0, 4}, 1, 0, 1), Error);
}

TEST(TilePack, WarpStreamLeadsDescribeEachWarpsRange) {
  // Every warp's record against the schedule and the weight's arrays, on random patterns: the CTA's range cut
  // evenly over min(8, length) warps (the others idle at its end), the range's end rows and their CTAs, and the
  // tiles of its first three chunks.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 100; ++trial) {
    const std::vector<int32_t> row_ptr = random_row_ptr(rng, 40, 120, 7);
    if (row_ptr.back() == 0) continue;
    std::vector<int32_t> col_index(static_cast<std::size_t>(row_ptr.back()));
    for (auto& c : col_index) c = static_cast<int32_t>(rng() % 1000);
    const int cpt = 1 << (rng() % 3);
    const int64_t chunks = int64_t{row_ptr.back()} * cpt;
    const WarpStreamSchedule s = warp_stream_schedule(row_ptr, cpt, 1 + static_cast<int64_t>(rng() % 20), 132);
    const std::vector<WarpStreamLead> leads = warp_stream_leads(s, row_ptr, col_index, cpt);
    ASSERT_EQ(static_cast<int64_t>(leads.size()), s.ctas() * WarpStreamLead::kWarpsPerCta);
    const std::vector<int32_t> tile_row = tile_row_of_tiles(row_ptr);
    const auto row_of = [&](int64_t chunk) { return tile_row[static_cast<std::size_t>(chunk / cpt)]; };
    for (int64_t cta = 0; cta < s.ctas(); ++cta) {
      const int64_t cta_begin = s.cta_begin[cta], cta_end = s.cta_begin[cta + 1];
      const int64_t parts = std::min<int64_t>(8, cta_end - cta_begin);
      for (int64_t warp = 0; warp < 8; ++warp) {
        const WarpStreamLead& l = leads[static_cast<std::size_t>(cta * 8 + warp)];
        const int64_t begin = warp < parts ? cta_begin + warp * (cta_end - cta_begin) / parts : cta_end;
        const int64_t end = warp < parts ? cta_begin + (warp + 1) * (cta_end - cta_begin) / parts : cta_end;
        ASSERT_EQ(l.begin, begin) << "trial " << trial << " cta " << cta << " warp " << warp;
        ASSERT_EQ(l.end, end);
        EXPECT_EQ(l.ends_cta, warp < parts && end == cta_end ? 1 : 0);
        for (int i = 0; i < WarpStreamLead::kChunks; ++i) {
          EXPECT_EQ(l.row[i], begin + i < end ? row_of(begin + i) : -1);
          EXPECT_EQ(l.column[i], begin + i < end ? col_index[static_cast<std::size_t>((begin + i) / cpt)] : 0);
        }
        if (begin == end) {
          EXPECT_EQ(l.last_row, -1);
          continue;
        }
        EXPECT_EQ(l.before_row, begin > 0 ? row_of(begin - 1) : -1);
        EXPECT_EQ(l.after_row, end < chunks ? row_of(end) : -1);
        EXPECT_EQ(l.last_row, row_of(end - 1));
        EXPECT_EQ(l.first_row_ctas[0], s.row_ctas[2 * static_cast<std::size_t>(row_of(begin))]);
        EXPECT_EQ(l.first_row_ctas[1], s.row_ctas[2 * static_cast<std::size_t>(row_of(begin)) + 1]);
        EXPECT_EQ(l.last_row_ctas[0], s.row_ctas[2 * static_cast<std::size_t>(row_of(end - 1))]);
        EXPECT_EQ(l.last_row_ctas[1], s.row_ctas[2 * static_cast<std::size_t>(row_of(end - 1)) + 1]);
      }
    }
  }
  const std::vector<int32_t> row_ptr{0, 4};
  EXPECT_NMKIT_ERROR(warp_stream_leads(warp_stream_schedule(row_ptr, 1, 1, 1), row_ptr, {1, 2, 3}, 1),
                     ErrorCode::invalid_argument, "does not match");
}

PackedTiles packed_pattern(int64_t rows, int64_t cols, int tile_side, std::vector<int32_t> row_ptr,
                           std::vector<int32_t> col_index) {
  PackedTiles p;
  p.rows = rows, p.cols = cols, p.tile_rows = p.tile_cols = tile_side;
  p.row_ptr = std::move(row_ptr), p.col_index = std::move(col_index);
  p.data.assign(p.col_index.size() * static_cast<std::size_t>(tile_side * tile_side), 0);
  check_packed_tiles(p);
  return p;
}

TEST(TilePack, BlockScheduleMergesTheRowsOfEachBlock) {
  // 64-row tiles, three tile rows (two 128-row blocks, the second one tile row): row 0 stores columns {0, 2}
  // (tiles 0, 1), row 1 {1, 2, 3} (tiles 2-4), row 2 {1} (tile 5). Row 1 (most tiles) shares one column with
  // each of the others and takes the first of them by tile count, row 0; row 2 is left alone. The neighbours'
  // pairs (0, 1) and (2) would share as many columns, and win the tie.
  const PackedTiles p = packed_pattern(150, 256, 64, {0, 2, 5, 6}, {0, 2, 1, 2, 3, 1});
  EXPECT_EQ(pair_tile_rows(p), (std::vector<int32_t>{0, 1, 2, -1}));
  const TileBlockSchedule s = tile_block_schedule(p);
  EXPECT_EQ(s.block, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s.block_groups, (std::vector<int32_t>{0, 1, 2, 3}));  // group 3 = ceil(150 / 64): no rows
  EXPECT_EQ(s.step_ptr, (std::vector<int32_t>{0, 4, 5}));
  const std::vector<TileStep> expected = {
      {0, {0, -1}, 1}, {1, {-1, 2}, 2}, {2, {1, 3}, 3}, {3, {-1, 4}, 2}, {1, {5, -1}, 1}};
  EXPECT_EQ(s.steps, expected);
}

TEST(TilePack, BlockSchedulePairsTileRowsThatShareColumns) {
  // Five 64-row tile rows: rows 0 and 2 store columns {0, 1, 2}, rows 1 and 3 {4, 5}, row 4 {3}. Neighbours
  // share nothing (11 steps); rows 0 + 2 and 1 + 3 share everything (3 + 2 + 1 = 6 steps).
  const PackedTiles p = packed_pattern(300, 384, 64, {0, 3, 5, 8, 10, 11}, {0, 1, 2, 4, 5, 0, 1, 2, 4, 5, 3});
  EXPECT_EQ(pair_tile_rows(p), (std::vector<int32_t>{0, 2, 1, 3, 4, -1}));
  const TileBlockSchedule s = tile_block_schedule(p);
  EXPECT_EQ(s.block_groups, (std::vector<int32_t>{0, 2, 1, 3, 4, 5}));
  EXPECT_EQ(s.block, (std::vector<int32_t>{0, 1, 2}));  // 3, 2 and 1 steps
  EXPECT_EQ(s.step_ptr, (std::vector<int32_t>{0, 3, 5, 6}));
  const std::vector<TileStep> expected = {{0, {0, 5}, 3}, {1, {1, 6}, 3}, {2, {2, 7}, 3},
                                          {4, {3, 8}, 3}, {5, {4, 9}, 3}, {3, {10, -1}, 1}};
  EXPECT_EQ(s.steps, expected);
  // 128-row tiles: a block is one tile row, its halves the row's two 64-row groups.
  EXPECT_EQ(tile_block_schedule(packed_pattern(300, 256, 128, {0, 1, 1, 2}, {0, 1})).block_groups,
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(TilePack, PairedTileRowsNeverTakeMoreStepsThanNeighbours) {
  // On random patterns (uniform and with a few dense rows), every tile row in exactly one pair, and the pairs'
  // steps (tiles minus shared columns) at most the neighbours'; on uniform random 64 x 64-tile grids, fewer.
  std::mt19937 rng(5);
  for (double density : {0.05, 0.25, 0.5, 0.9})
    for (int64_t grid_rows : {1, 7, 64}) {
      const int64_t grid_cols = 64;
      std::vector<int32_t> row_ptr{0}, col_index;
      for (int64_t r = 0; r < grid_rows; ++r) {
        const double d = r % 9 == 4 ? 1.0 : density;
        for (int32_t j = 0; j < grid_cols; ++j)
          if (std::uniform_real_distribution<double>(0, 1)(rng) < d) col_index.push_back(j);
        row_ptr.push_back(static_cast<int32_t>(col_index.size()));
      }
      const PackedTiles p = packed_pattern(grid_rows * 64 - 10, grid_cols * 64, 64, row_ptr, col_index);
      const std::vector<int32_t> pairs = pair_tile_rows(p);
      ASSERT_EQ(pairs.size(), static_cast<std::size_t>(2 * ceil_div(grid_rows, int64_t{2})));
      std::vector<int> seen(static_cast<std::size_t>(grid_rows), 0);
      for (const int32_t r : pairs)
        if (r >= 0) ++seen[static_cast<std::size_t>(r)];
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
      const auto steps = [&](int32_t a, int32_t b) {
        std::vector<char> used(static_cast<std::size_t>(grid_cols), 0);
        for (const int32_t r : {a, b})
          if (r >= 0)
            for (int32_t t = row_ptr[static_cast<std::size_t>(r)]; t < row_ptr[static_cast<std::size_t>(r) + 1]; ++t)
              used[static_cast<std::size_t>(col_index[static_cast<std::size_t>(t)])] = 1;
        return std::count(used.begin(), used.end(), 1);
      };
      int64_t paired = 0, neighbours = 0;
      for (std::size_t i = 0; i < pairs.size(); i += 2) paired += steps(pairs[i], pairs[i + 1]);
      for (int32_t r = 0; r < grid_rows; r += 2) neighbours += steps(r, r + 1 < grid_rows ? r + 1 : -1);
      EXPECT_LE(paired, neighbours) << "density " << density << ", " << grid_rows << " tile rows";
      int64_t longest_paired = 0, longest_neighbours = 0;  // and the longest block no longer
      for (std::size_t i = 0; i < pairs.size(); i += 2)
        longest_paired = std::max<int64_t>(longest_paired, steps(pairs[i], pairs[i + 1]));
      for (int32_t r = 0; r < grid_rows; r += 2)
        longest_neighbours = std::max<int64_t>(longest_neighbours, steps(r, r + 1 < grid_rows ? r + 1 : -1));
      EXPECT_LE(longest_paired, longest_neighbours) << "density " << density << ", " << grid_rows << " tile rows";
      if (grid_rows == 64 && density <= 0.5) EXPECT_LT(paired, neighbours) << "density " << density;
      const TileBlockSchedule s = tile_block_schedule(p);
      EXPECT_EQ(s.steps.size(), static_cast<std::size_t>(paired));
    }
}

TEST(TilePack, BlockScheduleOfWholeTilesPutsLongestBlocksFirst) {
  // 128-row tiles: one tile row per block, each tile named for both halves; the empty row 0 comes last.
  const PackedTiles p = packed_pattern(384, 384, 128, {0, 0, 1, 3}, {2, 0, 1});
  const TileBlockSchedule s = tile_block_schedule(p);
  EXPECT_EQ(s.block, (std::vector<int32_t>{2, 1, 0}));
  EXPECT_EQ(s.step_ptr, (std::vector<int32_t>{0, 2, 3, 3}));
  const std::vector<TileStep> expected = {{0, {1, 1}, 3}, {1, {2, 2}, 3}, {2, {0, 0}, 3}};
  EXPECT_EQ(s.steps, expected);
  EXPECT_FALSE(s.balanced());  // 2 steps against a mean of 1
  EXPECT_TRUE(tile_block_schedule(packed_pattern(256, 256, 128, {0, 2, 4}, {0, 1, 0, 1})).balanced());
  EXPECT_NMKIT_ERROR(tile_block_schedule(packed_pattern(64, 64, 32, {0, 0, 0}, {})), ErrorCode::unsupported,
                     "64 or 128");
}

TEST(TilePack, BlockScheduleCoversEveryTileOnce) {
  for (auto [tr, tc] : {std::pair{64, 64}, {64, 128}, {128, 64}, {128, 128}})
    for (double density : {0.05, 0.3, 1.0})
      for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 1}, {200, 333}, {700, 1024}}) {
        const PackedTiles p =
            pack_tiles(random_tiles(r, k, tr, tc, density, DType::f16, static_cast<uint32_t>(r + tr)));
        const TileBlockSchedule s = tile_block_schedule(p);
        const int rows_per_block = kTileBlockRows / tr;
        ASSERT_EQ(s.block.size(), static_cast<std::size_t>(ceil_div(p.grid_rows(), int64_t{rows_per_block})));
        ASSERT_EQ(s.step_ptr.size(), s.block.size() + 1);
        std::vector<int> seen(static_cast<std::size_t>(p.nnz_tiles()), 0), block_seen(s.block.size(), 0);
        for (std::size_t i = 0; i < s.block.size(); ++i) {
          ++block_seen[static_cast<std::size_t>(s.block[i])];
          if (i > 0) EXPECT_GE(s.step_ptr[i] - s.step_ptr[i - 1], s.step_ptr[i + 1] - s.step_ptr[i]);  // longest first
          for (int32_t t = s.step_ptr[i]; t < s.step_ptr[i + 1]; ++t) {
            const TileStep& step = s.steps[static_cast<std::size_t>(t)];
            if (t > s.step_ptr[i]) EXPECT_LT(s.steps[static_cast<std::size_t>(t) - 1].column, step.column);
            ASSERT_NE(step.mask, 0);
            for (int w = 0; w < rows_per_block; ++w) {
              if (!(step.mask >> w & 1)) continue;
              const int32_t tile = step.tile[w];
              // The tile's row and column match: the half's 64-row group is the tile row (64-row tiles), or the
              // block is (128-row tiles).
              const int64_t group =
                  s.block_groups[2 * static_cast<std::size_t>(s.block[i]) + static_cast<std::size_t>(w)];
              const int64_t row = rows_per_block == 2 ? group : s.block[i];
              if (rows_per_block == 1) EXPECT_EQ(group, 2 * row + w);
              ASSERT_GE(tile, p.row_ptr[static_cast<std::size_t>(row)]);
              ASSERT_LT(tile, p.row_ptr[static_cast<std::size_t>(row) + 1]);
              EXPECT_EQ(p.col_index[static_cast<std::size_t>(tile)], step.column);
              ++seen[static_cast<std::size_t>(tile)];
            }
          }
        }
        for (const int n : seen) EXPECT_EQ(n, 1);
        for (const int n : block_seen) EXPECT_EQ(n, 1);
      }
}

TEST(TilePack, WidenedTilesHoldTheSameMatrix) {
  // Sides below 64 become 64: the same logical matrix (tails, empty wide tiles), each wide tile once per wide row.
  for (auto [tr, tc] : {std::pair{16, 16}, {32, 32}, {32, 64}, {128, 16}, {64, 64}})
    for (double density : {0.05, 0.5})
      for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 1}, {200, 333}, {700, 1024}}) {
        const TileMatrix a = random_tiles(r, k, tr, tc, density, DType::bf16, static_cast<uint32_t>(r + tr + tc));
        const PackedTiles wide = widen_tiles(pack_tiles(a));
        EXPECT_EQ(wide.tile_rows, std::max(tr, 64));
        EXPECT_EQ(wide.tile_cols, std::max(tc, 64));
        check_packed_tiles(wide);
        test::expect_same_matrix(decompress(unpack_tiles(wide)), decompress(a));
      }
}

TEST(TilePack, SplitTileRowsHoldTheSameMatrix) {
  // Tiles 64 or 128 rows high cut into tiles 32 (or 16) rows high: the same logical matrix (R tails that drop the
  // last tile row's padding parts, empty tile rows), each split row holding its source row's columns in order.
  for (auto [tr, tc] : {std::pair{64, 64}, {128, 128}, {64, 32}, {128, 64}, {64, 128}})
    for (int to : {32, 16})
      for (double density : {0.05, 0.5})
        for (auto [r, k] : {std::pair<int64_t, int64_t>{1, 1}, {200, 333}, {700, 1024}}) {
          const TileMatrix a = random_tiles(r, k, tr, tc, density, DType::f16, static_cast<uint32_t>(r + tr + tc + to));
          const PackedTiles p = pack_tiles(a), split = split_tile_rows(p, to);
          EXPECT_EQ(split.tile_rows, to);
          EXPECT_EQ(split.tile_cols, tc);
          check_packed_tiles(split);
          const int parts = tr / to;
          for (int64_t i = 0; i < split.grid_rows(); ++i) {
            const auto from = static_cast<std::size_t>(i / parts);
            ASSERT_EQ(split.row_ptr[i + 1] - split.row_ptr[i], p.row_ptr[from + 1] - p.row_ptr[from])
                << "split row " << i;
            EXPECT_TRUE(std::equal(split.col_index.begin() + split.row_ptr[i],
                                   split.col_index.begin() + split.row_ptr[i + 1],
                                   p.col_index.begin() + p.row_ptr[from]));
          }
          test::expect_same_matrix(decompress(unpack_tiles(split)), decompress(a));
        }
  EXPECT_NMKIT_ERROR(split_tile_rows(pack_tiles(random_tiles(64, 64, 32, 32, 0.5, DType::f16, 6)), 64),
                     ErrorCode::invalid_argument, "does not divide");
}

TEST(TilePack, RejectsInconsistentEncodingsAndUnsupportedTiles) {
  const TileMatrix good = random_tiles(64, 64, 16, 16, 0.5, DType::f16, 3);
  TileMatrix bad_ptr = good;
  bad_ptr.ptr[1] = bad_ptr.ptr[2] + 1;
  EXPECT_THROW(pack_tiles(bad_ptr), Error);
  TileMatrix bad_index = good;
  bad_index.indices[0] = 99;
  EXPECT_THROW(pack_tiles(bad_index), Error);
  EXPECT_NMKIT_ERROR(pack_tiles(random_tiles(64, 64, 24, 16, 0.5, DType::f16, 4)), ErrorCode::unsupported,
                     "16, 32, 64 or 128");
  EXPECT_NMKIT_ERROR(pack_tiles(random_tiles(64, 64, 16, 16, 0.5, DType::f32, 5)), ErrorCode::unsupported,
                     "f16 or bf16");
  PackedTiles p = pack_tiles(good);
  p.col_index[0] = static_cast<int32_t>(p.grid_cols());
  EXPECT_NMKIT_ERROR(check_packed_tiles(p), ErrorCode::invalid_argument, "out of range");
  p = pack_tiles(good);
  p.row_ptr[1] = p.row_ptr[2] + 1;
  EXPECT_NMKIT_ERROR(check_packed_tiles(p), ErrorCode::invalid_argument, "row_ptr");
}

}  // namespace
}  // namespace nmkit::gpu
