#include "nmkit/prune/prune_model.hpp"

#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <map>
#include <set>

#include "nmkit/error.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/wanda.hpp"

namespace nmkit {
namespace {

// A name filter in RE2's syntax: matching takes time linear in the name and the compiler keeps no recursion
// whose depth the pattern sets, so no pattern can crash or stall a run.
std::unique_ptr<RE2> compile_name_filter(const std::string& pattern, const char* option) {
  constexpr std::size_t kShownChars = 80;
  RE2::Options re2_options;
  re2_options.set_log_errors(false);
  auto filter = std::make_unique<RE2>(pattern, re2_options);
  if (!filter->ok()) {
    const std::string shown = pattern.size() <= kShownChars ? pattern
                                                            : pattern.substr(0, kShownChars) + "... (" +
                                                                  std::to_string(pattern.size()) + " characters)";
    std::string reason = filter->error();
    if (reason.size() > kShownChars) reason = reason.substr(0, kShownChars) + "...";
    throw Error(ErrorCode::invalid_argument,
                std::string(option) + " '" + shown + "' is not a valid regular expression: " + reason);
  }
  return filter;
}

bool is_float_matrix(const StTensor& t) {
  return t.shape.size() == 2 && (t.dtype == StDType::F32 || t.dtype == StDType::F16 || t.dtype == StDType::BF16);
}

// A tensor that this pass leaves as it is: dense, or compressed by an earlier pass or an earlier run.
TensorPruneReport describe(const NamedWeight& w) {
  TensorPruneReport row;
  row.name = w.name;
  if (const auto* t = std::get_if<StTensor>(&w.weight)) {
    row.shape = t->shape;
    row.format = "dense";
    row.dtype = st_dtype_name(t->dtype);
    std::transform(row.dtype.begin(), row.dtype.end(), row.dtype.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    row.bytes_before = row.bytes_after = t->data.size();
  } else if (const auto* q = std::get_if<QuantizedNmMatrix>(&w.weight)) {
    row.shape = {q->rows, q->cols};
    row.format = format_name(*q);
    row.dtype = quant_type_name(q->type());
    row.bytes_before = dense_storage_bytes(*q);
    row.bytes_after = storage_bytes(*q);
  } else {
    const auto& s = std::get<SparseMatrix>(w.weight);
    row.shape = {rows_of(s), cols_of(s)};
    row.format = format_name(s);
    row.dtype = dtype_name(dtype_of(s));
    row.bytes_before = rows_of(s) * cols_of(s) * dtype_size(dtype_of(s));
    row.bytes_after = storage_bytes(s);
  }
  return row;
}

// RE2 for exactly these names.
std::string exact_names(const std::vector<std::string>& names) {
  std::string pattern = "^(?:";
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) pattern.push_back('|');
    pattern.append(RE2::QuoteMeta(names[i]));
  }
  pattern.append(")$");
  return pattern;
}

PruneResult prune_one(const std::string& name, const DenseMatrix& dense, const ModelPruneOptions& options) {
  if (options.method == PruneMethod::obs && options.fisher_gradients) {
    require(options.schedule_steps == 1, ErrorCode::unsupported, "Fisher OBS runs one shot (no --schedule)");
    try {
      return prune_obs_fisher(dense, read_gradients(*options.fisher_gradients, name, dense.rows, dense.cols),
                              options.spec, options.fisher);
    } catch (const Error& e) {
      throw Error(e.code(), "tensor '" + name + "': " + e.what());
    }
  }
  const LayerStatistics* stats = nullptr;
  if (options.method != PruneMethod::magnitude) {
    require(options.statistics != nullptr, ErrorCode::invalid_argument,
            std::string("pruning method ") + prune_method_name(options.method) + " needs calibration statistics");
    stats = &options.statistics->at(name);  // prune_model skips the weights that have none
  }
  try {
    const std::vector<ScheduleStep> schedule = structure_decay_schedule(options.spec, options.schedule_steps);
    if (schedule.size() > 1) return prune_gradual(dense, schedule, options.method, stats, options.obs).final;
    switch (options.method) {
      case PruneMethod::magnitude:
        return prune_magnitude(dense, options.spec);
      case PruneMethod::wanda:
        return prune_wanda(dense, *stats, options.spec);
      case PruneMethod::obs:
        return prune_obs(dense, *stats, options.spec, options.obs);
    }
  } catch (const Error& e) {
    throw Error(e.code(), "tensor '" + name + "': " + e.what());
  }
  return {};
}

}  // namespace

std::vector<std::string> select_weights(const ModelFile& model, const ModelPruneOptions& options) {
  require(!options.quantize || !options.value_dtype, ErrorCode::invalid_argument,
          "a pruned weight's values are either converted to a dtype or quantized to 8 bits, not both");
  if (options.quantize)
    require(std::holds_alternative<NmSpec>(options.spec), ErrorCode::unsupported,
            std::string("8-bit values (") + quant_type_name(*options.quantize) + ") are supported for N:M formats " +
                "only (2:4, N:M), not " + to_string(options.spec));
  const std::unique_ptr<RE2> include = compile_name_filter(options.include, "--include");
  const std::unique_ptr<RE2> exclude = compile_name_filter(options.exclude, "--exclude");
  std::vector<std::string> names;
  for (const auto& w : model.weights) {
    const auto* t = std::get_if<StTensor>(&w.weight);
    if (!t || !is_float_matrix(*t) || !RE2::PartialMatch(w.name, *include) ||
        (!options.exclude.empty() && RE2::PartialMatch(w.name, *exclude)))
      continue;
    try {
      check_compressed_shape(t->shape[0], t->shape[1]);
      require_finite(to_dense_matrix(*t), "weight");
    } catch (const Error& e) {
      throw Error(e.code(), "tensor '" + w.name + "': " + e.what());
    }
    names.push_back(w.name);
  }
  return names;
}

