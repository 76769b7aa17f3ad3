#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <cstdio>

#include "commands.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/io/model.hpp"
#include "nmkit/io/output_file.hpp"
#include "nmkit/error.hpp"
#include "nmkit/model/calibration.hpp"
#include "nmkit/prune/prune_model.hpp"

namespace nmkit::cli {
namespace {

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
void draw_progress(std::size_t done, std::size_t total, const std::string& name) {
  constexpr int kWidth = 30;
  const int filled = total ? static_cast<int>(kWidth * done / total) : kWidth;
  fmt::print(stderr, "\r[{}{}] {}/{} {:<50.50}", std::string(filled, '#'), std::string(kWidth - filled, ' '), done,
             total, name);
  if (done == total) fmt::print(stderr, "\r{:<100}\r", "");
  std::fflush(stderr);
}

// The encoder's linear weights grouped by layer ("...layer.<i>...."), in forward order: one stage each.
std::vector<std::vector<std::string>> encoder_layer_stages(const std::vector<std::string>& linears) {
  std::vector<std::vector<std::string>> stages;
  std::string current;
  for (const std::string& name : linears) {
    const std::size_t at = name.find("layer.");
    const std::size_t end = at == std::string::npos ? std::string::npos : name.find('.', at + 6);
    const std::string layer = end == std::string::npos ? name : name.substr(0, end);
    if (stages.empty() || layer != current) stages.emplace_back(), current = layer;
    stages.back().push_back(name);
  }
  return stages;
}

}  // namespace

std::string calibration_model_dir(const std::string& weights_file) {
  std::string dir = std::filesystem::path(weights_file).parent_path().string();
  return dir.empty() ? "." : dir;
}

DType parse_value_dtype(const std::string& name) {
  try {
    return parse_dtype(name);
  } catch (const Error&) {
    throw Error(ErrorCode::invalid_argument,
                "unknown --dtype '" + name + "' (expected f32, f16, bf16, or 8-bit: fp8 (= e4m3), e5m2, int8)");
  }
}

void print_prune_report(const ModelPruneReport& report, bool all) {
  std::size_t name_width = 6;
  for (const auto& t : report.tensors)
    if (all || t.pruned) name_width = std::max(name_width, t.name.size());
  fmt::print("{:<{}}  {:>11}  {:>12}  {:>5}  {:>8}  {:>7}  {:>11}  {:>11}  {:>7}\n", "tensor", name_width, "shape",
             "format", "dtype", "density", "energy", "before", "after", "ratio");
  for (const auto& t : report.tensors) {
    if (!all && !t.pruned) continue;
    fmt::print("{:<{}}  {:>11}  {:>12}  {:>5}  {:>8.4f}  {:>7.4f}  {:>11}  {:>11}  {:>6.2f}%\n", t.name, name_width,
               shape_string(t.shape), t.format, t.dtype, t.density, t.energy, human_bytes(t.bytes_before),
               human_bytes(t.bytes_after), t.bytes_before ? 100.0 * t.bytes_after / t.bytes_before : 100.0);
  }
  fmt::print("total: {} tensors pruned, energy kept {:.4f}, storage {} -> {} ({:.2f}% of before)\n",
             report.pruned_count, report.energy.ratio(), human_bytes(report.bytes_before),
             human_bytes(report.bytes_after),
             report.bytes_before ? 100.0 * report.bytes_after / report.bytes_before : 100.0);
}

Action add_prune(CLI::App& app) {
  struct Options {
    std::string input, output, format, method = "magnitude", model_dir, candidates = "diagonal", fisher;
    std::vector<std::string> corpus = default_corpus_paths();
    std::size_t calibration_sentences = 256;
    ModelPruneOptions prune;
    std::string dtype;
    bool all = false, sequential = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("input", o->input, "Input safetensors file")->required()->check(CLI::ExistingFile);
  app.add_option("-o,--output", o->output, "Output safetensors file (written atomically)")->required();
  app.add_option("-f,--format", o->format,
                 "Target format: 2:4 | N:M | vnm:V:N:M | tile:RxC:DENSITY (tile:S:DENSITY for S x S tiles)")
      ->required();
  app.add_option("--include", o->prune.include, "Regex: prune only 2-D weights whose name matches")
      ->capture_default_str();
  app.add_option("--exclude", o->prune.exclude, "Regex: never prune weights whose name matches ('' for none)")
      ->capture_default_str();
  app.add_option("--dtype", o->dtype,
                 "Values of the pruned weights: as the input (default), f32 | f16 | bf16, or 8-bit with a scale per "
                 "row (quantized after pruning; N:M formats only): fp8 (= e4m3) | e5m2 | int8");
  app.add_flag("--all", o->all, "List the tensors kept as they were too");
  app.add_flag("--sequential", o->sequential,
               "With --method wanda or obs: layer by layer, each encoder layer calibrated with the layers before it "
               "already pruned (SparseGPT-style; one calibration pass per layer)");
  app.add_option("--method", o->method, "magnitude | wanda | obs (wanda and obs calibrate on a BERT model)")
      ->capture_default_str();
  CLI::Option* model_dir =
      app.add_option("--model-dir", o->model_dir,
                     "Directory with config.json and vocab.txt for calibration (default: the input's directory)");
  CLI::Option* corpus = app.add_option("--corpus", o->corpus, "Text files or directories of calibration sentences")
                            ->capture_default_str();
  CLI::Option* sentences = app.add_option("--calibration-sentences", o->calibration_sentences, "Calibration sentences")
                               ->capture_default_str()
                               ->check(CLI::Range(1, 100000));
  CLI::Option* damp =
      app.add_option(
             "--damp", o->prune.obs.damp,
             "With --method obs: damping added to the calibration Hessian's diagonal, as a fraction of its mean")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  CLI::Option* candidates =
      app.add_option("--candidates", o->candidates, "OBS candidate sets: diagonal | pairwise | combinatorial")
          ->capture_default_str();
  app.add_option(
         "--fisher", o->fisher,
         "With --method obs: a safetensors file of gradients [samples, R, K] per weight name (empirical Fisher)")
      ->check(CLI::ExistingFile);
  CLI::Option* fisher_block =
      app.add_option("--fisher-block", o->prune.fisher.block, "With --fisher: columns per Fisher block")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  CLI::Option* fisher_damp =
      app.add_option("--fisher-damp", o->prune.fisher.damp, "With --fisher: Fisher dampening (lambda)")
          ->capture_default_str()
          ->check(CLI::PositiveNumber);
  app.add_option("--schedule", o->prune.schedule_steps,
                 "Gradual structure-decay schedule in this many steps (1: one shot); the steps are printed")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  return [=] {
    o->prune.spec = parse_format_spec(o->format);
    o->prune.method = parse_prune_method(o->method);
    // An option the chosen method does not read is refused: a user who set it expects it to act.
    const bool obs = o->prune.method == PruneMethod::obs, fisher = !o->fisher.empty();
    const bool calibrates = o->prune.method != PruneMethod::magnitude && !fisher;
    const auto refuse_unused = [](const CLI::Option* option, bool read, const char* when) {
      require(option->count() == 0 || read, ErrorCode::invalid_argument,
              [&] { return option->get_name() + " applies " + when + " only"; });
    };
    refuse_unused(damp, obs, "with --method obs");
    refuse_unused(candidates, obs, "with --method obs");
    refuse_unused(fisher_block, fisher, "with --fisher");
    refuse_unused(fisher_damp, fisher, "with --fisher");
    for (const CLI::Option* option : {model_dir, corpus, sentences})
      refuse_unused(option, calibrates, "where the method calibrates (--method wanda or obs, without --fisher)");
    o->prune.obs.candidates = parse_obs_candidates(o->candidates);
    if (is_quant_type_name(o->dtype))
      o->prune.quantize = parse_quant_type(o->dtype);
    else if (!o->dtype.empty())
      o->prune.value_dtype = parse_value_dtype(o->dtype);
    if (o->prune.schedule_steps > 1) {
      fmt::print("schedule:");
      for (const ScheduleStep& step : structure_decay_schedule(o->prune.spec, o->prune.schedule_steps))
        fmt::print(" {}", to_string(step));
      fmt::print("\n");
    }
    // Every check that can fail runs before calibration, which takes seconds to minutes.
    std::vector<std::string> inputs{o->input};
    if (!o->fisher.empty()) inputs.push_back(o->fisher);
    resolve_output_path(o->output, inputs);
    ModelFile model = load_model(o->input);
    select_weights(model, o->prune);
    const auto finish = [&](const ModelPruneReport& report) {
      if (!report.skipped.empty()) {
        fmt::print(
            stderr,
            "nmkit: warning: {} selected tensor(s) kept dense: the calibration forward never runs them, so {} has "
            "no statistics:",
            report.skipped.size(), prune_method_name(o->prune.method));
        for (const std::string& name : report.skipped) fmt::print(stderr, " {}", name);
        fmt::print(stderr, "\n");
      }
      if (report.pruned_count == 0 && report.skipped.empty())
        fmt::print(stderr, "nmkit: warning: no 2-D floating-point weight matched --include '{}' / --exclude '{}'\n",
                   o->prune.include, o->prune.exclude);
      save_model(o->output, model);
      print_prune_report(report, o->all);
      fmt::print("wrote {}\n", o->output);
      return 0;
    };
    std::map<std::string, LayerStatistics> stats;
    SafetensorsFile gradients;
    if (!o->fisher.empty()) {
      require(o->prune.method == PruneMethod::obs, ErrorCode::invalid_argument, "--fisher needs --method obs");
      require(!o->sequential, ErrorCode::invalid_argument,
              "--sequential calibrates on the model's forward; --fisher takes gradients instead");
      gradients = read_safetensors(o->fisher);
      o->prune.fisher_gradients = &gradients;
      o->prune.fisher.candidates = o->prune.obs.candidates;
    } else if (o->prune.method != PruneMethod::magnitude) {
      const std::string dir = o->model_dir.empty() ? calibration_model_dir(o->input) : o->model_dir;
      const CorpusSplit split = split_corpus(load_sentences(o->corpus), 4, o->calibration_sentences);
      fmt::print(stderr, "calibrating on {} sentences with the model in {}{}\n", split.calibration.size(), dir,
                 o->sequential ? ", layer by layer" : "");
      if (o->sequential) {
        const auto collect = [&](const ModelFile& current) {
          return collect_statistics(BertEncoder::load(dir, current, o->input), split.calibration);
        };
        const auto stages = encoder_layer_stages(BertEncoder::load(dir, model, o->input).linear_names());
        const ModelPruneReport report = prune_model_in_stages(
            model, o->prune, stages, collect, [](std::size_t i, std::size_t n, const std::string& what) {
              if (what != "done") fmt::print(stderr, "layer stage {}/{}: {}\n", i + 1, n, what);
            });
        return finish(report);
      }
      stats = collect_statistics(BertEncoder::load(dir, model, o->input), split.calibration);
      o->prune.statistics = &stats;
    } else {
      require(!o->sequential, ErrorCode::invalid_argument, "--sequential needs --method wanda or obs");
    }
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    return finish(prune_model(model, o->prune, tty ? PruneProgress(draw_progress) : PruneProgress{}));
  };
}

}  // namespace nmkit::cli
