// pack_tiles / unpack_tiles: the CSC-of-tiles logical format <-> the CSR-of-tiles layout the tile kernels read.
// Host code only (no CUDA), so that CI tests it.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/tile_spmm.hpp"

namespace nmkit::gpu {

bool tile_kernel_supports(int tile_rows, int tile_cols) noexcept {
  // Powers of two, so that a tile row holds a power-of-two number of 16-byte chunks (the shared-memory swizzle).
  auto side_ok = [](int s) { return s >= kTileSideUnit && s <= kMaxKernelTileSide && (s & (s - 1)) == 0; };
  return side_ok(tile_rows) && side_ok(tile_cols);
}

namespace {

std::string tile_shape_name(int r, int c) { return std::to_string(r) + "x" + std::to_string(c); }

// Throws unless the CSR arrays describe grid_rows tile rows of tiles in [0, grid_cols), ascending per row.
void check_csr(const PackedTiles& p, const char* who) {
  const int64_t grid_rows = p.grid_rows(), grid_cols = p.grid_cols(), nnz = p.nnz_tiles();
  require(
      p.row_ptr.size() == static_cast<std::size_t>(grid_rows + 1) && p.row_ptr.front() == 0 && p.row_ptr.back() == nnz,
      ErrorCode::invalid_argument,
      std::string(who) + ": row_ptr must hold " + std::to_string(grid_rows + 1) + " entries from 0 to " +
          std::to_string(nnz));
  for (int64_t i = 0; i < grid_rows; ++i)
    require(p.row_ptr[static_cast<std::size_t>(i)] <= p.row_ptr[static_cast<std::size_t>(i + 1)],
            ErrorCode::invalid_argument, std::string(who) + ": row_ptr decreases at tile row " + std::to_string(i));
  for (int64_t i = 0; i < grid_rows; ++i) {
    for (int32_t t = p.row_ptr[static_cast<std::size_t>(i)]; t < p.row_ptr[static_cast<std::size_t>(i + 1)]; ++t) {
      const int32_t j = p.col_index[static_cast<std::size_t>(t)];
      require(j >= 0 && j < grid_cols, ErrorCode::invalid_argument, [&] {
        return std::string(who) + ": tile column " + std::to_string(j) + " out of range at tile row " +
               std::to_string(i);
      });
      require(t == p.row_ptr[static_cast<std::size_t>(i)] || j > p.col_index[static_cast<std::size_t>(t - 1)],
              ErrorCode::invalid_argument, [&] {
                return std::string(who) + ": tile columns not strictly ascending at tile row " + std::to_string(i);
              });
    }
  }
  require(p.data.size() == static_cast<std::size_t>(nnz * p.tile_rows * p.tile_cols), ErrorCode::invalid_argument,
          std::string(who) + ": data holds " + std::to_string(p.data.size()) + " values, expected " +
              std::to_string(nnz * p.tile_rows * p.tile_cols));
}

}  // namespace

PackedTiles pack_tiles(const TileMatrix& a) {
  validate(a);
  require(tile_kernel_supports(a.tile_rows, a.tile_cols), ErrorCode::unsupported,
          "pack_tiles: the kernels run tile sides 16, 32, 64 or 128, got " + tile_shape_name(a.tile_rows, a.tile_cols));
  require(a.dtype() == DType::f16 || a.dtype() == DType::bf16, ErrorCode::unsupported,
          std::string("pack_tiles needs f16 or bf16 values, got ") + dtype_name(a.dtype()));
  PackedTiles p;
  p.rows = a.rows, p.cols = a.cols, p.tile_rows = a.tile_rows, p.tile_cols = a.tile_cols, p.dtype = a.dtype();
  const int64_t grid_rows = a.grid_rows(), grid_cols = a.grid_cols(), nnz = a.nnz_tiles(), elems = a.tile_elems();
  p.row_ptr.assign(static_cast<std::size_t>(grid_rows + 1), 0);
  for (const int32_t i : a.indices) ++p.row_ptr[static_cast<std::size_t>(i + 1)];
  for (int64_t i = 0; i < grid_rows; ++i)
    p.row_ptr[static_cast<std::size_t>(i + 1)] += p.row_ptr[static_cast<std::size_t>(i)];
  p.col_index.resize(static_cast<std::size_t>(nnz));
  p.data.resize(static_cast<std::size_t>(nnz * elems));
  std::vector<int32_t> next(p.row_ptr.begin(), p.row_ptr.end() - 1);
  // Walking tile columns in order appends each tile row's tiles by ascending column.
  for (int64_t j = 0; j < grid_cols; ++j)
    for (int32_t t = a.ptr[static_cast<std::size_t>(j)]; t < a.ptr[static_cast<std::size_t>(j + 1)]; ++t) {
      const int32_t slot = next[static_cast<std::size_t>(a.indices[static_cast<std::size_t>(t)])]++;
      p.col_index[static_cast<std::size_t>(slot)] = static_cast<int32_t>(j);
      std::memcpy(p.data.data() + slot * elems, a.data.data() + t * elems * 2, static_cast<std::size_t>(elems) * 2);
    }
  return p;
}

TileMatrix unpack_tiles(const PackedTiles& p) {
  check_tile_shape(p.tile_rows, p.tile_cols);
  check_csr(p, "unpack_tiles");
  TileMatrix a;
  a.rows = p.rows, a.cols = p.cols, a.tile_rows = p.tile_rows, a.tile_cols = p.tile_cols;
  const int64_t grid_cols = p.grid_cols(), nnz = p.nnz_tiles(), elems = int64_t{p.tile_rows} * p.tile_cols;
  a.ptr.assign(static_cast<std::size_t>(grid_cols + 1), 0);
  for (const int32_t j : p.col_index) ++a.ptr[static_cast<std::size_t>(j + 1)];
  for (int64_t j = 0; j < grid_cols; ++j) a.ptr[static_cast<std::size_t>(j + 1)] += a.ptr[static_cast<std::size_t>(j)];
  a.indices.resize(static_cast<std::size_t>(nnz));
  a.data = TypedBuffer(p.dtype, static_cast<std::size_t>(nnz * elems));
  std::vector<int32_t> next(a.ptr.begin(), a.ptr.end() - 1);
  for (int64_t i = 0; i < p.grid_rows(); ++i)  // tile rows in order: ascending row indices per tile column
    for (int32_t t = p.row_ptr[static_cast<std::size_t>(i)]; t < p.row_ptr[static_cast<std::size_t>(i + 1)]; ++t) {
      const int32_t slot = next[static_cast<std::size_t>(p.col_index[static_cast<std::size_t>(t)])]++;
      a.indices[static_cast<std::size_t>(slot)] = static_cast<int32_t>(i);
      std::memcpy(a.data.data() + slot * elems * 2, p.data.data() + t * elems, static_cast<std::size_t>(elems) * 2);
    }
  validate(a);
  return a;
}

std::vector<int32_t> tile_rows_longest_first(const std::vector<int32_t>& row_ptr) {
  const std::size_t rows = row_ptr.empty() ? 0 : row_ptr.size() - 1;
  std::vector<int32_t> order(rows);
  for (std::size_t i = 0; i < rows; ++i) order[i] = static_cast<int32_t>(i);
  const auto length = [&](int32_t row) {
    return row_ptr[static_cast<std::size_t>(row) + 1] - row_ptr[static_cast<std::size_t>(row)];
  };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return length(a) > length(b); });
  return order;
}

