#include "nmkit/model/evaluate.hpp"

#include <algorithm>

#include "nmkit/error.hpp"
#include "nmkit/model/bert.hpp"

namespace nmkit {
namespace {

std::vector<std::size_t> nearest_neighbours(const std::vector<std::vector<float>>& e) {
  std::vector<std::size_t> nn(e.size(), 0);
  for (std::size_t i = 0; i < e.size(); ++i) {
    double best = -2.0;
    for (std::size_t j = 0; j < e.size(); ++j) {
      if (j == i) continue;
      const double c = cosine(e[i], e[j]);
      if (c > best) best = c, nn[i] = j;
    }
  }
  return nn;
}

}  // namespace

EmbeddingComparison compare_embeddings(const std::vector<std::vector<float>>& dense,
                                       const std::vector<std::vector<float>>& pruned) {
  require(dense.size() == pruned.size() && dense.size() >= 2, ErrorCode::invalid_argument,
          "compare_embeddings needs the same sentences (at least two) embedded by both models");
  EmbeddingComparison out;
  out.sentences = dense.size();
  out.min_cosine = 1.0;
  for (std::size_t i = 0; i < dense.size(); ++i) {
    const double c = cosine(dense[i], pruned[i]);
    out.mean_cosine += c / static_cast<double>(dense.size());
    out.min_cosine = std::min(out.min_cosine, c);
  }
  const auto a = nearest_neighbours(dense), b = nearest_neighbours(pruned);
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.size(); ++i) same += a[i] == b[i] ? 1 : 0;
  out.neighbour_agreement = static_cast<double>(same) / static_cast<double>(a.size());
  return out;
}

}  // namespace nmkit
