#include "nmkit/model/bert.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nmkit/attention/dfss.hpp"
#include "nmkit/error.hpp"

namespace nmkit {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::io_error, path.string() + ": cannot open");
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(ErrorCode::io_error, path.string() + ": not a JSON object");
  return j;
}

int get_positive(const json& j, const char* key, const std::string& origin) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (1 << 20))
    throw Error(ErrorCode::io_error, origin + ": '" + key + "' must be a positive integer");
  return it->get<int>();
}

std::string layer_prefix(int i) { return "encoder.layer." + std::to_string(i) + "."; }

// One head's rows (T x dh) gathered out of the interleaved T x H activations, for the DFSS ops' contiguous operands.
std::vector<float> head_of(const std::vector<float>& x, int64_t tokens, int64_t hidden, int64_t head, int64_t dh) {
  std::vector<float> out(static_cast<std::size_t>(tokens * dh));
  for (int64_t t = 0; t < tokens; ++t) std::copy_n(x.begin() + t * hidden + head * dh, dh, out.begin() + t * dh);
  return out;
}

}  // namespace

AttentionOptions parse_attention(std::string_view text) {
  if (text == "dense") return {};
  const std::string s(text);
  const auto colon = s.find(':');
  AttentionOptions o;
  bool parsed = colon != std::string::npos;
  try {
    std::size_t used_n = 0, used_m = 0;
    if (parsed) {
      o.n = std::stoi(s.substr(0, colon), &used_n);
      o.m = std::stoi(s.substr(colon + 1), &used_m);
      parsed = used_n == colon && used_m == s.size() - colon - 1;
    }
  } catch (const std::exception&) {  // std::stoi: no digits, or out of range
    parsed = false;
  }
  require(parsed, ErrorCode::invalid_argument, "attention '" + s + "': expected dense or N:M (for example 2:4)");
  check_nm_pattern(o.n, o.m);
  return o;
}

BertConfig BertConfig::from_model_dir(const std::string& dir) {
  const fs::path path = fs::path(dir) / "config.json";
  const json j = read_json(path);
  const std::string origin = path.string();
  if (j.value("model_type", std::string("bert")) != "bert" || j.value("hidden_act", std::string("gelu")) != "gelu")
    throw Error(ErrorCode::unsupported, origin + ": only BERT encoders with exact GELU are supported");
  BertConfig c;
  c.hidden = get_positive(j, "hidden_size", origin);
  c.layers = get_positive(j, "num_hidden_layers", origin);
  c.heads = get_positive(j, "num_attention_heads", origin);
  c.intermediate = get_positive(j, "intermediate_size", origin);
  c.max_positions = get_positive(j, "max_position_embeddings", origin);
  c.type_vocab = get_positive(j, "type_vocab_size", origin);
  c.vocab = get_positive(j, "vocab_size", origin);
  c.layer_norm_eps = j.value("layer_norm_eps", 1e-12f);
  if (c.hidden % c.heads != 0)
    throw Error(ErrorCode::io_error, origin + ": hidden_size is not a multiple of the heads");
  c.max_seq_length = std::min(c.max_positions, 512);
  const fs::path st = fs::path(dir) / "sentence_bert_config.json";
  if (fs::exists(st))
    c.max_seq_length = std::min(c.max_positions, get_positive(read_json(st), "max_seq_length", st.string()));
  return c;
}

BertEncoder BertEncoder::load(const std::string& dir, const std::string& weights) {
  const std::string file = weights.empty() ? (fs::path(dir) / "model.safetensors").string() : weights;
  return load(dir, load_model(file), file);
}