std::vector<int32_t> tile_row_of_tiles(const std::vector<int32_t>& row_ptr) {
  std::vector<int32_t> row_of(row_ptr.empty() ? 0 : static_cast<std::size_t>(row_ptr.back()));
  for (std::size_t r = 0; r + 1 < row_ptr.size(); ++r)
    std::fill(row_of.begin() + row_ptr[r], row_of.begin() + row_ptr[r + 1], static_cast<int32_t>(r));
  return row_of;
}

namespace {

// Contiguous CTA ranges over `chunks` chunks whose row boundaries are `at_boundary`, at the least bottleneck cost
// (a range's chunks, plus WarpStreamSchedule::kCutCost where it starts or ends inside a row) for which at most
// max_ctas ranges suffice, never below `floor`: the range starts, then the end. One range of every chunk costs
// `chunks`, so a bottleneck of `chunks` always fits max_ctas >= 1.
class RangePartition {
 public:
  RangePartition(std::vector<bool> at_boundary, int64_t chunks)
      : at_boundary_(std::move(at_boundary)),
        boundary_at_or_below_(static_cast<std::size_t>(chunks) + 1),
        chunks_(chunks) {
    int64_t last = 0;
    for (int64_t x = 0; x <= chunks; ++x) {
      if (at_boundary_[static_cast<std::size_t>(x)]) last = x;
      boundary_at_or_below_[static_cast<std::size_t>(x)] = static_cast<int32_t>(last);
    }
  }

