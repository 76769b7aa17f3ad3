#pragma once
// How far a pruned model's sentence embeddings are from the dense model's on held-out sentences.
#include <cstddef>
#include <vector>

namespace nmkit {

struct EmbeddingComparison {
  std::size_t sentences = 0;
  double mean_cosine = 0.0;  // between each sentence's dense and pruned embedding
  double min_cosine = 0.0;
  // How often a sentence's nearest neighbour (by cosine, among the others) under the dense model is still its
  // nearest neighbour under the pruned model.
  double neighbour_agreement = 0.0;
};

EmbeddingComparison compare_embeddings(const std::vector<std::vector<float>>& dense,
                                       const std::vector<std::vector<float>>& pruned);

}  // namespace nmkit
