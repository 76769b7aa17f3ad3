#include <fmt/core.h>

#include <algorithm>

#include "commands.hpp"
#include "nmkit/io/model.hpp"

namespace nmkit::cli {

Action add_inspect(CLI::App& app) {
  auto path = std::make_shared<std::string>();
  app.add_option("file", *path, "A safetensors file (dense or written by nmkit)")->required()->check(CLI::ExistingFile);
  return [path] {
    const ModelFile model = load_model(*path);
    std::size_t name_width = 6;
    for (const auto& w : model.weights) name_width = std::max(name_width, w.name.size());
    fmt::print("{:<{}}  {:>12}  {:>5}  {:>12}  {:>8}  {:>11}  {:>11}  {:>7}\n", "tensor", name_width, "shape", "dtype",
               "format", "density", "stored", "dense", "ratio");
    std::size_t total_stored = 0, total_dense = 0;
    for (const auto& w : model.weights) {
      std::string shape, dtype, format;
      double density = 1.0;
      std::size_t stored = 0, dense = 0;
      if (const auto* t = std::get_if<StTensor>(&w.weight)) {
        shape = shape_string(t->shape), dtype = st_dtype_name(t->dtype), format = "dense";
        stored = dense = t->data.size();
      } else {
        const auto& s = std::get<SparseMatrix>(w.weight);
        shape = shape_string({rows_of(s), cols_of(s)}), dtype = dtype_name(dtype_of(s)), format = format_name(s);
        density = format_density(s);
        stored = storage_bytes(s);
        dense = rows_of(s) * cols_of(s) * dtype_size(dtype_of(s));
      }
      total_stored += stored, total_dense += dense;
      fmt::print("{:<{}}  {:>12}  {:>5}  {:>12}  {:>8.4f}  {:>11}  {:>11}  {:>6.2f}%\n", w.name, name_width, shape, dtype,
                 format, density, human_bytes(stored), human_bytes(dense), dense ? 100.0 * stored / dense : 100.0);
    }
    fmt::print("total: {} tensors, {} stored, {} as dense ({:.2f}%)\n", model.weights.size(), human_bytes(total_stored),
               human_bytes(total_dense), total_dense ? 100.0 * total_stored / total_dense : 100.0);
    return 0;
  };
}

}  // namespace nmkit::cli
