// libFuzzer harness: the format layer's parsers (parse_format_spec, parse_dtype, parse_activation) and validate() of
// NmMatrix / VnmMatrix / TileMatrix built from fuzzed bytes (layout: format_input.hpp). A spec that parses prints
// and parses back to itself; a matrix that validates decompresses, and the dense matrix compresses back to a matrix
// that decompresses to the same values.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "format_input.hpp"
#include "fuzz_util.hpp"
#include "nmkit/error.hpp"
#include "nmkit/format/spec.hpp"

namespace {

using namespace nmkit;
using fuzz::array_length;

template <class Parse>
void try_parse(Parse&& parse) {
  try {
    parse();
  } catch (const Error&) {
  }
}

void parse_text(std::string_view text) {
  try_parse([&] {
    const FormatSpec spec = parse_format_spec(text);
    const std::string printed = to_string(spec);
    std::string again;
    try {
      again = to_string(parse_format_spec(printed));
    } catch (const Error& e) {
      fuzz::fail("to_string(spec) does not parse: '" + printed + "': " + e.what());
    }
    fuzz::check(again == printed, "to_string(parse_format_spec(to_string(spec))) differs from to_string(spec)");
    fuzz::check(group_width(spec) > 0, "a parsed spec has a non-positive group width");
  });
  try_parse([&] {
    const DType d = parse_dtype(text);
    fuzz::check(parse_dtype(dtype_name(d)) == d, "parse_dtype(dtype_name(d)) != d");
  });
  try_parse([&] {
    const Activation a = parse_activation(text);
    fuzz::check(parse_activation(activation_name(a)) == a, "parse_activation(activation_name(a)) != a");
  });
}

bool nm_ok(const fuzz::FormatHeader& h) {
  return h.rows >= 0 && h.cols >= 0 && h.p1 >= 2 && h.p1 <= 32 && h.p0 >= 1 && h.p0 < h.p1;
}
bool vnm_ok(const fuzz::FormatHeader& h) {
  return h.rows >= 0 && h.cols >= 0 && h.p0 >= 1 && (h.p1 == 1 || h.p1 == 2) && h.p2 >= 4 && h.p2 <= kVnmMaxM;
}
bool tile_ok(const fuzz::FormatHeader& h) {
  return h.rows >= 0 && h.cols >= 0 && h.p0 >= 1 && h.p0 <= kMaxTileSide && h.p1 >= 1 && h.p1 <= kMaxTileSide;
}

TypedBuffer take_values(fuzz::ByteReader& in, DType dtype, std::size_t count) {
  TypedBuffer b(dtype, count);
  in.take(b.data(), b.size_bytes());
  return b;
}

std::vector<uint8_t> take_bytes(fuzz::ByteReader& in, std::size_t count) {
  std::vector<uint8_t> v(count);
  in.take(v.data(), v.size());
  return v;
}

std::vector<int32_t> take_i32(fuzz::ByteReader& in, std::size_t count) {
  std::vector<int32_t> v(count);
  in.take(v.data(), v.size() * sizeof(int32_t));
  return v;
}

NmMatrix build_nm(fuzz::ByteReader& in, const fuzz::FormatHeader& h) {
  NmMatrix a;
  a.rows = h.rows, a.cols = h.cols, a.n = h.p0, a.m = h.p1;
  const int64_t count = nm_ok(h) ? a.value_count() : 0;
  a.values = take_values(in, h.dtype, array_length(count, h.delta[0]));
  a.indices = take_bytes(
      in, array_length(nm_ok(h) ? static_cast<int64_t>(packed_bytes(count, a.index_bits())) : 0, h.delta[1]));
  return a;
}

VnmMatrix build_vnm(fuzz::ByteReader& in, const fuzz::FormatHeader& h) {
  VnmMatrix a;
  a.rows = h.rows, a.cols = h.cols, a.v = h.p0, a.n = h.p1, a.m = h.p2;
  const bool ok = vnm_ok(h);
  const int64_t count = ok ? a.value_count() : 0;
  a.values = take_values(in, h.dtype, array_length(count, h.delta[0]));
  a.m_indices = take_bytes(in, array_length(static_cast<int64_t>(packed_bytes(count, kVnmMIndexBits)), h.delta[1]));
  a.column_loc = take_bytes(in, array_length(ok ? a.row_blocks() * a.groups() * kVnmSelectedColumns : 0, h.delta[2]));
  return a;
}

TileMatrix build_tile(fuzz::ByteReader& in, const fuzz::FormatHeader& h) {
  TileMatrix a;
  a.rows = h.rows, a.cols = h.cols, a.tile_rows = h.p0, a.tile_cols = h.p1;
  const bool ok = tile_ok(h);
  a.ptr = take_i32(in, array_length(ok ? a.grid_cols() + 1 : 0, h.delta[0]));
  a.indices = take_i32(in, array_length(a.ptr.empty() ? 0 : a.ptr.back(), h.delta[1]));
  a.data = take_values(in, h.dtype, array_length(ok ? a.nnz_tiles() * a.tile_elems() : 0, h.delta[2]));
  return a;
}

// A matrix that validates is usable: it decompresses, and its dense form compresses to the same matrix.
template <class Matrix, class Compress>
void check_matrix(const Matrix& a, Compress&& compress_again) {
  try {
    validate(a);
  } catch (const Error&) {
    return;  // rejected: the expected outcome of most inputs
  }
  try {
    const DenseMatrix dense = decompress(a);
    fuzz::check(dense.rows == a.rows && dense.cols == a.cols && dense.dtype() == a.dtype(),
                "decompress gave the wrong shape or dtype");
    const Matrix again = compress_again(dense);
    validate(again);
    fuzz::check_same_dense(decompress(again), dense, "decompress(compress(decompress(a))) differs from decompress(a)");
    (void)storage_bytes(a);
  } catch (const Error& e) {
    fuzz::fail(std::string("a matrix that validates failed later: ") + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  fuzz::ByteReader in(data, size);
  const fuzz::FormatHeader h = fuzz::read_format_header(in);
  switch (h.kind) {
    case fuzz::FormatKind::text:
      parse_text(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1));
      break;
    case fuzz::FormatKind::nm:
      check_matrix(build_nm(in, h), [&](const DenseMatrix& d) { return compress_nm(d, h.p0, h.p1); });
      break;
    case fuzz::FormatKind::vnm:
      check_matrix(build_vnm(in, h), [&](const DenseMatrix& d) { return compress_vnm(d, h.p0, h.p1, h.p2); });
      break;
    case fuzz::FormatKind::tile:
      check_matrix(build_tile(in, h), [&](const DenseMatrix& d) { return compress_tiles(d, h.p0, h.p1); });
      break;
  }
  return 0;
}