  std::vector<int64_t> ranges(int64_t floor, int64_t max_ctas) {
    // The least feasible bottleneck by bisection: a range may always take all chunks, so `chunks` is feasible.
    int64_t low = std::min(floor, chunks_), high = chunks_;
    if (ctas_needed(low) > max_ctas) {
      while (high - low > 1) {
        const int64_t mid = low + (high - low) / 2;
        (ctas_needed(mid) <= max_ctas ? high : low) = mid;
      }
      low = high;
    }
    const int64_t bottleneck = low;
    ctas_needed(bottleneck);  // the table for the chosen bottleneck
    // Walk forward. A range ends at a row boundary wherever the ranges left still fit: within the floor if it can
    // (ranges no longer than they need be), else within the bottleneck; otherwise inside a row.
    std::vector<int64_t> begin{0};
    const auto fits = [&](int64_t end, int64_t at, int64_t left) {
      return end > at && needed_[static_cast<std::size_t>(end)] <= left - 1;
    };
    for (int64_t at = 0, left = max_ctas; at < chunks_; --left) {
      const Ends e = ends(at, bottleneck);
      const int64_t short_whole = ends(at, std::min(floor, bottleneck)).whole;
      at = fits(short_whole, at, left) ? short_whole : fits(e.whole, at, left) ? e.whole : e.cut;
      begin.push_back(at);
    }
    return begin;
  }

 private:
  struct Ends {
    int64_t whole, cut;  // the furthest ends within the bottleneck at a row boundary and inside a row (<= at: none)
  };
  Ends ends(int64_t at, int64_t bottleneck) const {
    const int64_t cut_cost = WarpStreamSchedule::kCutCost;
    const bool starts_inside = !at_boundary_[static_cast<std::size_t>(at)];
    const int64_t whole_reach = std::min(chunks_, at + bottleneck - (starts_inside ? cut_cost : 0));
    const int64_t whole = whole_reach > at ? boundary_at_or_below_[static_cast<std::size_t>(whole_reach)] : at;
    const int64_t cut = std::min(chunks_ - 1, at + bottleneck - cut_cost);
    const bool cut_ok = cut - at >= WarpStreamSchedule::kMinCutChunks && !at_boundary_[static_cast<std::size_t>(cut)];
    return {whole, cut_ok ? cut : at};
  }
  // Fills needed_[x]: the fewest ranges covering [x, chunks) at the bottleneck (kUnreachable where none do).
  int64_t ctas_needed(int64_t bottleneck) {
    constexpr int32_t kUnreachable = std::numeric_limits<int32_t>::max();
    needed_.assign(static_cast<std::size_t>(chunks_) + 1, kUnreachable);
    needed_[static_cast<std::size_t>(chunks_)] = 0;
    for (int64_t x = chunks_ - 1; x >= 0; --x) {
      const Ends e = ends(x, bottleneck);
      int32_t best = kUnreachable;
      if (e.whole > x) best = std::min(best, needed_[static_cast<std::size_t>(e.whole)]);
      if (e.cut > x) best = std::min(best, needed_[static_cast<std::size_t>(e.cut)]);
      needed_[static_cast<std::size_t>(x)] = best == kUnreachable ? kUnreachable : best + 1;
    }
    return needed_[0];
  }

