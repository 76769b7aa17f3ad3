#pragma once
// BERT's uncased WordPiece tokenizer: basic tokenization (lower case, accents stripped, punctuation and CJK
// characters split off, control characters dropped) then greedy longest-match word pieces from a vocabulary.
// Unicode coverage: ASCII, Latin-1 and Latin Extended-A letters (case and accents), general punctuation and
// CJK ideographs; other scripts pass through as whole words (docs/models.md).
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace nmkit {

class WordPieceTokenizer {
 public:
  // Reads vocab.txt (one token per line, id = line number). Throws Error(io_error) naming the file.
  static WordPieceTokenizer from_vocab_file(const std::string& path);
  explicit WordPieceTokenizer(std::vector<std::string> vocab);

  // [CLS] pieces... [SEP], truncated to max_length ids (the [SEP] kept).
  std::vector<int32_t> encode(std::string_view text, std::size_t max_length) const;
  // The basic tokens (before word pieces), for tests.
  std::vector<std::string> basic_tokens(std::string_view text) const;

  std::size_t vocab_size() const noexcept { return vocab_.size(); }
  const std::string& token(int32_t id) const { return vocab_.at(static_cast<std::size_t>(id)); }

 private:
  int32_t id_of(const std::string& token) const;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int32_t> ids_;
  int32_t unk_ = 0, cls_ = 0, sep_ = 0;
};

}  // namespace nmkit
