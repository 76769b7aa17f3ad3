#pragma once
// Little-endian, LSB-first bit streams: value i of width `bits` occupies bits [i*bits, (i+1)*bits)
// of the byte array, bit 0 being the least significant bit of byte 0. Used for N:M indices and
// V:N:M m-indices (docs/formats.md has the diagram).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace nmkit {

constexpr std::size_t packed_bytes(std::size_t count, int bits) noexcept { return (count * bits + 7) / 8; }

// Widths up to 9 bits: a value then spans at most two bytes, read and written as one little-endian window.
inline constexpr int kMaxPackedBits = 9;
inline unsigned read_packed(const std::vector<uint8_t>& stream, std::size_t index, int bits) noexcept {
  const std::size_t bit = index * bits, byte = bit / 8;
  unsigned window = stream[byte];
  if (byte + 1 < stream.size()) window |= unsigned{stream[byte + 1]} << 8;
  return (window >> (bit % 8)) & ((1u << bits) - 1u);
}

// The stream must already hold packed_bytes(count, bits) bytes; the value's bits replace what was there.
inline void write_packed(std::vector<uint8_t>& stream, std::size_t index, int bits, unsigned value) noexcept {
  const std::size_t bit = index * bits, byte = bit / 8;
  const unsigned shift = bit % 8, mask = ((1u << bits) - 1u) << shift, shifted = (value << shift) & mask;
  stream[byte] = static_cast<uint8_t>((stream[byte] & ~mask) | shifted);
  if (shift + bits > 8) stream[byte + 1] = static_cast<uint8_t>((stream[byte + 1] & ~(mask >> 8)) | (shifted >> 8));
}

// Whether the unused high bits of the stream's last byte are zero, as in every stream nmkit writes: a reader that
// accepted other bits would keep them and write them out again.
inline bool padding_is_zero(const std::vector<uint8_t>& stream, std::size_t count, int bits) noexcept {
  const std::size_t used = count * static_cast<std::size_t>(bits) % 8;
  return used == 0 || stream.empty() || (stream.back() >> used) == 0;
}

// Bits needed to address one of `m` positions: ceil(log2 m), at least 1.
constexpr int index_bits_for(int m) noexcept {
  int bits = 1;
  while ((1 << bits) < m) ++bits;
  return bits;
}

}  // namespace nmkit