  std::vector<bool> at_boundary_;
  // 32-bit: the caller checks that chunk indices fit. O(chunks) memory and time per bisection step.
  std::vector<int32_t> boundary_at_or_below_, needed_;
  int64_t chunks_;
};

}  // namespace

WarpStreamSchedule warp_stream_schedule(const std::vector<int32_t>& row_ptr, int chunks_per_tile, int64_t target_ctas,
                                        int64_t max_ctas) {
  require(chunks_per_tile >= 1 && target_ctas >= 1 && max_ctas >= 1, ErrorCode::invalid_argument,
          "warp_stream_schedule: chunks per tile, target and maximum CTAs must be positive, got " +
              std::to_string(chunks_per_tile) + ", " + std::to_string(target_ctas) + ", " + std::to_string(max_ctas));
  const std::size_t rows = row_ptr.empty() ? 0 : row_ptr.size() - 1;
  const int64_t chunks = rows ? int64_t{row_ptr.back()} * chunks_per_tile : 0;
  if (chunks == 0 || chunks > std::numeric_limits<int32_t>::max()) return {};
  const auto row_begin = [&](std::size_t r) { return int64_t{row_ptr[r]} * chunks_per_tile; };
  std::vector<bool> at_boundary(static_cast<std::size_t>(chunks) + 1, false);
  for (std::size_t r = 0; r <= rows; ++r) at_boundary[static_cast<std::size_t>(row_begin(r))] = true;
  // Ranges of at least the target's share plus the slack: whole rows rather than more CTAs than the target asks.
  const double share = static_cast<double>(chunks) / static_cast<double>(target_ctas);
  const int64_t floor = std::max<int64_t>(1, static_cast<int64_t>(share * (1.0 + WarpStreamSchedule::kRowSlack)));
  const std::vector<int64_t> begin = RangePartition(std::move(at_boundary), chunks).ranges(floor, max_ctas);
  WarpStreamSchedule s;
  s.cta_begin.assign(begin.begin(), begin.end());
  s.row_ctas.assign(2 * rows, -1);
  std::size_t cta = 0;  // the CTA holding the current row's first chunk
  for (std::size_t r = 0; r < rows; ++r) {
    const int64_t first_chunk = row_begin(r), end_chunk = row_begin(r + 1);
    if (first_chunk == end_chunk) continue;
    while (begin[cta + 1] <= first_chunk) ++cta;
    std::size_t last = cta;
    while (begin[last + 1] < end_chunk) ++last;
    if (last > cta) {
      s.row_ctas[2 * r] = static_cast<int32_t>(2 * cta + (begin[cta] < first_chunk ? 1 : 0));
      s.row_ctas[2 * r + 1] = static_cast<int32_t>(last);
    }
  }
  return s;
}

