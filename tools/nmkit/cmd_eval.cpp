// nmkit eval: pruned against dense sentence embeddings on held-out sentences; --sweep runs the whole
// formats x methods table in memory; --attention N:M runs every layer's attention as DFSS (alone, or with the
// pruned weights).
#include <fmt/core.h>

#include <filesystem>
#include <optional>

#include "commands.hpp"
#include "nmkit/error.hpp"
#include "nmkit/model/bert.hpp"
#include "nmkit/model/calibration.hpp"
#include "nmkit/model/evaluate.hpp"
#include "nmkit/prune/prune_model.hpp"

namespace nmkit::cli {
namespace {

void print_header() {
  fmt::print("{:<14} {:<10} {:>8} {:>12} {:>11} {:>10} {:>10}\n", "format", "method", "energy", "1-mean cos",
             "mean cos", "min cos", "NN agree");
}

// `energy` is empty where it was not measured (a file pruned elsewhere: eval never saw its masks).
void print_row(const std::string& format, const std::string& method, std::optional<double> energy,
               const EmbeddingComparison& c) {
  fmt::print("{:<14} {:<10} {:>8} {:>12.5f} {:>11.5f} {:>10.4f} {:>9.1f}%\n", format, method,
             energy ? fmt::format("{:.4f}", *energy) : "-", 1.0 - c.mean_cosine, c.mean_cosine, c.min_cosine,
             100.0 * c.neighbour_agreement);
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
  };
  auto o = std::make_shared<Options>();
  app.add_option("pruned", o->pruned, "A pruned model file (nmkit prune); omit with --sweep or --attention");
  app.add_option("--model-dir", o->model_dir,
                 "Dense model directory (config.json, vocab.txt, model.safetensors); default: the pruned file's "
                 "directory when it holds them, else the bundled all-MiniLM-L6-v2");
  app.add_option("--corpus", o->corpus, "Text files or directories of sentences")->capture_default_str();
  app.add_option("--calibration-sentences", o->calibration_sentences, "Calibration sentences (--sweep)")
      ->capture_default_str();
  app.add_option("--eval-sentences", o->eval_sentences, "Held-out sentences compared")->capture_default_str();
  app.add_flag("--sweep", o->sweep, "Prune all encoder linear weights in memory for every format x method and compare");
  app.add_option("--formats", o->formats, "Formats of the sweep")->capture_default_str();
  app.add_option("--methods", o->methods, "Methods of the sweep")->capture_default_str();
  app.add_option("--candidates", o->candidates, "OBS candidate sets of the sweep (diagonal, pairwise, combinatorial)")
      ->capture_default_str();
  app.add_option("--schedule", o->schedule_steps, "Also run each method gradually, in this many steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--attention", o->attention,
                 "Attention of every layer: dense, or N:M for DFSS (each row of scores pruned to N:M, e.g. 2:4, 1:2); "
                 "without a pruned file the dense weights with this attention are compared against dense")
      ->capture_default_str();
  return [o] {
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
        print_row("dense", attention_label, std::nullopt,
                  compare_embeddings(reference, dense.embed_all(split.evaluation, attention)));
        return 0;
      }
      const BertEncoder pruned = BertEncoder::load(dir, o->pruned);
      print_row("file", attention.dense() ? o->pruned : o->pruned + "+" + attention_label, std::nullopt,
                compare_embeddings(reference, pruned.embed_all(split.evaluation, attention)));
      return 0;
    }
    fmt::print("{} held-out sentences, {} calibration sentences, model {}\n", split.evaluation.size(),
               split.calibration.size(), dir);
    const auto stats = collect_statistics(dense, split.calibration);
    // One row: prune every encoder linear weight in memory, embed the held-out sentences, compare.
    auto evaluate = [&](const std::string& format, const std::string& method_name, const std::string& candidates,
                        int steps) {
      ModelFile model = dense_weights;
      ModelPruneOptions options;
      options.spec = parse_format_spec(format), options.include = kEncoderLinearWeights, options.exclude = "";
      options.method = parse_prune_method(method_name), options.statistics = &stats, options.schedule_steps = steps;
      options.obs.candidates = parse_obs_candidates(candidates);
      const ModelPruneReport report = prune_model(model, options);
      const BertEncoder pruned = BertEncoder::load(dir, model, format);
      std::string label = method_name;
      if (options.method == PruneMethod::obs && candidates != "diagonal") label += "-" + candidates.substr(0, 4);
      if (steps > 1) label += " x" + std::to_string(steps);
      if (!attention.dense()) label += "+" + attention_label;
      print_row(format, label, report.energy.ratio(),
                compare_embeddings(reference, pruned.embed_all(split.evaluation, attention)));
      std::fflush(stdout);
    };
    print_header();
    for (const auto& format : o->formats)
      for (const auto& method : o->methods) {
        // Candidate sets only shape OBS; the other methods run once.
        const std::vector<std::string> candidate_sets =
            parse_prune_method(method) == PruneMethod::obs ? o->candidates : std::vector<std::string>{"diagonal"};
        for (const auto& candidates : candidate_sets) {
          evaluate(format, method, candidates, 1);
          if (o->schedule_steps > 1) evaluate(format, method, candidates, o->schedule_steps);
        }
      }
    return 0;
  };
}

}  // namespace nmkit::cli
