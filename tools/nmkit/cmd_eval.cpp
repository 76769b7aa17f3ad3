// nmkit eval: pruned against dense sentence embeddings on held-out sentences; --sweep runs the whole
// formats x methods (x value types, fp8 and int8 included) table in memory; --attention N:M runs every layer's
// attention as DFSS (alone, or with the pruned weights).
#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "commands.hpp"
#include "nmkit/error.hpp"
#include "nmkit/format/quantized.hpp"
#include "nmkit/model/bert.hpp"
#include "nmkit/model/calibration.hpp"
#include "nmkit/model/evaluate.hpp"
#include "nmkit/prune/prune_model.hpp"

namespace nmkit::cli {
namespace {

void print_header() {
  fmt::print("{:<14} {:<10} {:<9} {:>8} {:>12} {:>11} {:>10} {:>10}\n", "format", "method", "values", "energy",
             "1-mean cos", "mean cos", "min cos", "NN agree");
}

// `values`: the weights' value type ("-" where a file holds no 8-bit weights), "+act" where the linear layers'
// inputs were quantized per token too. `energy` is empty where it was not measured (a file pruned elsewhere: eval
// never saw its masks).
void print_row(const std::string& format, const std::string& method, const std::string& values,
               std::optional<double> energy, const EmbeddingComparison& c) {
  fmt::print("{:<14} {:<10} {:<9} {:>8} {:>12.5f} {:>11.5f} {:>10.4f} {:>9.1f}%\n", format, method, values,
             energy ? fmt::format("{:.4f}", *energy) : "-", 1.0 - c.mean_cosine, c.mean_cosine, c.min_cosine,
             100.0 * c.neighbour_agreement);
}

constexpr const char* kQuantizedActivations = "+act";

// The sweep's value types: f32 / f16 / bf16 (values rounded to it) or an 8-bit type (quantized per row).
struct ValueType {
  std::string name;
  std::optional<DType> dtype;
  std::optional<QuantType> quant;
};
ValueType parse_value_type(const std::string& name) {
  if (is_quant_type_name(name)) return {quant_type_name(parse_quant_type(name)), std::nullopt, parse_quant_type(name)};
  const DType dtype = parse_value_dtype(name);
  return {dtype_name(dtype), dtype, std::nullopt};
}

// `model` with the values of its linear weights (`linears`) in `type`: compressed ones converted or quantized
// (8-bit: N:M only), dense ones rounded, or quantized per row and stored dequantized (the dense baseline).
ModelFile with_values(const ModelFile& model, const std::vector<std::string>& linears, const ValueType& type) {
  ModelFile out = model;
  for (NamedWeight& w : out.weights) {
    if (std::find(linears.begin(), linears.end(), w.name) == linears.end()) continue;
    if (auto* sparse = std::get_if<SparseMatrix>(&w.weight)) {
      if (type.dtype) {
        *sparse = convert_values(*sparse, *type.dtype);
      } else {
        const auto* nm = std::get_if<NmMatrix>(sparse);
        require(nm != nullptr, ErrorCode::unsupported,
                "8-bit values are supported for N:M formats only, not " + format_name(*sparse));
        w.weight = quantize_nm(*nm, *type.quant);
      }
    } else if (const auto* t = std::get_if<StTensor>(&w.weight)) {
      const DenseMatrix dense = to_dense_matrix(*t);
      if (type.dtype) {
        w.weight = to_tensor(w.name, DenseMatrix::from_float(dense.rows, dense.cols, dense.to_float(), *type.dtype));
      } else {
        const std::vector<float> q = dequantize(
            quantize_rows(dense.to_float(), dense.rows, dense.cols, *type.quant, RowScaling::per_row, w.name));
        w.weight = to_tensor(w.name, DenseMatrix::from_float(dense.rows, dense.cols, q, DType::f32));
      }
    }
  }
  return out;
}

// The dense model beside the pruned file (as `prune` calibrates on the model beside its input), else the default one.
std::string default_dense_model_dir(const std::string& pruned) {
  if (!pruned.empty()) {
    const std::string beside = calibration_model_dir(pruned);
    if (std::filesystem::exists(beside + "/config.json") && std::filesystem::exists(beside + "/model.safetensors"))
      return beside;
  }
  return calibration_model_dir(default_model_path());
}

}  // namespace

Action add_eval(CLI::App& app) {
  struct Options {
    std::string pruned, model_dir;
    std::vector<std::string> corpus = default_corpus_paths();
    std::size_t calibration_sentences = 256, eval_sentences = 128;
    bool sweep = false;
    std::vector<std::string> formats = {"2:4", "vnm:64:2:8", "vnm:128:2:8", "vnm:64:2:16"};
    std::vector<std::string> methods = {"magnitude", "wanda", "obs"};
    std::vector<std::string> candidates = {"diagonal"};
    int schedule_steps = 1;
    std::string attention = "dense";
    std::vector<std::string> dtypes = {"f32"};
    bool quantize_activations = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("pruned", o->pruned, "A pruned model file (nmkit prune); omit with --sweep or --attention");
  app.add_option("--model-dir", o->model_dir,
                 "Dense model directory (config.json, vocab.txt, model.safetensors); default: the pruned file's "
                 "directory when it holds them, else the bundled all-MiniLM-L6-v2");
  app.add_option("--corpus", o->corpus, "Text files or directories of sentences")->capture_default_str();
  std::vector<const CLI::Option*> sweep_only;
  sweep_only.push_back(
      app.add_option("--calibration-sentences", o->calibration_sentences, "Calibration sentences (--sweep)")
          ->capture_default_str());
  app.add_option("--eval-sentences", o->eval_sentences, "Held-out sentences compared")->capture_default_str();
  app.add_flag("--sweep", o->sweep, "Prune all encoder linear weights in memory for every format x method and compare");
  sweep_only.push_back(
      app.add_option("--formats", o->formats, "Formats of the sweep ('dense': the weights unpruned, in each --dtypes)")
          ->capture_default_str());
  sweep_only.push_back(app.add_option("--methods", o->methods, "Methods of the sweep")->capture_default_str());
  sweep_only.push_back(app.add_option("--candidates", o->candidates,
                                      "OBS candidate sets of the sweep (diagonal, pairwise, combinatorial)")
                           ->capture_default_str());
  sweep_only.push_back(
      app.add_option("--schedule", o->schedule_steps, "Also run each method gradually, in this many steps")
          ->capture_default_str()
          ->check(CLI::Range(1, 64)));
  app.add_option("--attention", o->attention,
                 "Attention of every layer: dense, or N:M for DFSS (each row of scores pruned to N:M, e.g. 2:4, 1:2); "
                 "without a pruned file the dense weights with this attention are compared against dense")
      ->capture_default_str();
  sweep_only.push_back(app.add_option("--dtypes", o->dtypes,
                                      "Value types of the sweep's pruned weights: f32, f16, bf16, or 8-bit with a "
                                      "scale per row (N:M and dense only): fp8 (= e4m3), e5m2, int8")
                           ->capture_default_str());
  app.add_flag("--quantize-activations", o->quantize_activations,
               "Also quantize the input of every linear layer with 8-bit weights per token, to the weights' type "
               "(rows marked +act; with --sweep, each 8-bit row is run with and without)");
  return [o, sweep_only] {
    // Without --sweep these options would be parsed and never read: refused, so that none is silently ignored.
    for (const CLI::Option* option : sweep_only)
      require(o->sweep || option->count() == 0, ErrorCode::invalid_argument,
              [&] { return option->get_name() + " applies with --sweep only"; });
    std::vector<ValueType> value_types;
    for (const std::string& name : o->dtypes) value_types.push_back(parse_value_type(name));
    const AttentionOptions attention = parse_attention(o->attention);
    // Row labels name the attention when it is not dense (no spaces: one column).
    const std::string attention_label = attention.dense() ? "" : "dfss-" + o->attention;
    const std::string dir = !o->model_dir.empty() ? o->model_dir : default_dense_model_dir(o->pruned);
    require(o->sweep || !o->pruned.empty() || !attention.dense(), ErrorCode::invalid_argument,
            "eval needs a pruned model file, --sweep or --attention N:M");
    const CorpusSplit split = split_corpus(load_sentences(o->corpus), 4, o->calibration_sentences, o->eval_sentences);
    const std::string dense_file = dir + "/model.safetensors";
    const ModelFile dense_weights = load_model(dense_file);
    const BertEncoder dense = BertEncoder::load(dir, dense_weights, dense_file);
    const auto reference = dense.embed_all(split.evaluation);
    if (!o->sweep) {
      fmt::print("{} held-out sentences, model {}\n", split.evaluation.size(), dir);
      print_header();
      if (o->pruned.empty()) {  // dense weights, DFSS attention
        print_row("dense", attention_label, "-", std::nullopt,
                  compare_embeddings(reference, dense.embed_all(split.evaluation, attention)));
        return 0;
      }
      BertEncoder pruned = BertEncoder::load(dir, o->pruned);
      std::string values = "-";
      if (!pruned.quantized_weights().empty()) {
        values = quant_type_name(pruned.quantized_weights().begin()->second);
        for (const auto& [name, type] : pruned.quantized_weights())
          if (quant_type_name(type) != values) values = "8-bit";
      }
      if (o->quantize_activations) {
        require(!pruned.quantized_weights().empty(), ErrorCode::invalid_argument,
                "--quantize-activations needs a file with 8-bit weights (nmkit prune --dtype fp8|int8)");
        pruned.quantize_linear_inputs(pruned.quantized_weights());
        values += kQuantizedActivations;
      }
      print_row("file", attention.dense() ? o->pruned : o->pruned + "+" + attention_label, values, std::nullopt,
                compare_embeddings(reference, pruned.embed_all(split.evaluation, attention)));
      return 0;
    }
    for (const auto& format : o->formats)
      for (const ValueType& type : value_types)
        if (type.quant && format != "dense")
          require(std::holds_alternative<NmSpec>(parse_format_spec(format)), ErrorCode::unsupported,
                  "8-bit values (" + type.name + ") are supported for N:M formats only, not " + format);
    fmt::print("{} held-out sentences, {} calibration sentences, model {}\n", split.evaluation.size(),
               split.calibration.size(), dir);
    const auto stats = collect_statistics(dense, split.calibration);
    // One row: prune every encoder linear weight in memory, embed the held-out sentences, compare.
    // The dense baseline of each value type: every linear weight unpruned, only its values converted.
    auto evaluate_values = [&](const ModelFile& model, const std::string& format, const std::string& label,
                               std::optional<double> energy) {
      for (const ValueType& type : value_types) {
        BertEncoder encoder = BertEncoder::load(dir, with_values(model, dense.linear_names(), type), format);
        print_row(format, label, type.name, energy,
                  compare_embeddings(reference, encoder.embed_all(split.evaluation, attention)));
        if (type.quant && o->quantize_activations) {
          std::map<std::string, QuantType> inputs;
          for (const std::string& name : dense.linear_names()) inputs[name] = *type.quant;
          encoder.quantize_linear_inputs(inputs);
          print_row(format, label, type.name + kQuantizedActivations, energy,
                    compare_embeddings(reference, encoder.embed_all(split.evaluation, attention)));
        }
        std::fflush(stdout);
      }
    };
    auto evaluate = [&](const std::string& format, const std::string& method_name, const std::string& candidates,
                        int steps) {
      ModelFile model = dense_weights;
      ModelPruneOptions options;
      options.spec = parse_format_spec(format), options.include = kEncoderLinearWeights, options.exclude = "";
      options.method = parse_prune_method(method_name), options.statistics = &stats, options.schedule_steps = steps;
      options.obs.candidates = parse_obs_candidates(candidates);
      const ModelPruneReport report = prune_model(model, options);
      std::string label = method_name;
      if (options.method == PruneMethod::obs && candidates != "diagonal") label += "-" + candidates.substr(0, 4);
      if (steps > 1) label += " x" + std::to_string(steps);
      if (!attention.dense()) label += "+" + attention_label;
      evaluate_values(model, format, label, report.energy.ratio());
    };
    print_header();
    for (const auto& format : o->formats) {
      if (format == "dense") {
        evaluate_values(dense_weights, format, attention.dense() ? "-" : attention_label, 1.0);
        continue;
      }
      for (const auto& method : o->methods) {
        // Candidate sets only shape OBS; the other methods run once.
        const std::vector<std::string> candidate_sets =
            parse_prune_method(method) == PruneMethod::obs ? o->candidates : std::vector<std::string>{"diagonal"};
        for (const auto& candidates : candidate_sets) {
          evaluate(format, method, candidates, 1);
          if (o->schedule_steps > 1) evaluate(format, method, candidates, o->schedule_steps);
        }
      }
    }
    return 0;
  };
}

}  // namespace nmkit::cli
