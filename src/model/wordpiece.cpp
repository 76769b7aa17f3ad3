#include "nmkit/model/wordpiece.hpp"

#include <fstream>

#include "nmkit/error.hpp"

namespace nmkit {
namespace {

constexpr std::size_t kMaxCharsPerWord = 100;  // longer words become [UNK], as in BERT

// UTF-8 -> code points; invalid bytes become U+FFFD.
std::vector<char32_t> decode_utf8(std::string_view s) {
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) {
      out.push_back(0xFFFD), ++i;
      continue;
    }
    char32_t cp = len == 1 ? c : c & (0x7F >> len);
    bool ok = true;
    for (int k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      ok = ok && (cc >> 6) == 2;
      cp = (cp << 6) | (cc & 0x3F);
    }
    out.push_back(ok ? cp : 0xFFFD);
    i += ok ? len : 1;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6)), out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12)), out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18)), out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_whitespace(char32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  return c < 0x20 || (c >= 0x7F && c < 0xA0) || c == 0xFFFD || c == 0 || (c >= 0x200B && c <= 0x200F);
}

bool is_punctuation(char32_t c) {
  if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) return true;
  return c == 0xA1 || c == 0xA7 || c == 0xAB || c == 0xB6 || c == 0xB7 || c == 0xBB || c == 0xBF ||
         (c >= 0x2010 && c <= 0x2027) || (c >= 0x2030 && c <= 0x205E) || (c >= 0x3001 && c <= 0x3003) ||
         (c >= 0x3008 && c <= 0x3011);
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

#include "latin_fold.inc"

// Lower case and strip the accent of Latin letters (what lower() + NFD + dropping combining marks gives);
// 0 for a combining mark, which is dropped.
char32_t fold_latin(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c >= 0x300 && c <= 0x36F) return 0;
  if (c >= kLatinFoldFirst && c <= kLatinFoldLast) return kLatinFold[c - kLatinFoldFirst];
  return c;
}

}  // namespace

WordPieceTokenizer WordPieceTokenizer::from_vocab_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(ErrorCode::io_error, path + ": cannot open the vocabulary");
  std::vector<std::string> vocab;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.push_back(line);
  }
  return WordPieceTokenizer(std::move(vocab));
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab) : vocab_(std::move(vocab)) {
  for (std::size_t i = 0; i < vocab_.size(); ++i) ids_.emplace(vocab_[i], static_cast<int32_t>(i));
  auto special = [&](const char* name) {
    const auto it = ids_.find(name);
    require(it != ids_.end(), ErrorCode::invalid_argument, std::string("vocabulary lacks the token ") + name);
    return it->second;
  };
  unk_ = special("[UNK]"), cls_ = special("[CLS]"), sep_ = special("[SEP]");
}

int32_t WordPieceTokenizer::id_of(const std::string& token) const {
  const auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<std::string> WordPieceTokenizer::basic_tokens(std::string_view text) const {
  std::vector<std::string> tokens;
  std::string current;
  auto flush = [&] {
    if (!current.empty()) tokens.push_back(std::move(current)), current.clear();
  };
  for (char32_t c : decode_utf8(text)) {
    if (is_control(c)) continue;
    if (is_whitespace(c)) {
      flush();
      continue;
    }
    const char32_t folded = fold_latin(c);
    if (folded == 0) continue;  // a combining accent
    if (is_punctuation(folded) || is_cjk(folded)) {
      flush();
      std::string single;
      append_utf8(single, folded);
      tokens.push_back(std::move(single));
      continue;
    }
    append_utf8(current, folded);
  }
  flush();
  return tokens;
}

std::vector<int32_t> WordPieceTokenizer::encode(std::string_view text, std::size_t max_length) const {
  require(max_length >= 2, ErrorCode::invalid_argument, "encode: max_length must leave room for [CLS] and [SEP]");
  std::vector<int32_t> ids{cls_};
  for (const std::string& word : basic_tokens(text)) {
    if (decode_utf8(word).size() > kMaxCharsPerWord) {
      ids.push_back(unk_);
      continue;
    }
    std::vector<int32_t> pieces;
    std::size_t start = 0;
    bool unknown = false;
    while (start < word.size()) {
      std::size_t end = word.size();
      int32_t found = -1;
      while (end > start) {
        // Only cut at UTF-8 character boundaries.
        if (end < word.size() && (static_cast<unsigned char>(word[end]) >> 6) == 2) {
          --end;
          continue;
        }
        const std::string piece = (start > 0 ? "##" : "") + word.substr(start, end - start);
        if ((found = id_of(piece)) >= 0) break;
        --end;
      }
      if (found < 0) {
        unknown = true;
        break;
      }
      pieces.push_back(found);
      start = end;
    }
    if (unknown)
      ids.push_back(unk_);
    else
      ids.insert(ids.end(), pieces.begin(), pieces.end());
  }
  if (ids.size() > max_length - 1) ids.resize(max_length - 1);
  ids.push_back(sep_);
  return ids;
}

}  // namespace nmkit
