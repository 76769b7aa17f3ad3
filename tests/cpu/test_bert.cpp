// The C++ BERT forward against sentence-transformers' own token ids and embeddings (the fixture was made
// by tools/fixtures/make_minilm_reference.py from the same model).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nmkit/error.hpp"
#include "nmkit/model/bert.hpp"
#include "nmkit/model/calibration.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

const std::string kModelDir = std::filesystem::path(NMKIT_TEST_MODEL).parent_path().string();

nlohmann::json reference() {
  std::ifstream in(std::string(NMKIT_TEST_DATA) + "/minilm_reference.json");
  return nlohmann::json::parse(in);
}

TEST(WordPiece, MatchesTheReferenceTokenizer) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_vocab_file(kModelDir + "/vocab.txt");
  for (const auto& s : reference()["sentences"]) {
    const std::vector<int32_t> want = s["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(s["text"].get<std::string>(), 256), want) << s["text"];
  }
}

TEST(WordPiece, SplitsPunctuationFoldsCaseAndAccents) {
  const WordPieceTokenizer tok = WordPieceTokenizer::from_vocab_file(kModelDir + "/vocab.txt");
  EXPECT_EQ(tok.basic_tokens("Héllo, WÖRLD!"), (std::vector<std::string>{"hello", ",", "world", "!"}));
  const auto ids = tok.encode("a b c d e f", 4);  // truncated: [CLS] a b [SEP]
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(tok.token(ids.back()), "[SEP]");
  EXPECT_EQ(tok.token(tok.encode(std::string(150, 'x'), 8)[1]), "[UNK]");
  EXPECT_NMKIT_ERROR(WordPieceTokenizer::from_vocab_file("/nonexistent/vocab.txt"), ErrorCode::io_error, "vocab");
}

TEST(Bert, EmbeddingsMatchSentenceTransformers) {
  const BertEncoder model = BertEncoder::load(kModelDir);
  EXPECT_EQ(model.config().hidden, 384);
  EXPECT_EQ(model.linear_names().size(), 36u);
  for (const auto& s : reference()["sentences"]) {
    const std::vector<float> want = s["embedding"].get<std::vector<float>>();
    const std::vector<float> got = model.embed(s["text"].get<std::string>());
    EXPECT_GE(cosine(got, want), 0.9999) << s["text"];
  }
}

TEST(Bert, ObserverSeesEveryLinearInput) {
  const BertEncoder model = BertEncoder::load(kModelDir);
  std::map<std::string, int64_t> seen;
  const LinearInputObserver observer = [&](const std::string& name, const float*, int64_t tokens, int64_t in) {
    seen[name] += tokens;
    EXPECT_TRUE(in == 384 || in == 1536) << name;
  };
  const std::string text = "Three tokens here.";
  model.embed(text, &observer);
  EXPECT_EQ(seen.size(), 36u);
  const auto tokens_expected = static_cast<int64_t>(model.tokenizer().encode(text, 256).size());
  for (const auto& [name, tokens] : seen) EXPECT_EQ(tokens, tokens_expected) << name;
}

TEST(Bert, RejectsWeightsThatDoNotFitTheConfig) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "nmkit_bert_bad";
  std::filesystem::create_directories(dir);
  for (const char* f : {"config.json", "vocab.txt"})
    std::filesystem::copy_file(kModelDir + "/" + f, dir / f, std::filesystem::copy_options::overwrite_existing);
  ModelFile m = load_model(kModelDir + "/model.safetensors");
  for (auto& w : m.weights)
    if (w.name == "encoder.layer.2.intermediate.dense.weight") std::get<StTensor>(w.weight).shape = {384, 1536};
  save_model((dir / "model.safetensors").string(), m);
  EXPECT_NMKIT_ERROR(BertEncoder::load(dir.string()), ErrorCode::io_error, "encoder.layer.2.intermediate.dense.weight");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace nmkit

namespace nmkit {
namespace {

TEST(Calibration, CorpusSplitsAndRejectsMissingFiles) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "nmkit_corpus";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "a.txt")
      << "First sentence is long enough to count. Short one. Third sentence is also long enough!\n\n"
         "A paragraph without a full stop that still ends here\n\nFirst sentence is long enough to count.";
  const std::vector<std::string> s = load_sentences({dir.string()});
  EXPECT_EQ(s, (std::vector<std::string>{
                   "First sentence is long enough to count.", "Third sentence is also long enough!",
                   "A paragraph without a full stop that still ends here"}));  // deduplicated, short dropped
  const CorpusSplit split = split_corpus({"a", "b", "c", "d", "e", "f", "g", "h"}, 4);
  EXPECT_EQ(split.evaluation, (std::vector<std::string>{"d", "h"}));
  EXPECT_EQ(split.calibration.size(), 6u);
  EXPECT_NMKIT_ERROR(load_sentences({"/nonexistent/corpus"}), ErrorCode::io_error, "no such file");
  EXPECT_NMKIT_ERROR(split_corpus(s, 1), ErrorCode::invalid_argument, "eval_every");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace nmkit