std::vector<WarpStreamLead> warp_stream_leads(const WarpStreamSchedule& s, const std::vector<int32_t>& row_ptr,
                                              const std::vector<int32_t>& col_index, int chunks_per_tile) {
  require(s.ctas() > 0 && chunks_per_tile >= 1 && !row_ptr.empty() &&
              int64_t{row_ptr.back()} * chunks_per_tile == s.cta_begin.back() &&
              col_index.size() == static_cast<std::size_t>(row_ptr.back()) &&
              s.row_ctas.size() == 2 * (row_ptr.size() - 1),
          ErrorCode::invalid_argument, "warp_stream_leads: the schedule does not match the weight's arrays");
  const std::vector<int32_t> tile_row = tile_row_of_tiles(row_ptr);
  const int64_t chunks = s.cta_begin.back();
  const auto row_of = [&](int64_t chunk) { return tile_row[static_cast<std::size_t>(chunk / chunks_per_tile)]; };
  std::vector<WarpStreamLead> leads;
  leads.reserve(static_cast<std::size_t>(s.ctas() * WarpStreamLead::kWarpsPerCta));
  for (int64_t cta = 0; cta < s.ctas(); ++cta) {
    const int64_t cta_begin = s.cta_begin[static_cast<std::size_t>(cta)],
                  cta_end = s.cta_begin[static_cast<std::size_t>(cta) + 1];
    // The kernel's cut: the range's chunks evenly over min(warps, length) warps; the others idle.
    const int64_t length = cta_end - cta_begin,
                  parts = std::min<int64_t>(WarpStreamLead::kWarpsPerCta, std::max<int64_t>(length, 1));
    for (int64_t warp = 0; warp < WarpStreamLead::kWarpsPerCta; ++warp) {
      WarpStreamLead l{};
      const bool working = warp < parts && length > 0;
      const int64_t begin = working ? cta_begin + warp * length / parts : cta_end;
      const int64_t end = working ? cta_begin + (warp + 1) * length / parts : cta_end;
      l.begin = static_cast<int32_t>(begin), l.end = static_cast<int32_t>(end);
      l.ends_cta = working && end == cta_end;
      l.before_row = l.after_row = l.last_row = -1;
      l.first_row_ctas[0] = l.first_row_ctas[1] = l.last_row_ctas[0] = l.last_row_ctas[1] = -1;
      for (int i = 0; i < WarpStreamLead::kChunks; ++i) {
        const bool inside = begin + i < end;
        l.column[i] = inside ? col_index[static_cast<std::size_t>((begin + i) / chunks_per_tile)] : 0;
        l.row[i] = inside ? row_of(begin + i) : -1;
      }
      if (begin < end) {
        if (begin > 0) l.before_row = row_of(begin - 1);
        if (end < chunks) l.after_row = row_of(end);
        l.last_row = row_of(end - 1);
        const auto first = static_cast<std::size_t>(l.row[0]), last = static_cast<std::size_t>(l.last_row);
        l.first_row_ctas[0] = s.row_ctas[2 * first], l.first_row_ctas[1] = s.row_ctas[2 * first + 1];
        l.last_row_ctas[0] = s.row_ctas[2 * last], l.last_row_ctas[1] = s.row_ctas[2 * last + 1];
      }
      leads.push_back(l);
    }
  }
  return leads;
}

