#pragma once
// A CPU forward of the BERT encoder family, enough for sentence-transformers models such as
// all-MiniLM-L6-v2: WordPiece tokens -> embeddings -> N x (self-attention, GELU FFN, post-LayerNorm) ->
// mean pooling -> L2 normalisation. fp32, OpenBLAS for the products. Linear layers may be stored dense or
// compressed (a file written by `nmkit prune`): compressed weights are decompressed (8-bit ones dequantized) at load.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "nmkit/io/model.hpp"
#include "nmkit/model/wordpiece.hpp"

namespace nmkit {

struct BertConfig {
  int hidden = 384;
  int layers = 6;
  int heads = 12;
  int intermediate = 1536;
  int max_positions = 512;
  int type_vocab = 2;
  int vocab = 30522;
  float layer_norm_eps = 1e-12f;
  int max_seq_length = 256;  // sentence-transformers' truncation (sentence_bert_config.json)

  // Reads config.json (and sentence_bert_config.json beside it when present).
  static BertConfig from_model_dir(const std::string& dir);
};

// Self-attention of every layer: dense softmax (n == 0, the default) or DFSS, each row of scores pruned to N:M
// over the keys before the softmax (nmkit/attention/dfss.hpp).
struct AttentionOptions {
  int n = 0;
  int m = 0;
  bool dense() const noexcept { return n == 0; }
};
// "dense", or "N:M" for DFSS (for example "2:4", "1:2"); throws Error otherwise.
AttentionOptions parse_attention(std::string_view text);

// Called with the input of every linear layer: x is tokens x in_features, row-major.
using LinearInputObserver =
    std::function<void(const std::string& weight_name, const float* x, int64_t tokens, int64_t in_features)>;

class BertEncoder {
 public:
  // `dir` holds config.json, vocab.txt and model.safetensors; `weights` overrides the weights file (for
  // example a pruned copy). Every tensor is checked against the config; errors name the tensor.
  static BertEncoder load(const std::string& dir, const std::string& weights = "");
  // The same with the weights already in memory (for example pruned by prune_model).
  static BertEncoder load(const std::string& dir, const ModelFile& weights, const std::string& origin = "weights");

  // The sentence embedding (hidden floats, unit length).
  std::vector<float> embed(std::string_view sentence, const LinearInputObserver* observer = nullptr,
                           const AttentionOptions& attention = {}) const;
  std::vector<std::vector<float>> embed_all(const std::vector<std::string>& sentences,
                                            const AttentionOptions& attention = {}) const;

  // Quantizes the input of each named linear layer per token (quantize_rows, then back to fp32) to its 8-bit type
  // before the product, as an 8-bit kernel with per-token activation scales computes it; other layers keep fp32
  // inputs. Replaces any earlier choice (an empty map: none).
  void quantize_linear_inputs(std::map<std::string, QuantType> types) { input_types_ = std::move(types); }
  // The linear weights stored with 8-bit values (loaded dequantized), by name, with their type.
  const std::map<std::string, QuantType>& quantized_weights() const noexcept { return quantized_weights_; }

  const BertConfig& config() const noexcept { return config_; }
  const WordPieceTokenizer& tokenizer() const noexcept { return tokenizer_; }
  // The names of the linear weights in forward order (query, key, value, output, intermediate, output).
  const std::vector<std::string>& linear_names() const noexcept { return linear_order_; }

 private:
  struct Linear {
    int64_t out = 0, in = 0;
    std::vector<float> weight;  // out x in, row-major
    std::vector<float> bias;    // out
  };
  struct Norm {
    std::vector<float> gamma, beta;
  };
  // y (tokens x out) = x (tokens x in) W^T + b
  void linear(const std::string& name, const std::vector<float>& x, int64_t tokens, std::vector<float>& y,
              const LinearInputObserver* observer) const;
  void layer_norm(const Norm& n, std::vector<float>& x, int64_t tokens) const;

  BertConfig config_;
  WordPieceTokenizer tokenizer_;
  std::vector<float> word_embeddings_, position_embeddings_, type_embeddings_;
  Norm embedding_norm_;
  std::map<std::string, Linear> linears_;
  std::map<std::string, Norm> norms_;
  std::vector<std::string> linear_order_;
  std::map<std::string, QuantType> quantized_weights_, input_types_;
  BertEncoder(BertConfig c, WordPieceTokenizer t) : config_(c), tokenizer_(std::move(t)) {}
};

double cosine(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace nmkit