BertEncoder BertEncoder::load(const std::string& dir, const ModelFile& model, const std::string& file) {
  BertEncoder m(BertConfig::from_model_dir(dir),
                WordPieceTokenizer::from_vocab_file((fs::path(dir) / "vocab.txt").string()));
  const BertConfig& c = m.config_;
  require(m.tokenizer_.vocab_size() == static_cast<std::size_t>(c.vocab), ErrorCode::io_error,
          "vocab.txt has " + std::to_string(m.tokenizer_.vocab_size()) + " tokens, config.json says " +
              std::to_string(c.vocab));
  std::map<std::string, const NamedWeight*> by_name;
  for (const auto& w : model.weights) by_name[w.name] = &w;

  auto fetch = [&](const std::string& name, std::vector<int64_t> shape) {
    const auto it = by_name.find(name);
    if (it == by_name.end()) throw Error(ErrorCode::io_error, file + ": tensor '" + name + "' is missing");
    DenseMatrix d;
    if (const auto* t = std::get_if<StTensor>(&it->second->weight)) {
      StTensor as2d = *t;
      if (as2d.shape.size() == 1) as2d.shape = {1, as2d.shape[0]};
      d = to_dense_matrix(as2d);
    } else if (const auto* q = std::get_if<QuantizedNmMatrix>(&it->second->weight)) {
      d = decompress(*q);
      m.quantized_weights_[name] = q->type();
    } else {
      d = decompress(std::get<SparseMatrix>(it->second->weight));
    }
    const std::vector<int64_t> got =
        shape.size() == 1 ? std::vector<int64_t>{d.cols} : std::vector<int64_t>{d.rows, d.cols};
    if (got != shape || (shape.size() == 1 && d.rows != 1))
      throw Error(ErrorCode::io_error, file + ": tensor '" + name + "' has the wrong shape for this config");
    return d.to_float();
  };
  auto fetch_norm = [&](const std::string& prefix) {
    return Norm{fetch(prefix + "weight", {c.hidden}), fetch(prefix + "bias", {c.hidden})};
  };
  auto add_linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    m.linears_[prefix + "weight"] = Linear{out, in, fetch(prefix + "weight", {out, in}), fetch(prefix + "bias", {out})};
    m.linear_order_.push_back(prefix + "weight");
  };

  m.word_embeddings_ = fetch("embeddings.word_embeddings.weight", {c.vocab, c.hidden});
  m.position_embeddings_ = fetch("embeddings.position_embeddings.weight", {c.max_positions, c.hidden});
  m.type_embeddings_ = fetch("embeddings.token_type_embeddings.weight", {c.type_vocab, c.hidden});
  m.embedding_norm_ = fetch_norm("embeddings.LayerNorm.");
  for (int i = 0; i < c.layers; ++i) {
    const std::string p = layer_prefix(i);
    for (const char* proj : {"query", "key", "value"})
      add_linear(p + "attention.self." + proj + ".", c.hidden, c.hidden);
    add_linear(p + "attention.output.dense.", c.hidden, c.hidden);
    m.norms_[p + "attention.output.LayerNorm."] = fetch_norm(p + "attention.output.LayerNorm.");
    add_linear(p + "intermediate.dense.", c.intermediate, c.hidden);
    add_linear(p + "output.dense.", c.hidden, c.intermediate);
    m.norms_[p + "output.LayerNorm."] = fetch_norm(p + "output.LayerNorm.");
  }
  return m;
}

void BertEncoder::linear(const std::string& name, const std::vector<float>& x, int64_t tokens, std::vector<float>& y,
                         const LinearInputObserver* observer) const {
  const Linear& l = linears_.at(name);
  if (observer && *observer) (*observer)(name, x.data(), tokens, l.in);
  std::vector<float> quantized;
  const float* input = x.data();
  if (const auto it = input_types_.find(name); it != input_types_.end()) {
    quantized = dequantize(quantize_rows(x, tokens, l.in, it->second, RowScaling::per_row, name + " input"));
    input = quantized.data();
  }
  y.resize(static_cast<std::size_t>(tokens * l.out));
  for (int64_t t = 0; t < tokens; ++t) std::copy(l.bias.begin(), l.bias.end(), y.begin() + t * l.out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens), static_cast<int>(l.out),
              static_cast<int>(l.in), 1.0f, input, static_cast<int>(l.in), l.weight.data(), static_cast<int>(l.in),
              1.0f, y.data(), static_cast<int>(l.out));
}

void BertEncoder::layer_norm(const Norm& n, std::vector<float>& x, int64_t tokens) const {
  const int64_t h = config_.hidden;
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = x.data() + t * h;
    double mean = 0.0, var = 0.0;
    for (int64_t i = 0; i < h; ++i) mean += row[i];
    mean /= h;
    for (int64_t i = 0; i < h; ++i) var += (row[i] - mean) * (row[i] - mean);
    var /= h;
    const double inv = 1.0 / std::sqrt(var + config_.layer_norm_eps);
    for (int64_t i = 0; i < h; ++i) row[i] = static_cast<float>((row[i] - mean) * inv) * n.gamma[i] + n.beta[i];
  }
}