std::vector<int32_t> pair_tile_rows(const PackedTiles& p) {
  check_csr(p, "pair_tile_rows");
  const int64_t rows = p.grid_rows(), words = ceil_div(p.grid_cols(), int64_t{64});
  const auto count = [&](int64_t r) {
    return p.row_ptr[static_cast<std::size_t>(r) + 1] - p.row_ptr[static_cast<std::size_t>(r)];
  };
  std::vector<uint64_t> columns(static_cast<std::size_t>(rows * words), 0);  // each row's tile columns as a bit set
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t t = p.row_ptr[static_cast<std::size_t>(r)]; t < p.row_ptr[static_cast<std::size_t>(r) + 1]; ++t) {
      const int32_t j = p.col_index[static_cast<std::size_t>(t)];
      columns[static_cast<std::size_t>(r * words + j / 64)] |= uint64_t{1} << (j % 64);
    }
  const auto shared = [&](int64_t a, int64_t b) {
    int64_t n = 0;
    for (int64_t w = 0; w < words; ++w)
      n += std::popcount(columns[static_cast<std::size_t>(a * words + w)] &
                         columns[static_cast<std::size_t>(b * words + w)]);
    return n;
  };
  // No pair may take more steps than the neighbours' longest: on skewed patterns that block bounds the product's
  // time (its unit runs last), and two heavy rows sharing many columns would make it longer.
  int64_t neighbour_shared = 0, longest = 0;
  for (int64_t r = 0; r < rows; r += 2) {
    const int64_t n = r + 1 < rows ? shared(r, r + 1) : 0;
    neighbour_shared += n, longest = std::max<int64_t>(longest, count(r) + (r + 1 < rows ? count(r + 1) : 0) - n);
  }
  std::vector<int32_t> order(static_cast<std::size_t>(rows));  // most tiles first (ties: ascending row)
  for (int64_t r = 0; r < rows; ++r) order[static_cast<std::size_t>(r)] = static_cast<int32_t>(r);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return count(a) > count(b); });
  std::vector<char> paired(static_cast<std::size_t>(rows), 0);
  std::vector<int32_t> pairs;
  pairs.reserve(static_cast<std::size_t>(rows + 1));
  int64_t greedy_shared = 0, greedy_longest = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const int32_t a = order[i];
    if (paired[static_cast<std::size_t>(a)]) continue;
    paired[static_cast<std::size_t>(a)] = 1;
    // The partner that shares the most columns within the bound, else the one whose pair takes the fewest steps.
    int32_t best = -1;
    int64_t best_shared = -1, best_steps = 0;
    int scanned = 0;
    for (std::size_t k = i + 1; k < order.size() && scanned < kPairWindow; ++k) {
      const int32_t b = order[k];
      if (paired[static_cast<std::size_t>(b)]) continue;
      ++scanned;
      const int64_t n = shared(a, b), steps = count(a) + count(b) - n;
      const bool fits = steps <= longest, best_fits = best >= 0 && best_steps <= longest;
      if (best < 0 || (fits && (!best_fits || n > best_shared)) || (!fits && !best_fits && steps < best_steps))
        best = b, best_shared = n, best_steps = steps;
    }
    if (best >= 0) paired[static_cast<std::size_t>(best)] = 1, greedy_shared += best_shared;
    greedy_longest = std::max<int64_t>(greedy_longest, best >= 0 ? best_steps : count(a));
    pairs.push_back(a), pairs.push_back(best);
  }
  // Steps in all = tiles - shared columns: neighbours where they share as many (or the bound could not hold).
  if (neighbour_shared >= greedy_shared || greedy_longest > longest) {
    pairs.clear();
    for (int64_t r = 0; r < rows; r += 2)
      pairs.push_back(static_cast<int32_t>(r)), pairs.push_back(r + 1 < rows ? static_cast<int32_t>(r + 1) : -1);
  }
  return pairs;
}

