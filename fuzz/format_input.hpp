#pragma once
// The input layout of the `format` harness, shared with make_corpus.cpp, which writes its seeds.
//
// byte 0: what to build, kind % 4: 0 the text parsers, 1 an NmMatrix, 2 a VnmMatrix, 3 a TileMatrix.
// kind 0: bytes 1.. are one string, given to parse_format_spec, parse_dtype and parse_activation.
// kinds 1-3: a 16-byte header, then the arrays' bytes, in order, zero-filled where the input ends early:
//   [1]      dtype % 3 (f32, f16, bf16)
//   [2, 4)   rows   int16 LE      [4, 6)  cols int16 LE
//   [6, 8)   p0     int16 LE: N (nm), V (vnm), tile_rows (tile)
//   [8, 10)  p1     int16 LE: M (nm), N (vnm), tile_cols (tile)
//   [10, 12) p2     int16 LE: unused (nm), M (vnm), unused (tile)
//   [12] [13] [14]  int8: each array's length is the length the shape needs plus this delta
//                   nm: values, indices; vnm: values, m_indices, column_loc; tile: ptr, indices, data
//   [15]     unused
//   arrays:  nm: values (dtype), indices (bytes); vnm: values, m_indices, column_loc (bytes);
//            tile: ptr (int32 LE each), indices (int32 LE each), data (dtype)
// Sizes are clamped (rows and cols to [-2, 96], parameters to [-2, 1100], each array to 2^16 elements) so that
// no input builds anything large.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nmkit/format/bit_packing.hpp"
#include "nmkit/format/nm.hpp"
#include "nmkit/format/tile.hpp"
#include "nmkit/format/vnm.hpp"

namespace nmkit::fuzz {

enum class FormatKind : uint8_t { text = 0, nm = 1, vnm = 2, tile = 3 };

inline constexpr std::size_t kFormatHeaderBytes = 16;
inline constexpr int64_t kMaxSide = 96;
inline constexpr int64_t kMaxParameter = 1100;  // above every format's limit (M <= 256, tile sides <= 1024)
inline constexpr int64_t kMaxArray = int64_t{1} << 16;

struct FormatHeader {
  FormatKind kind = FormatKind::text;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0;
  int p0 = 0, p1 = 0, p2 = 0;
  int delta[3] = {0, 0, 0};
};

// Reads the input as documented above; `pos` is left at the first array byte.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  uint8_t u8(std::size_t at) const { return at < size_ ? data_[at] : 0; }
  int16_t i16(std::size_t at) const { return static_cast<int16_t>(u8(at) | (u8(at + 1) << 8)); }
  // The next `n` bytes (zero past the end of the input).
  void take(void* out, std::size_t n) {
    auto* o = static_cast<uint8_t*>(out);
    for (std::size_t i = 0; i < n; ++i) o[i] = u8(pos_ + i);
    pos_ += n;
  }
  std::size_t pos_ = kFormatHeaderBytes;

 private:
  const uint8_t* data_;
  std::size_t size_;
};

inline FormatHeader read_format_header(const ByteReader& in) {
  const auto clamp = [](int64_t v, int64_t hi) { return std::clamp<int64_t>(v, -2, hi); };
  FormatHeader h;
  h.kind = static_cast<FormatKind>(in.u8(0) % 4);
  h.dtype = static_cast<DType>(in.u8(1) % 3);
  h.rows = clamp(in.i16(2), kMaxSide);
  h.cols = clamp(in.i16(4), kMaxSide);
  h.p0 = static_cast<int>(clamp(in.i16(6), kMaxParameter));
  h.p1 = static_cast<int>(clamp(in.i16(8), kMaxParameter));
  h.p2 = static_cast<int>(clamp(in.i16(10), kMaxParameter));
  for (int i = 0; i < 3; ++i) h.delta[i] = static_cast<int8_t>(in.u8(12 + i));
  return h;
}

// `needed + delta`, clamped to [0, kMaxArray].
inline std::size_t array_length(int64_t needed, int delta) {
  return static_cast<std::size_t>(std::clamp<int64_t>(needed + delta, 0, kMaxArray));
}

inline void write_i16(std::vector<uint8_t>& out, std::size_t at, int v) {
  out[at] = static_cast<uint8_t>(v & 0xff);
  out[at + 1] = static_cast<uint8_t>((v >> 8) & 0xff);
}

// The header bytes of a matrix (deltas 0): used by make_corpus.cpp.
inline std::vector<uint8_t> format_header_bytes(FormatKind kind, DType dtype, int64_t rows, int64_t cols, int p0,
                                                int p1, int p2) {
  std::vector<uint8_t> out(kFormatHeaderBytes, 0);
  out[0] = static_cast<uint8_t>(kind);
  out[1] = static_cast<uint8_t>(dtype);
  write_i16(out, 2, static_cast<int>(rows));
  write_i16(out, 4, static_cast<int>(cols));
  write_i16(out, 6, p0);
  write_i16(out, 8, p1);
  write_i16(out, 10, p2);
  return out;
}

inline void append_bytes(std::vector<uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}

inline std::vector<uint8_t> encode(const NmMatrix& a) {
  auto out = format_header_bytes(FormatKind::nm, a.dtype(), a.rows, a.cols, a.n, a.m, 0);
  append_bytes(out, a.values.data(), a.values.size_bytes());
  append_bytes(out, a.indices.data(), a.indices.size());
  return out;
}

inline std::vector<uint8_t> encode(const VnmMatrix& a) {
  auto out = format_header_bytes(FormatKind::vnm, a.dtype(), a.rows, a.cols, a.v, a.n, a.m);
  append_bytes(out, a.values.data(), a.values.size_bytes());
  append_bytes(out, a.m_indices.data(), a.m_indices.size());
  append_bytes(out, a.column_loc.data(), a.column_loc.size());
  return out;
}

inline std::vector<uint8_t> encode(const TileMatrix& a) {
  auto out = format_header_bytes(FormatKind::tile, a.dtype(), a.rows, a.cols, a.tile_rows, a.tile_cols, 0);
  append_bytes(out, a.ptr.data(), a.ptr.size() * sizeof(int32_t));  // little-endian hosts (x86-64, arm64)
  append_bytes(out, a.indices.data(), a.indices.size() * sizeof(int32_t));
  append_bytes(out, a.data.data(), a.data.size_bytes());
  return out;
}

}  // namespace nmkit::fuzz