std::vector<float> BertEncoder::embed(std::string_view sentence, const LinearInputObserver* observer,
                                      const AttentionOptions& attention) const {
  if (!attention.dense()) check_nm_pattern(attention.n, attention.m);
  const BertConfig& c = config_;
  const std::vector<int32_t> ids = tokenizer_.encode(sentence, static_cast<std::size_t>(c.max_seq_length));
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden, heads = c.heads, dh = H / heads;
  std::vector<float> x(static_cast<std::size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i)
      x[t * H + i] = word_embeddings_[ids[t] * H + i] + position_embeddings_[t * H + i] + type_embeddings_[i];
  layer_norm(embedding_norm_, x, T);

  std::vector<float> q, k, v, ctx(static_cast<std::size_t>(T * H)), attn, inter, out,
      scores(static_cast<std::size_t>(T));
  const float scale = 1.0f / std::sqrt(static_cast<float>(dh));
  for (int layer = 0; layer < c.layers; ++layer) {
    const std::string p = layer_prefix(layer);
    linear(p + "attention.self.query.weight", x, T, q, observer);
    linear(p + "attention.self.key.weight", x, T, k, observer);
    linear(p + "attention.self.value.weight", x, T, v, observer);
    if (!attention.dense()) {
      DfssOptions options;
      options.n = attention.n, options.m = attention.m, options.scale = scale;
      for (int64_t h = 0; h < heads; ++h) {
        const std::vector<float> qh = head_of(q, T, H, h, dh), kh = head_of(k, T, H, h, dh),
                                 vh = head_of(v, T, H, h, dh);
        const std::vector<float> oh =
            dfss_attention({qh.data(), T, dh}, {kh.data(), T, dh}, {vh.data(), T, dh}, options);
        for (int64_t t = 0; t < T; ++t) std::copy_n(oh.begin() + t * dh, dh, ctx.begin() + t * H + h * dh);
      }
    }
    for (int64_t h = 0; h < heads && attention.dense(); ++h)
      for (int64_t i = 0; i < T; ++i) {
        float max_score = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          float s = 0.0f;
          for (int64_t d = 0; d < dh; ++d) s += q[i * H + h * dh + d] * k[j * H + h * dh + d];
          scores[j] = s * scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < T; ++j) sum += (scores[j] = std::exp(scores[j] - max_score));
        for (int64_t d = 0; d < dh; ++d) {
          double acc = 0.0;
          for (int64_t j = 0; j < T; ++j) acc += scores[j] * v[j * H + h * dh + d];
          ctx[i * H + h * dh + d] = static_cast<float>(acc / sum);
        }
      }
    linear(p + "attention.output.dense.weight", ctx, T, attn, observer);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += attn[i];
    layer_norm(norms_.at(p + "attention.output.LayerNorm."), x, T);
    linear(p + "intermediate.dense.weight", x, T, inter, observer);
    for (float& e : inter) e = apply_activation(Activation::gelu, e);
    linear(p + "output.dense.weight", inter, T, out, observer);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += out[i];
    layer_norm(norms_.at(p + "output.LayerNorm."), x, T);
  }
  // Mean pooling over the tokens, then unit length.
  std::vector<float> e(static_cast<std::size_t>(H), 0.0f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) e[i] += x[t * H + i] / static_cast<float>(T);
  double norm = 0.0;
  for (float f : e) norm += double{f} * f;
  norm = std::sqrt(norm);
  for (float& f : e) f = static_cast<float>(f / std::max(norm, 1e-12));
  return e;
}

std::vector<std::vector<float>> BertEncoder::embed_all(const std::vector<std::string>& sentences,
                                                       const AttentionOptions& attention) const {
  std::vector<std::vector<float>> out;
  out.reserve(sentences.size());
  for (const auto& s : sentences) out.push_back(embed(s, nullptr, attention));
  return out;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  require(a.size() == b.size(), ErrorCode::invalid_argument, "cosine: vectors differ in length");
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    ab += double{a[i]} * b[i], aa += double{a[i]} * a[i], bb += double{b[i]} * b[i];
  return aa > 0 && bb > 0 ? ab / std::sqrt(aa * bb) : 0.0;
}

}  // namespace nmkit
