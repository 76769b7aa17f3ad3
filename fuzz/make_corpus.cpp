// Writes the fuzzers' seed corpus from files the library itself writes: `make_fuzz_corpus fuzz/corpus`.
// Small valid inputs of every kind, and a few near-valid ones (one field wrong), so that the fuzzers start at the
// checks instead of at the header length. Deterministic: the same files on every run.
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "format_input.hpp"
#include "nmkit/error.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/io/model.hpp"

namespace {

using namespace nmkit;
namespace fs = std::filesystem;

fs::path g_root;
int g_files = 0;

void write(const std::string& target, const std::string& name, const void* data, std::size_t size) {
  const fs::path dir = g_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("cannot write " + (dir / name).string());
  ++g_files;
}
void write(const std::string& target, const std::string& name, const std::vector<std::byte>& bytes) {
  write(target, name, bytes.data(), bytes.size());
}
void write(const std::string& target, const std::string& name, const std::vector<uint8_t>& bytes) {
  write(target, name, bytes.data(), bytes.size());
}
void write(const std::string& target, const std::string& name, const std::string& text) {
  write(target, name, text.data(), text.size());
}

// Small non-zero values that every dtype stores exactly.
float value(std::mt19937& rng) { return static_cast<float>(static_cast<int>(rng() % 15) - 7) * 0.25f + 0.125f; }

// A rows x cols matrix whose every group of m columns keeps n random entries.
DenseMatrix nm_dense(int64_t rows, int64_t cols, int n, int m, DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  DenseMatrix d = DenseMatrix::zeros(rows, cols, dtype);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g * m < cols; ++g) {
      std::vector<int> js(m);
      for (int j = 0; j < m; ++j) js[j] = j;
      std::shuffle(js.begin(), js.end(), rng);
      for (int s = 0; s < n; ++s)
        if (g * m + js[s] < cols) d.set(r, g * m + js[s], value(rng));
    }
  return d;
}

// Every V x M block keeps 4 random columns; every row n of those.
DenseMatrix vnm_dense(int64_t rows, int64_t cols, int v, int n, int m, DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  DenseMatrix d = DenseMatrix::zeros(rows, cols, dtype);
  for (int64_t r0 = 0; r0 < rows; r0 += v)
    for (int64_t g = 0; g * m < cols; ++g) {
      std::vector<int> js(m);
      for (int j = 0; j < m; ++j) js[j] = j;
      std::shuffle(js.begin(), js.end(), rng);
      for (int64_t r = r0; r < std::min<int64_t>(r0 + v, rows); ++r) {
        int order[4] = {0, 1, 2, 3};
        std::shuffle(order, order + 4, rng);
        for (int s = 0; s < n; ++s)
          if (g * m + js[order[s]] < cols) d.set(r, g * m + js[order[s]], value(rng));
      }
    }
  return d;
}

// About half the tiles hold values.
DenseMatrix tile_dense(int64_t rows, int64_t cols, int tr, int tc, DType dtype, unsigned seed) {
  std::mt19937 rng(seed);
  DenseMatrix d = DenseMatrix::zeros(rows, cols, dtype);
  for (int64_t r0 = 0; r0 < rows; r0 += tr)
    for (int64_t c0 = 0; c0 < cols; c0 += tc) {
      if (rng() % 2) continue;
      for (int64_t r = r0; r < std::min<int64_t>(r0 + tr, rows); ++r)
        for (int64_t c = c0; c < std::min<int64_t>(c0 + tc, cols); ++c) d.set(r, c, value(rng));
    }
  return d;
}

std::vector<std::byte> model_bytes(const std::string& name, const SparseMatrix& s) {
  ModelFile model;
  model.weights.push_back({name, s});
  return serialize_safetensors(model_to_safetensors(model));
}
std::vector<std::byte> model_bytes(const std::string& name, const QuantizedNmMatrix& q) {
  ModelFile model;
  model.weights.push_back({name, q});
  return serialize_safetensors(model_to_safetensors(model));
}

std::vector<std::byte> corrupt(SafetensorsFile f, const std::function<void(SafetensorsFile&)>& edit) {
  edit(f);
  return serialize_safetensors(f);
}