ModelPruneReport prune_model(ModelFile& model, const ModelPruneOptions& options, const PruneProgress& progress) {
  const std::vector<std::string> names = select_weights(model, options);
  const bool needs_statistics = options.method != PruneMethod::magnitude && !options.fisher_gradients;
  ModelPruneReport report;
  std::set<std::string> selected;
  for (const std::string& name : names) {
    if (needs_statistics && options.statistics && !options.statistics->count(name))
      report.skipped.push_back(name);
    else
      selected.insert(name);
  }
  const std::size_t total = selected.size();
  std::size_t done = 0;
  for (auto& w : model.weights) {
    TensorPruneReport row;
    row.name = w.name;
    if (selected.count(w.name)) {
      if (progress) progress(done, total, w.name);
      const DenseMatrix dense = to_dense_matrix(std::get<StTensor>(w.weight));
      PruneResult result = prune_one(w.name, dense, options);
      row.shape = {dense.rows, dense.cols};
      row.format = format_name(result.compressed);
      row.density = format_density(result.compressed);
      row.energy = result.energy;
      row.bytes_before = dense.storage_bytes();
      row.pruned = true;
      report.energy.add(dense, result.mask);
      ++report.pruned_count;
      if (options.quantize) {
        QuantizedNmMatrix q;
        try {
          q = quantize_nm(std::get<NmMatrix>(result.compressed), *options.quantize);
        } catch (const Error& e) {
          throw Error(e.code(), "tensor '" + w.name + "': " + e.what());
        }
        row.dtype = quant_type_name(q.type());
        row.bytes_after = storage_bytes(q);
        w.weight = std::move(q);
      } else {
        if (options.value_dtype) {
          try {
            result.compressed = convert_values(result.compressed, *options.value_dtype);
          } catch (const Error& e) {
            throw Error(e.code(), "tensor '" + w.name + "': " + e.what());
          }
        }
        row.dtype = dtype_name(dtype_of(result.compressed));
        row.bytes_after = storage_bytes(result.compressed);
        w.weight = std::move(result.compressed);
      }
      ++done;
    } else {
      row = describe(w);
    }
    report.bytes_before += row.bytes_before;
    report.bytes_after += row.bytes_after;
    report.tensors.push_back(std::move(row));
  }
  if (progress) progress(done, total, "");
  return report;
}

ModelPruneReport prune_model_in_stages(ModelFile& model, const ModelPruneOptions& options,
                                       const std::vector<std::vector<std::string>>& stages,
                                       const CollectStatistics& collect, const StageProgress& progress) {
  require(static_cast<bool>(collect), ErrorCode::invalid_argument, "prune_model_in_stages: no statistics collector");
  const std::vector<std::string> names = select_weights(model, options);
  const std::set<std::string> selected(names.begin(), names.end());
  // The selected weights of each stage, then those of no stage (pruned last, from the fully staged model's
  // statistics).
  std::vector<std::vector<std::string>> passes;
  std::set<std::string> staged;
  for (const auto& stage : stages) {
    std::vector<std::string> pass;
    for (const std::string& name : stage)
      if (selected.count(name) && staged.insert(name).second) pass.push_back(name);
    if (!pass.empty()) passes.push_back(std::move(pass));
  }
  std::vector<std::string> rest;
  for (const std::string& name : names)
    if (!staged.count(name)) rest.push_back(name);
  if (!rest.empty()) passes.push_back(std::move(rest));

  std::map<std::string, TensorPruneReport> pruned_rows;
  ModelPruneReport report;
  for (std::size_t i = 0; i < passes.size(); ++i) {
    if (progress) progress(i, passes.size(), "statistics");
    const std::map<std::string, LayerStatistics> statistics = collect(model);
    ModelPruneOptions pass = options;
    pass.include = exact_names(passes[i]);
    pass.statistics = &statistics;
    if (progress) progress(i, passes.size(), "pruning");
    ModelPruneReport part = prune_model(model, pass);
    for (TensorPruneReport& row : part.tensors)
      if (row.pruned) pruned_rows[row.name] = std::move(row);
    report.skipped.insert(report.skipped.end(), part.skipped.begin(), part.skipped.end());
    report.energy.add(part.energy);
    report.pruned_count += part.pruned_count;
  }
  if (progress) progress(passes.size(), passes.size(), "done");
  for (const NamedWeight& w : model.weights) {
    auto it = pruned_rows.find(w.name);
    TensorPruneReport row = it != pruned_rows.end() ? std::move(it->second) : describe(w);
    report.bytes_before += row.bytes_before;
    report.bytes_after += row.bytes_after;
    report.tensors.push_back(std::move(row));
  }
  return report;
}

}  // namespace nmkit