TileBlockSchedule tile_block_schedule(const PackedTiles& p) {
  require(p.tile_rows == 64 || p.tile_rows == 128, ErrorCode::unsupported,
          "tile_block_schedule: 128-row blocks need tile rows of 64 or 128, got " + std::to_string(p.tile_rows));
  const int rows_per_block = kTileBlockRows / p.tile_rows;
  const int64_t grid_rows = p.grid_rows(), blocks = ceil_div(grid_rows, int64_t{rows_per_block});
  const auto ptr = [&](int64_t row) { return p.row_ptr[static_cast<std::size_t>(row)]; };
  // The tile rows of each block: the pairs of 64-row tile rows, or one 128-row tile row (its two 64-row groups).
  const std::vector<int32_t> block_rows = rows_per_block == 2 ? pair_tile_rows(p) : std::vector<int32_t>{};
  const auto past_groups = static_cast<int32_t>(ceil_div(p.rows, int64_t{kTileBlockRows / 2}));  // no rows
  TileBlockSchedule schedule;
  schedule.block_groups.resize(static_cast<std::size_t>(2 * blocks));
  for (int64_t b = 0; b < blocks; ++b)
    for (int w = 0; w < 2; ++w) {
      const int32_t row =
          rows_per_block == 2 ? block_rows[static_cast<std::size_t>(2 * b + w)] : static_cast<int32_t>(2 * b + w);
      schedule.block_groups[static_cast<std::size_t>(2 * b + w)] = row >= 0 ? row : past_groups;
    }
  // Each block's steps in block order first: a merge of its (one or two) ascending column lists.
  std::vector<std::vector<TileStep>> per_block(static_cast<std::size_t>(blocks));
  std::vector<int32_t> natural_ptr(static_cast<std::size_t>(blocks) + 1, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first_row = rows_per_block == 2 ? block_rows[static_cast<std::size_t>(2 * b)] : b;
    const int64_t second_row = rows_per_block == 2 ? block_rows[static_cast<std::size_t>(2 * b + 1)] : -1;
    const int rows = second_row >= 0 ? 2 : 1;
    int32_t next[2] = {ptr(first_row), rows == 2 ? ptr(second_row) : 0};
    const int32_t last[2] = {ptr(first_row + 1), rows == 2 ? ptr(second_row + 1) : 0};
    std::vector<TileStep>& steps = per_block[static_cast<std::size_t>(b)];
    for (;;) {
      int32_t column = INT32_MAX;
      for (int w = 0; w < rows; ++w)
        if (next[w] < last[w]) column = std::min(column, p.col_index[static_cast<std::size_t>(next[w])]);
      if (column == INT32_MAX) break;
      TileStep step{column, {-1, -1}, 0};
      if (rows_per_block == 1) {
        step.tile[0] = step.tile[1] = next[0]++, step.mask = 0x3;
      } else {
        for (int w = 0; w < rows; ++w)
          if (next[w] < last[w] && p.col_index[static_cast<std::size_t>(next[w])] == column)
            step.tile[w] = next[w]++, step.mask |= 1 << w;
      }
      steps.push_back(step);
    }
    natural_ptr[static_cast<std::size_t>(b) + 1] =
        natural_ptr[static_cast<std::size_t>(b)] + static_cast<int32_t>(steps.size());
  }
  // Then laid out longest first: the order in which units are handed to CTAs.
  schedule.block = tile_rows_longest_first(natural_ptr);
  schedule.step_ptr.reserve(static_cast<std::size_t>(blocks) + 1);
  schedule.step_ptr.push_back(0);
  schedule.steps.reserve(static_cast<std::size_t>(natural_ptr.back()));
  for (const int32_t b : schedule.block) {
    const std::vector<TileStep>& steps = per_block[static_cast<std::size_t>(b)];
    schedule.steps.insert(schedule.steps.end(), steps.begin(), steps.end());
    schedule.step_ptr.push_back(static_cast<int32_t>(schedule.steps.size()));
  }
  return schedule;
}

PackedTiles widen_tiles(const PackedTiles& p) {
  check_csr(p, "widen_tiles");
  PackedTiles w;
  w.rows = p.rows, w.cols = p.cols, w.dtype = p.dtype;
  w.tile_rows = std::max(p.tile_rows, kSm90MinTileSide), w.tile_cols = std::max(p.tile_cols, kSm90MinTileSide);
  const int rows_per_wide = w.tile_rows / p.tile_rows, cols_per_wide = w.tile_cols / p.tile_cols;
  const int64_t grid_rows = p.grid_rows(), wide_rows = w.grid_rows(), wide_cols = w.grid_cols();
  const int64_t small_elems = int64_t{p.tile_rows} * p.tile_cols, wide_elems = int64_t{w.tile_rows} * w.tile_cols;
  w.row_ptr.assign(1, 0);
  std::vector<int32_t> slot(static_cast<std::size_t>(wide_cols), -1);  // wide column -> its tile in this wide row
  for (int64_t wr = 0; wr < wide_rows; ++wr) {
    const int64_t first = wr * rows_per_wide, last = std::min(first + rows_per_wide, grid_rows);
    const auto begin = w.col_index.size();
    for (int64_t i = first; i < last; ++i)  // the wide columns this wide row stores
      for (int32_t t = p.row_ptr[static_cast<std::size_t>(i)]; t < p.row_ptr[static_cast<std::size_t>(i) + 1]; ++t)
        w.col_index.push_back(p.col_index[static_cast<std::size_t>(t)] / cols_per_wide);
    std::sort(w.col_index.begin() + static_cast<std::ptrdiff_t>(begin), w.col_index.end());
    w.col_index.erase(std::unique(w.col_index.begin() + static_cast<std::ptrdiff_t>(begin), w.col_index.end()),
                      w.col_index.end());
    require(w.col_index.size() <= static_cast<std::size_t>(INT32_MAX), ErrorCode::unsupported,
            "widen_tiles: 2^31 or more widened tiles");
    for (auto t = begin; t < w.col_index.size(); ++t)
      slot[static_cast<std::size_t>(w.col_index[t])] = static_cast<int32_t>(t);
    w.data.resize(w.col_index.size() * static_cast<std::size_t>(wide_elems), 0);
    for (int64_t i = first; i < last; ++i)  // each small tile into its place in its wide tile, row by row
      for (int32_t t = p.row_ptr[static_cast<std::size_t>(i)]; t < p.row_ptr[static_cast<std::size_t>(i) + 1]; ++t) {
        const int32_t j = p.col_index[static_cast<std::size_t>(t)];
        uint16_t* wide = w.data.data() + slot[static_cast<std::size_t>(j / cols_per_wide)] * wide_elems +
                         (i - first) * p.tile_rows * w.tile_cols + (j % cols_per_wide) * p.tile_cols;
        const uint16_t* small = p.data.data() + t * small_elems;
        for (int r = 0; r < p.tile_rows; ++r)
          std::memcpy(wide + int64_t{r} * w.tile_cols, small + int64_t{r} * p.tile_cols,
                      static_cast<std::size_t>(p.tile_cols) * 2);
      }
    w.row_ptr.push_back(static_cast<int32_t>(w.col_index.size()));
  }
  return w;
}

