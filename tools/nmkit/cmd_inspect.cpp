#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <iterator>

#include "commands.hpp"
#include "nmkit/gpu/detail/tile_schedule.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/io/model.hpp"

namespace nmkit::cli {
namespace {

// The Hopper tile kernel's work on a tile weight: its steps (one slab of x per tile column a 128-row block stores)
// with neighbouring 64-row tile rows as blocks and with the rows paired by shared columns, as the upload pairs
// them (gpu::pair_tile_rows), and the tiles per step. Tiles narrower than 64 count through the widened copy the
// kernel runs; none for tile sides the kernels do not run.
struct TileSchedule {
  bool runs = false;
  int64_t neighbour_steps = 0, paired_steps = 0, tiles = 0;
};
TileSchedule tile_schedule(const TileMatrix& t) {
  if (!gpu::tile_kernel_supports(t.tile_rows, t.tile_cols)) return {};
  // Only the structure matters: the values as f16 so that the kernels' packing takes them.
  gpu::PackedTiles p = gpu::pack_tiles(std::get<TileMatrix>(convert_values(SparseMatrix{t}, DType::f16)));
  if (p.tile_rows < gpu::kSm90MinTileSide || p.tile_cols < gpu::kSm90MinTileSide) p = gpu::widen_tiles(p);
  TileSchedule s{true, 0, static_cast<int64_t>(gpu::tile_block_schedule(p).steps.size()), p.nnz_tiles()};
  const int rows_per_block = gpu::kTileBlockRows / p.tile_rows;
  const auto columns = [&](int64_t row) {
    return std::pair{p.col_index.begin() + p.row_ptr[static_cast<std::size_t>(row)],
                     p.col_index.begin() + p.row_ptr[static_cast<std::size_t>(row) + 1]};
  };
  for (int64_t r = 0; r < p.grid_rows(); r += rows_per_block) {
    const auto [a, a_end] = columns(r);
    if (rows_per_block == 1 || r + 1 == p.grid_rows()) {
      s.neighbour_steps += a_end - a;
      continue;
    }
    const auto [b, b_end] = columns(r + 1);
    std::vector<int32_t> both;
    std::set_union(a, a_end, b, b_end, std::back_inserter(both));
    s.neighbour_steps += static_cast<int64_t>(both.size());
  }
  return s;
}

}  // namespace

Action add_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  auto schedule = std::make_shared<bool>(false);
  app.add_option("file", *path, "A safetensors file (dense or written by nmkit)")->required()->check(CLI::ExistingFile);
  app.add_flag("--schedule", *schedule,
               "For tile tensors: the Hopper kernel's steps (a slab of x per tile column of a 128-row block) with "
               "neighbouring 64-row tile rows and with the rows paired by shared columns, and tiles per step");
  return [path, schedule] {
    const ModelFile model = load_model(*path);
    std::size_t name_width = 6;
    for (const auto& w : model.weights) name_width = std::max(name_width, w.name.size());
    fmt::print("{:<{}}  {:>12}  {:>5}  {:>12}  {:>8}  {:>11}  {:>11}  {:>7}", "tensor", name_width, "shape", "dtype",
               "format", "density", "stored", "dense", "ratio");
    if (*schedule) fmt::print("  {:>10}  {:>10}  {:>10}", "steps", "paired", "tiles/step");
    fmt::print("\n");
    int64_t total_neighbour_steps = 0, total_paired_steps = 0;
    std::size_t total_stored = 0, total_dense = 0;
    for (const auto& w : model.weights) {
      std::string shape, dtype, format;
      double density = 1.0;
      std::size_t stored = 0, dense = 0;
      if (const auto* t = std::get_if<StTensor>(&w.weight)) {
        // One spelling for dense and pruned tensors: nmkit's lower-case names ("f32", "bf16", "i64").
        dtype = st_dtype_name(t->dtype);
        std::transform(dtype.begin(), dtype.end(), dtype.begin(), [](unsigned char c) { return std::tolower(c); });
        shape = shape_string(t->shape), format = "dense";
        stored = dense = t->data.size();
      } else if (const auto* q = std::get_if<QuantizedNmMatrix>(&w.weight)) {
        // Against the same weight dense at 8 bits with its scales.
        shape = shape_string({q->rows, q->cols}), dtype = quant_type_name(q->type()), format = format_name(*q);
        density = format_density(*q);
        stored = storage_bytes(*q);
        dense = dense_storage_bytes(*q);
      } else {
        const auto& s = std::get<SparseMatrix>(w.weight);
        shape = shape_string({rows_of(s), cols_of(s)}), dtype = dtype_name(dtype_of(s)), format = format_name(s);
        density = format_density(s);
        stored = storage_bytes(s);
        dense = rows_of(s) * cols_of(s) * dtype_size(dtype_of(s));
      }
      total_stored += stored, total_dense += dense;
      fmt::print("{:<{}}  {:>12}  {:>5}  {:>12}  {:>8.4f}  {:>11}  {:>11}  {:>6.2f}%", w.name, name_width, shape, dtype,
                 format, density, human_bytes(stored), human_bytes(dense), dense ? 100.0 * stored / dense : 100.0);
      if (*schedule) {
        const auto* sparse = std::get_if<SparseMatrix>(&w.weight);
        const auto* tiles = sparse ? std::get_if<TileMatrix>(sparse) : nullptr;
        const TileSchedule t = tiles ? tile_schedule(*tiles) : TileSchedule{};
        if (t.runs) {
          fmt::print("  {:>10}  {:>10}  {:>10.2f}", t.neighbour_steps, t.paired_steps,
                     t.paired_steps ? static_cast<double>(t.tiles) / static_cast<double>(t.paired_steps) : 0.0);
          total_neighbour_steps += t.neighbour_steps, total_paired_steps += t.paired_steps;
        } else {
          fmt::print("  {:>10}  {:>10}  {:>10}", "-", "-", "-");
        }
      }
      fmt::print("\n");
    }
    fmt::print("total: {} tensors, {} stored, {} as dense ({:.2f}%)\n", model.weights.size(), human_bytes(total_stored),
               human_bytes(total_dense), total_dense ? 100.0 * total_stored / total_dense : 100.0);
    if (*schedule && total_neighbour_steps > 0)
      fmt::print("tile steps of the Hopper kernel: {} with neighbouring tile rows, {} paired ({:.1f} % fewer)\n",
                 total_neighbour_steps, total_paired_steps,
                 100.0 * static_cast<double>(total_neighbour_steps - total_paired_steps) /
                     static_cast<double>(total_neighbour_steps));
    return 0;
  };
}

}  // namespace nmkit::cli
