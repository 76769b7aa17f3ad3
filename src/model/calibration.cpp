#include "nmkit/model/calibration.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "nmkit/error.hpp"

namespace nmkit {
namespace {

namespace fs = std::filesystem;

constexpr std::size_t kMinSentenceBytes = 20;
constexpr std::size_t kMaxSentenceBytes = 400;

void add_sentences_of(const std::string& text, std::vector<std::string>& out, std::set<std::string>& seen) {
  std::string current;
  auto flush = [&] {
    // Collapse whitespace.
    std::string s;
    bool space = false;
    for (char c : current) {
      if (std::isspace(static_cast<unsigned char>(c)))
        space = !s.empty();
      else {
        if (space) s += ' ';
        s += c, space = false;
      }
    }
    if (s.size() >= kMinSentenceBytes && s.size() <= kMaxSentenceBytes && seen.insert(s).second) out.push_back(s);
    current.clear();
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    current += c;
    const bool end_mark = (c == '.' || c == '?' || c == '!') &&
                          (i + 1 == text.size() || std::isspace(static_cast<unsigned char>(text[i + 1])));
    const bool blank_line = c == '\n' && i + 1 < text.size() && text[i + 1] == '\n';
    if (end_mark || blank_line) flush();
  }
  flush();
}

}  // namespace

std::vector<std::string> default_corpus_paths() { return {"/usr/share/common-licenses"}; }

std::vector<std::string> load_sentences(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    require(fs::exists(p), ErrorCode::io_error, p + ": no such file or directory");
    if (fs::is_directory(p)) {
      std::vector<std::string> in_dir;
      for (const auto& e : fs::directory_iterator(p))
        if (fs::is_regular_file(e.path())) in_dir.push_back(e.path().string());
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(p);
    }
  }
  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error(ErrorCode::io_error, f + ": cannot open");
    std::stringstream buffer;
    buffer << in.rdbuf();
    add_sentences_of(buffer.str(), out, seen);
  }
  return out;
}

CorpusSplit split_corpus(const std::vector<std::string>& sentences, int eval_every, std::size_t max_calibration,
                         std::size_t max_evaluation) {
  require(eval_every >= 2, ErrorCode::invalid_argument, "split_corpus: eval_every must be at least 2");
  CorpusSplit split;
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    auto& target = (i % eval_every == static_cast<std::size_t>(eval_every - 1)) ? split.evaluation : split.calibration;
    const std::size_t limit = &target == &split.evaluation ? max_evaluation : max_calibration;
    if (target.size() < limit) target.push_back(sentences[i]);
  }
  return split;
}

std::vector<double> LayerStatistics::column_norms() const {
  std::vector<double> n(static_cast<std::size_t>(in_features));
  for (int64_t j = 0; j < in_features; ++j) n[j] = std::sqrt(std::max(0.0, xtx[j * in_features + j]));
  return n;
}

std::map<std::string, LayerStatistics> collect_statistics(const BertEncoder& model,
                                                          const std::vector<std::string>& sentences) {
  std::map<std::string, LayerStatistics> stats;
  std::map<std::string, std::vector<float>> partial;  // fp32 X^T X of the current sentence
  const LinearInputObserver observer = [&](const std::string& name, const float* x, int64_t tokens, int64_t in) {
    LayerStatistics& s = stats[name];
    if (s.xtx.empty()) s.in_features = in, s.xtx.assign(static_cast<std::size_t>(in * in), 0.0);
    std::vector<float>& h = partial[name];
    h.assign(static_cast<std::size_t>(in * in), 0.0f);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(in), static_cast<int>(tokens), 1.0f, x,
                static_cast<int>(in), 0.0f, h.data(), static_cast<int>(in));
    for (int64_t i = 0; i < in; ++i)
      for (int64_t j = i; j < in; ++j) s.xtx[i * in + j] += h[i * in + j];
    s.tokens += tokens;
  };
  for (const auto& sentence : sentences) model.embed(sentence, &observer);
  for (auto& [name, s] : stats)  // mirror the upper triangle
    for (int64_t i = 0; i < s.in_features; ++i)
      for (int64_t j = 0; j < i; ++j) s.xtx[i * s.in_features + j] = s.xtx[j * s.in_features + i];
  return stats;
}

}  // namespace nmkit