PackedTiles split_tile_rows(const PackedTiles& p, int tile_rows) {
  check_csr(p, "split_tile_rows");
  require(tile_rows >= 1 && p.tile_rows % tile_rows == 0, ErrorCode::invalid_argument,
          "split_tile_rows: " + std::to_string(tile_rows) + " does not divide the tiles' " +
              std::to_string(p.tile_rows) + " rows");
  PackedTiles q;
  q.rows = p.rows, q.cols = p.cols, q.dtype = p.dtype, q.tile_rows = tile_rows, q.tile_cols = p.tile_cols;
  const int parts = p.tile_rows / tile_rows;
  const int64_t part_elems = int64_t{tile_rows} * p.tile_cols, tile_elems = part_elems * parts, rows = q.grid_rows();
  q.row_ptr.reserve(static_cast<std::size_t>(rows) + 1);
  q.row_ptr.push_back(0);
  for (int64_t i = 0; i < rows; ++i) {  // part i % parts of p's tile row i / parts
    const auto row = static_cast<std::size_t>(i / parts);
    const int64_t offset = (i % parts) * part_elems;
    for (int32_t t = p.row_ptr[row]; t < p.row_ptr[row + 1]; ++t) {
      q.col_index.push_back(p.col_index[static_cast<std::size_t>(t)]);
      const auto from = p.data.begin() + static_cast<std::ptrdiff_t>(t * tile_elems + offset);
      q.data.insert(q.data.end(), from, from + static_cast<std::ptrdiff_t>(part_elems));
    }
    require(q.col_index.size() <= static_cast<std::size_t>(INT32_MAX), ErrorCode::unsupported,
            "split_tile_rows: 2^31 or more split tiles");
    q.row_ptr.push_back(static_cast<int32_t>(q.col_index.size()));
  }
  return q;
}

bool TileBlockSchedule::balanced() const noexcept {
  if (block.empty()) return true;
  const double longest = step_ptr[1] - step_ptr[0], total = step_ptr.back();  // position 0 has the most steps
  return longest * static_cast<double>(block.size()) <= kBalancedStepRatio * total;
}

void check_packed_tiles(const PackedTiles& p) {
  require(
      tile_kernel_supports(p.tile_rows, p.tile_cols), ErrorCode::unsupported,
      "DeviceTiles: the kernels run tile sides 16, 32, 64 or 128, got " + tile_shape_name(p.tile_rows, p.tile_cols));
  require(p.dtype == DType::f16 || p.dtype == DType::bf16, ErrorCode::unsupported, "DeviceTiles: f16 or bf16 only");
  check_csr(p, "DeviceTiles::upload");
}

}  // namespace nmkit::gpu
