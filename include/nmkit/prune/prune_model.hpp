#pragma once
// Prunes every selected 2-D weight of a model file into one format, by the chosen method and schedule.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nmkit/format/quantized.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/io/model.hpp"
#include "nmkit/model/calibration.hpp"
#include "nmkit/prune/energy.hpp"
#include "nmkit/prune/fisher.hpp"
#include "nmkit/prune/schedule.hpp"

namespace nmkit {

struct ModelPruneOptions {
  FormatSpec spec = NmSpec{2, 4};
  std::string include = ".*";          // RE2 regular expression, searched in the tensor name
  std::string exclude = "embeddings";  // embedding tables are lookups, not products; "" excludes nothing
  PruneMethod method = PruneMethod::magnitude;
  // Input statistics per weight name, needed by wanda and obs (collect_statistics).
  const std::map<std::string, LayerStatistics>* statistics = nullptr;
  ObsOptions obs;
  int schedule_steps = 1;  // > 1: the gradual structure-decay schedule towards `spec` (schedule.hpp)
  // With obs: gradients per weight name ([samples, R, K]) make the curvature an empirical Fisher (fisher.hpp)
  // instead of the calibration Hessian.
  const SafetensorsFile* fisher_gradients = nullptr;
  FisherOptions fisher;
  // After pruning, store the kept values in this dtype (convert_values; default: the weight's own).
  std::optional<DType> value_dtype;
  // After pruning, quantize the kept values to 8 bits with a scale per row (quantize_nm: per-channel absmax,
  // round to nearest even). N:M formats only; not with value_dtype.
  std::optional<QuantType> quantize;
};

struct TensorPruneReport {
  std::string name;
  std::vector<int64_t> shape;
  std::string format;  // "dense" when kept as it was
  std::string dtype;   // of the stored values: "f32", "f16", "bf16", "e4m3", "e5m2", "int8", or a dense tensor's
  double density = 1;  // kept entries / entries
  double energy = 1;   // kept L1 / total L1
  std::size_t bytes_before = 0;
  std::size_t bytes_after = 0;
  bool pruned = false;
};

struct ModelPruneReport {
  std::vector<TensorPruneReport> tensors;
  EnergyTally energy;  // over the pruned tensors
  // Selected weights kept dense because the calibration saw no input for them (no statistics): a layer the
  // calibration forward never runs, such as BERT's pooler.
  std::vector<std::string> skipped;
  std::size_t bytes_before = 0;
  std::size_t bytes_after = 0;
  int pruned_count = 0;
};

using PruneProgress = std::function<void(std::size_t done, std::size_t total, const std::string& name)>;

// The names of the dense 2-D floating-point weights that `options.include` / `exclude` select, each checked to
// hold finite values (Error naming tensor, row and column otherwise), after checking that `options.quantize` suits
// the format. prune_model starts with it; a caller calls it first to fail before costly calibration.
std::vector<std::string> select_weights(const ModelFile& model, const ModelPruneOptions& options);

// Replaces the selected dense 2-D floating-point weights of `model` by their compressed form. With wanda or
// obs, a selected weight without calibration statistics is kept dense and listed in `skipped`.
ModelPruneReport prune_model(ModelFile& model, const ModelPruneOptions& options, const PruneProgress& progress = {});

// Sequential calibrated pruning (SparseGPT-style): the selected weights stage by stage (a stage is a list of weight
// names, e.g. one encoder layer's linears), each stage pruned with statistics that `collect` gathers on `model` as it
// stands, the stages before it already pruned; selected weights of no stage form a last one. options.statistics is
// ignored (each stage's come from `collect`); everything else as prune_model, whose report this returns for the whole
// model. Throws as prune_model and select_weights do, before anything is pruned for a bad option or weight.
using CollectStatistics = std::function<std::map<std::string, LayerStatistics>(const ModelFile& model)>;
using StageProgress = std::function<void(std::size_t stage, std::size_t stages, const std::string& what)>;
ModelPruneReport prune_model_in_stages(ModelFile& model, const ModelPruneOptions& options,
                                       const std::vector<std::vector<std::string>>& stages,
                                       const CollectStatistics& collect, const StageProgress& progress = {});

}  // namespace nmkit
