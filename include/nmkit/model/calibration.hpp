#pragma once
// Calibration data for the activation-aware pruners: sentences from text files available offline, split
// into a calibration set and a held-out evaluation set, and per linear layer the statistics of its inputs.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nmkit/model/bert.hpp"

namespace nmkit {

// Sentences of the given files (or of every regular file in the given directories, sorted by name):
// split at ". ", "? ", "! " and blank lines, whitespace collapsed, 20..400 bytes, duplicates dropped.
std::vector<std::string> load_sentences(const std::vector<std::string>& paths);

// Every `eval_every`-th sentence is held out for evaluation; the rest calibrate (deterministic).
struct CorpusSplit {
  std::vector<std::string> calibration;
  std::vector<std::string> evaluation;
};
CorpusSplit split_corpus(const std::vector<std::string>& sentences, int eval_every = 4,
                         std::size_t max_calibration = 256, std::size_t max_evaluation = 128);

// The texts every Debian/Ubuntu machine has: /usr/share/common-licenses.
std::vector<std::string> default_corpus_paths();

// Input statistics of one linear layer: H = X^T X over all calibration tokens (in x in, row-major, fp64).
struct LayerStatistics {
  int64_t in_features = 0;
  int64_t tokens = 0;
  std::vector<double> xtx;
  std::vector<double> column_norms() const;  // ||X_j||_2 = sqrt(H_jj)
};

// Runs the model over the sentences and accumulates each linear layer's statistics.
std::map<std::string, LayerStatistics> collect_statistics(const BertEncoder& model,
                                                          const std::vector<std::string>& sentences);

}  // namespace nmkit