StTensor& part(SafetensorsFile& f, const std::string& name) {
  for (auto& t : f.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no part " + name);
}

// A file of the given header (JSON) and `data_bytes` zero bytes of data, written without the library's checks.
std::vector<uint8_t> raw_file(const std::string& header, std::size_t data_bytes = 0) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>((header.size() >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void safetensors_seeds() {
  const std::string t = "safetensors";
  SafetensorsFile dense;
  dense.tensors.push_back(to_tensor("w", nm_dense(2, 3, 2, 3, DType::f32, 1)));
  write(t, "dense_f32", serialize_safetensors(dense));

  SafetensorsFile mixed;
  mixed.metadata["format"] = "pt";
  mixed.tensors.push_back(to_tensor("h", nm_dense(2, 2, 1, 2, DType::f16, 2)));
  mixed.tensors.push_back(to_tensor("b", nm_dense(1, 3, 1, 3, DType::bf16, 3)));
  mixed.tensors.push_back({"ids", StDType::I64, {2}, std::vector<std::byte>(16, std::byte{3})});
  mixed.tensors.push_back({"mask", StDType::BOOL, {3}, std::vector<std::byte>(3, std::byte{1})});
  mixed.tensors.push_back({"empty", StDType::F32, {0, 4}, {}});
  mixed.tensors.push_back({"scalar", StDType::U8, {}, {std::byte{9}}});
  write(t, "mixed_dtypes_metadata", serialize_safetensors(mixed));

  SafetensorsFile every;
  for (StDType d :
       {StDType::U8, StDType::I8, StDType::U16, StDType::I16, StDType::U32, StDType::I32, StDType::U64, StDType::F64})
    every.tensors.push_back({std::string("t_") + st_dtype_name(d), d, {1}, std::vector<std::byte>(st_dtype_size(d))});
  write(t, "every_dtype", serialize_safetensors(every));

  write(t, "empty", serialize_safetensors(SafetensorsFile{}));
  SafetensorsFile meta;
  meta.metadata["nmkit.format_version"] = "1";
  meta.metadata["note"] = "x";
  write(t, "metadata_only", serialize_safetensors(meta));

  // Near-valid: truncated data, a lying header length, overlapping tensors.
  std::vector<std::byte> bytes = serialize_safetensors(dense);
  bytes.resize(bytes.size() - 4);
  write(t, "truncated", bytes);
  bytes = serialize_safetensors(dense);
  bytes[0] = std::byte{static_cast<unsigned char>(std::to_integer<unsigned>(bytes[0]) + 8)};
  write(t, "header_length_off", bytes);
  write(
      t, "overlap",
      raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12));
  // Regressions (docs/testing.md, "Fuzzing"): an empty shape whose non-zero dimensions overflow int64_t.
  write(t, "regress_numel_overflow",
        raw_file(R"({"t":{"dtype":"F32","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})"));
  write(t, "nm_2_4_f16", model_bytes("w", compress_nm(nm_dense(4, 8, 2, 4, DType::f16, 4), 2, 4)));
}

void model_seeds() {
  const std::string t = "model_loader";
  const auto nm = compress_nm(nm_dense(4, 8, 2, 4, DType::f16, 10), 2, 4);
  write(t, "nm_2_4_f16", model_bytes("w", nm));
  write(t, "nm_3_7_f32_padded", model_bytes("w", compress_nm(nm_dense(3, 10, 3, 7, DType::f32, 11), 3, 7)));
  write(t, "nm_1_2_bf16", model_bytes("layer.0.w", compress_nm(nm_dense(2, 5, 1, 2, DType::bf16, 12), 1, 2)));
  const auto vnm = compress_vnm(vnm_dense(8, 16, 4, 2, 8, DType::f16, 13), 4, 2, 8);
  write(t, "vnm_4_2_8_f16", model_bytes("w", vnm));
  write(t, "vnm_3_1_5_f32_padded", model_bytes("w", compress_vnm(vnm_dense(5, 7, 3, 1, 5, DType::f32, 14), 3, 1, 5)));
  const auto tile = compress_tiles(tile_dense(6, 10, 4, 4, DType::f32, 15), 4, 4);
  write(t, "tile_4x4_f32_padded", model_bytes("w", tile));
  write(t, "tile_2x3_bf16", model_bytes("w", compress_tiles(tile_dense(4, 6, 2, 3, DType::bf16, 16), 2, 3)));

  const QuantizedNmMatrix e4m3 = quantize_nm(nm, QuantType::e4m3);
  write(t, "nm_2_4_e4m3", model_bytes("w", e4m3));
  write(t, "nm_2_4_e5m2", model_bytes("w", quantize_nm(nm, QuantType::e5m2)));
  write(t, "nm_3_7_int8_padded",
        model_bytes("w", quantize_nm(compress_nm(nm_dense(3, 10, 3, 7, DType::f32, 11), 3, 7), QuantType::int8)));

  ModelFile all;
  all.metadata["note"] = "seed";
  all.weights.push_back({"bias", to_tensor("bias", nm_dense(1, 4, 1, 4, DType::f32, 17))});
  all.weights.push_back({"a", nm});
  all.weights.push_back({"b", vnm});
  all.weights.push_back({"c", tile});
  all.weights.push_back({"d", e4m3});
  const SafetensorsFile file = model_to_safetensors(all);
  write(t, "all_formats", serialize_safetensors(file));

  // Near-valid: each breaks one check of the loader.
  const SafetensorsFile one = model_to_safetensors(ModelFile{{{"w", nm}}, {}});
  write(t, "bad_missing_part", corrupt(one, [](SafetensorsFile& f) { f.tensors.pop_back(); }));
  write(t, "bad_description", corrupt(one, [](SafetensorsFile& f) {
          f.metadata["nmkit:w"] = R"({"format":"nm","shape":[4,8],"dtype":"f16","n":2,"m":5})";
        }));
  write(t, "bad_version", corrupt(one, [](SafetensorsFile& f) { f.metadata["nmkit.format_version"] = "2"; }));
  write(t, "bad_index_order", corrupt(one, [](SafetensorsFile& f) { part(f, "w.indices").data[0] = std::byte{0}; }));
  const SafetensorsFile q = model_to_safetensors(ModelFile{{{"w", e4m3}}, {}});
  write(t, "bad_quantized_code", corrupt(q, [](SafetensorsFile& f) { part(f, "w.values").data[0] = std::byte{0x7f}; }));
  write(t, "bad_quantized_scale",
        corrupt(q, [](SafetensorsFile& f) { part(f, "w.scales").data[3] = std::byte{0xff}; }));
  const SafetensorsFile v = model_to_safetensors(ModelFile{{{"w", vnm}}, {}});
  write(t, "bad_column_loc", corrupt(v, [](SafetensorsFile& f) { part(f, "w.column_loc").data[1] = std::byte{0}; }));
  const SafetensorsFile ti = model_to_safetensors(ModelFile{{{"w", tile}}, {}});
  write(t, "bad_tile_ptr", corrupt(ti, [](SafetensorsFile& f) { part(f, "w.ptr").data[4] = std::byte{9}; }));
  // Regression (docs/testing.md, "Fuzzing"): 2^40 rows and no columns, which no part bounds, walked row by row.
  write(t, "regress_nm_tall",
        raw_file(R"({"__metadata__":{"nmkit:w":"{\"format\":\"nm\",\"shape\":[1099511627776,0],\"dtype\":\"f32\",)"
                 R"(\"n\":2,\"m\":4}"},"w.values":{"dtype":"F32","shape":[1099511627776,0],"data_offsets":[0,0]},)"
                 R"("w.indices":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}})"));
  write(t, "bad_tile_padding", corrupt(ti, [](SafetensorsFile& f) {
          auto& d = part(f, "w.data").data;
          std::memset(d.data() + d.size() - 4, 0x3f, 4);
        }));
}

void format_seeds() {
  const std::string t = "format";
  for (const char* text : {"2:4", "nm:1:8", "vnm:64:2:8", "vnm:128:1:256", "tile:64x64:0.25", "tile:32:1",
                           "tile:16x8:1e-3", "f32", "fp16", "bfloat16", "half", "none", "relu", "gelu"}) {
    std::string name = std::string("text_") + text;
    std::replace_if(
        name.begin(), name.end(), [](char c) { return c == ':' || c == '.'; }, '_');
    write(t, name, std::string(1, '\0') + text);
  }
  write(t, "nm_2_4_f32", fuzz::encode(compress_nm(nm_dense(3, 8, 2, 4, DType::f32, 20), 2, 4)));
  write(t, "nm_3_7_f16_padded", fuzz::encode(compress_nm(nm_dense(2, 10, 3, 7, DType::f16, 21), 3, 7)));
  write(t, "nm_5_32_bf16", fuzz::encode(compress_nm(nm_dense(2, 40, 5, 32, DType::bf16, 22), 5, 32)));
  write(t, "vnm_4_2_8_f16", fuzz::encode(compress_vnm(vnm_dense(8, 16, 4, 2, 8, DType::f16, 23), 4, 2, 8)));
  write(t, "vnm_3_1_5_f32_padded", fuzz::encode(compress_vnm(vnm_dense(5, 7, 3, 1, 5, DType::f32, 24), 3, 1, 5)));
  write(t, "tile_4x4_f32_padded", fuzz::encode(compress_tiles(tile_dense(6, 10, 4, 4, DType::f32, 25), 4, 4)));
  write(t, "tile_2x3_bf16", fuzz::encode(compress_tiles(tile_dense(4, 6, 2, 3, DType::bf16, 26), 2, 3)));
  write(t, "tile_empty", fuzz::encode(compress_tiles(DenseMatrix::zeros(96, 90, DType::f16), 1024, 7)));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir, e.g. fuzz/corpus>\n", argv[0]);
    return 2;
  }
  g_root = argv[1];
  try {
    safetensors_seeds();
    model_seeds();
    format_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_corpus: %s\n", e.what());
    return 1;
  }
  std::printf("make_fuzz_corpus: %d files under %s\n", g_files, g_root.string().c_str());
  return 0;
}
