#include "nmkit/prune/prune_model.hpp"

#include <regex>

#include "nmkit/error.hpp"
#include "nmkit/prune/magnitude.hpp"

namespace nmkit {
namespace {

std::regex compile_regex(const std::string& pattern, const char* option) {
  try {
    return std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw Error(ErrorCode::invalid_argument, std::string(option) + " '" + pattern + "' is not a valid regex: " + e.what());
  }
}

bool is_float_matrix(const StTensor& t) {
  return t.shape.size() == 2 && (t.dtype == StDType::F32 || t.dtype == StDType::F16 || t.dtype == StDType::BF16);
}

PruneResult prune_one(const std::string& name, const DenseMatrix& dense, const ModelPruneOptions& options) {
  if (options.method == PruneMethod::obs && options.fisher_gradients) {
    require(options.schedule_steps == 1, ErrorCode::unsupported, "Fisher OBS runs one shot (no --schedule)");
    try {
      return prune_obs_fisher(dense, read_gradients(*options.fisher_gradients, name, dense.rows, dense.cols), options.spec,
                              options.fisher);
    } catch (const Error& e) {
      throw Error(e.code(), "tensor '" + name + "': " + e.what());
    }
  }
  const LayerStatistics* stats = nullptr;
  if (options.method != PruneMethod::magnitude) {
    require(options.statistics != nullptr, ErrorCode::invalid_argument,
            std::string("pruning method ") + prune_method_name(options.method) + " needs calibration statistics");
    const auto it = options.statistics->find(name);
    require(it != options.statistics->end(), ErrorCode::invalid_argument,
            "no calibration statistics for tensor '" + name + "' (is it a linear layer of the model?)");
    stats = &it->second;
  }
  try {
    const std::vector<ScheduleStep> schedule = structure_decay_schedule(options.spec, options.schedule_steps);
    if (schedule.size() > 1) return prune_gradual(dense, schedule, options.method, stats, options.obs).final;
    switch (options.method) {
      case PruneMethod::magnitude: return prune_magnitude(dense, options.spec);
      case PruneMethod::wanda: return prune_wanda(dense, *stats, options.spec);
      case PruneMethod::obs: return prune_obs(dense, *stats, options.spec, options.obs);
    }
  } catch (const Error& e) {
    throw Error(e.code(), "tensor '" + name + "': " + e.what());
  }
  return {};
}

}  // namespace

ModelPruneReport prune_model(ModelFile& model, const ModelPruneOptions& options, const PruneProgress& progress) {
  const std::regex include = compile_regex(options.include, "--include");
  const std::regex exclude = compile_regex(options.exclude, "--exclude");
  auto selected = [&](const NamedWeight& w) {
    const auto* t = std::get_if<StTensor>(&w.weight);
    return t && is_float_matrix(*t) && std::regex_search(w.name, include) &&
           (options.exclude.empty() || !std::regex_search(w.name, exclude));
  };
  std::size_t total = 0, done = 0;
  for (const auto& w : model.weights) total += selected(w) ? 1 : 0;

  ModelPruneReport report;
  for (auto& w : model.weights) {
    TensorPruneReport row;
    row.name = w.name;
    if (selected(w)) {
      if (progress) progress(done, total, w.name);
      const DenseMatrix dense = to_dense_matrix(std::get<StTensor>(w.weight));
      PruneResult result = prune_one(w.name, dense, options);
      row.shape = {dense.rows, dense.cols};
      row.format = format_name(result.compressed);
      row.density = dense.rows * dense.cols == 0 ? 1.0 : static_cast<double>(result.mask.count()) / (dense.rows * dense.cols);
      row.energy = result.energy;
      row.bytes_before = dense.storage_bytes();
      row.bytes_after = storage_bytes(result.compressed);
      row.pruned = true;
      report.energy.add(dense, result.mask);
      ++report.pruned_count;
      w.weight = std::move(result.compressed);
      ++done;
    } else if (const auto* t = std::get_if<StTensor>(&w.weight)) {
      row.shape = t->shape;
      row.format = "dense";
      row.bytes_before = row.bytes_after = t->data.size();
    } else {
      const auto& s = std::get<SparseMatrix>(w.weight);
      row.shape = {rows_of(s), cols_of(s)};
      row.format = format_name(s);
      row.bytes_before = rows_of(s) * cols_of(s) * dtype_size(dtype_of(s));
      row.bytes_after = storage_bytes(s);
    }
    report.bytes_before += row.bytes_before;
    report.bytes_after += row.bytes_after;
    report.tensors.push_back(std::move(row));
  }
  if (progress) progress(done, total, "");
  return report;
}

}  // namespace nmkit
