// safetensors files: round trips, compressed tensors, and a corpus of malformed files.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include <unistd.h>

#include "nmkit/error.hpp"
#include "nmkit/io/model.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/prune_model.hpp"
#include "test_util.hpp"

namespace nmkit {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> raw_file(const std::string& header, std::size_t data_bytes, uint64_t declared_length = ~0ull) {
  const uint64_t length = declared_length == ~0ull ? header.size() : declared_length;
  std::vector<std::byte> out(8 + header.size() + data_bytes, std::byte{0x5a});
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((length >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

void expect_rejected(const std::vector<std::byte>& file, const std::string& fragment) {
  EXPECT_NMKIT_ERROR(parse_safetensors(file, "bad.safetensors"), ErrorCode::io_error, fragment);
}

fs::path temp_dir() {
  fs::path dir = fs::temp_directory_path() / ("nmkit_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

TEST(Safetensors, DenseRoundTripKeepsBytesShapesAndMetadata) {
  SafetensorsFile f;
  f.metadata["format"] = "pt";
  f.tensors.push_back(to_tensor("w16", test::random_matrix(3, 5, DType::f16, 1)));
  f.tensors.push_back(to_tensor("wbf", test::random_matrix(2, 7, DType::bf16, 2)));
  f.tensors.push_back({"ids", StDType::I64, {4}, std::vector<std::byte>(32, std::byte{7})});
  f.tensors.push_back({"empty", StDType::F32, {0, 3}, {}});
  f.tensors.push_back({"scalar", StDType::U8, {}, {std::byte{9}}});
  const std::vector<std::byte> bytes = serialize_safetensors(f);
  uint64_t len = 0;
  for (int i = 0; i < 8; ++i) len |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  EXPECT_EQ(len % 8, 0u);
  const SafetensorsFile g = parse_safetensors(bytes, "mem");
  ASSERT_EQ(g.tensors.size(), f.tensors.size());
  for (std::size_t i = 0; i < f.tensors.size(); ++i) {
    EXPECT_EQ(g.tensors[i].name, f.tensors[i].name);
    EXPECT_EQ(g.tensors[i].dtype, f.tensors[i].dtype);
    EXPECT_EQ(g.tensors[i].shape, f.tensors[i].shape);
    EXPECT_EQ(g.tensors[i].data, f.tensors[i].data);
  }
  EXPECT_EQ(g.metadata, f.metadata);
  test::expect_same_matrix(to_dense_matrix(*g.find("wbf")), test::random_matrix(2, 7, DType::bf16, 2));
  EXPECT_NMKIT_ERROR(to_dense_matrix(*g.find("ids")), ErrorCode::invalid_argument, "2-D");
}

TEST(Safetensors, CompressedTensorsRoundTripThroughFiles) {
  const DenseMatrix w = test::random_matrix(70, 90, DType::f16, 3);
  ModelFile model;
  model.metadata["note"] = "test";
  model.weights.push_back({"bias", StTensor{"bias", StDType::F32, {2}, std::vector<std::byte>(8, std::byte{1})}});
  for (const char* spec : {"2:4", "3:7", "vnm:16:2:8", "vnm:64:1:10", "tile:32x16:0.3"})
    model.weights.push_back({std::string("w_") + spec, prune_magnitude(w, parse_format_spec(spec)).compressed});
  const fs::path path = temp_dir() / "model.safetensors";
  save_model(path.string(), model);
  const ModelFile back = load_model(path.string());
  ASSERT_EQ(back.weights.size(), model.weights.size());
  EXPECT_EQ(back.metadata, model.metadata);
  for (std::size_t i = 1; i < model.weights.size(); ++i) {
    EXPECT_EQ(back.weights[i].name, model.weights[i].name);
    const auto& s = std::get<SparseMatrix>(back.weights[i].weight);
    EXPECT_EQ(format_name(s), format_name(std::get<SparseMatrix>(model.weights[i].weight)));
    test::expect_same_matrix(decompress(s), decompress(std::get<SparseMatrix>(model.weights[i].weight)));
  }
  fs::remove_all(path.parent_path());
}

TEST(Safetensors, MalformedFilesAreRejectedWithAReason) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  expect_rejected({}, "too short");
  expect_rejected(raw_file("{" + ok_entry + "}", 8, 1000), "runs past the end");
  expect_rejected(raw_file("{}", 0, 1ull << 40), "exceeds the limit");
  expect_rejected(raw_file("{not json", 0), "not a JSON object");
  expect_rejected(raw_file("[1,2]", 0), "not a JSON object");
  expect_rejected(raw_file("{" + ok_entry + "}", 4), "past the data section");  // truncated data
  expect_rejected(raw_file(R"({"t":{"dtype":"F17","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype 'F17'");
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "need 12");
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "non-negative");
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,8]}})", 8),
                  "overflows");
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "begin 8 > end 0");
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8), "two non-negative integers");
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[2]}})", 8), "data_offsets");
  expect_rejected(raw_file(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8), "dtype");
  expect_rejected(raw_file(R"({"t":5})", 8), "tensor 't'");
  expect_rejected(
      raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      "overlap");
  expect_rejected(raw_file(R"({"__metadata__":{"k":1}})", 0), "not a string");
  expect_rejected(
      raw_file(
          R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
          8),
      "names 't' more than once");
}

TEST(Safetensors, MutatedFilesNeverCrash) {
  SafetensorsFile f;
  f.tensors.push_back(to_tensor("w", test::random_matrix(4, 4, DType::f16, 5)));
  f.tensors.push_back({"i", StDType::I32, {3}, std::vector<std::byte>(12, std::byte{1})});
  const std::vector<std::byte> good = serialize_safetensors(f);
  std::mt19937 rng(11);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> bad = good;
    const int flips = 1 + trial % 3;
    for (int i = 0; i < flips; ++i) bad[rng() % (trial % 2 ? 40 : bad.size())] = static_cast<std::byte>(rng());
    if (trial % 7 == 0) bad.resize(rng() % bad.size());
    try {
      parse_safetensors(bad, "mutant");
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::io_error);
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 100);
}

// Builds a model file with one compressed weight, lets `corrupt` edit it, and parses it back.
void expect_model_rejected(const char* spec, const std::function<void(SafetensorsFile&)>& corrupt,
                           const std::string& fragment) {
  ModelFile model;
  model.weights.push_back(
      {"w", prune_magnitude(test::random_matrix(32, 40, DType::f16, 9), parse_format_spec(spec)).compressed});
  SafetensorsFile f = model_to_safetensors(model);
  corrupt(f);
  const std::vector<std::byte> bytes = serialize_safetensors(f);
  try {
    model_from_safetensors(parse_safetensors(bytes, "m.safetensors"), "m.safetensors");
    ADD_FAILURE() << "accepted a corrupt " << spec << " file (expected '" << fragment << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compressed tensor 'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

StTensor& part(SafetensorsFile& f, const std::string& name) {
  for (auto& t : f.tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no part " + name);
}

TEST(Safetensors, CompressedPartsThatDisagreeAreRejected) {
  expect_model_rejected(
      "2:4", [](SafetensorsFile& f) { f.tensors.erase(f.tensors.begin() + 1); }, "'w.indices' is missing");
  expect_model_rejected(
      "2:4",
      [](SafetensorsFile& f) {
        part(f, "w.values").shape = {32, 19}, part(f, "w.values").data.resize(32 * 19 * 2);
      },
      "'w.values' has shape");
  expect_model_rejected(
      "2:4", [](SafetensorsFile& f) { part(f, "w.indices").dtype = StDType::I8; }, "has dtype I8");
  expect_model_rejected(
      "2:4", [](SafetensorsFile& f) { f.metadata["nmkit:w"] = "{oops"; }, "not a JSON object");
  expect_model_rejected(
      "2:4", [](SafetensorsFile& f) { f.metadata["nmkit:w"] = R"({"format":"csr","shape":[32,40],"dtype":"f16"})"; },
      "unknown format 'csr'");
  expect_model_rejected(
      "2:4",
      [](SafetensorsFile& f) {
        f.metadata["nmkit:w"] = R"({"format":"nm","shape":[32,40],"dtype":"f16","n":2,"m":4294967300})";
      },
      "out of range");
  expect_model_rejected(
      "vnm:8:2:8", [](SafetensorsFile& f) { part(f, "w.column_loc").data[1] = std::byte{0}; }, "column_loc");
  expect_model_rejected(
      "vnm:8:2:8", [](SafetensorsFile& f) { part(f, "w.column_loc").data[2] = std::byte{200}; }, ">= M=8");
  expect_model_rejected(
      "tile:16x16:0.5", [](SafetensorsFile& f) { reinterpret_cast<int32_t*>(part(f, "w.ptr").data.data())[1] = 99; },
      "ptr");
  expect_model_rejected(
      "tile:16x16:0.5", [](SafetensorsFile& f) { part(f, "w.indices").data[0] = std::byte{50}; }, "out of range");
}

// A dense tensor and a compressed weight of one name would be two weights under that name: prune took the
// compressed one for the dense one and failed inside std::get. Refused on reading, and never written.
TEST(Safetensors, ANameStandsForOneWeight) {
  ModelFile model;
  model.weights.push_back(
      {"w", prune_magnitude(test::random_matrix(32, 40, DType::f16, 9), parse_format_spec("2:4")).compressed});
  SafetensorsFile f = model_to_safetensors(model);
  f.tensors.push_back({"w", StDType::F32, {1}, std::vector<std::byte>(4)});
  EXPECT_NMKIT_ERROR(model_from_safetensors(parse_safetensors(serialize_safetensors(f), "m.safetensors"), "m"),
                     ErrorCode::io_error, "'w' is both a dense tensor and a compressed weight");
  model.weights.push_back({"w", StTensor{"w", StDType::F32, {1}, std::vector<std::byte>(4)}});
  EXPECT_NMKIT_ERROR(model_to_safetensors(model), ErrorCode::invalid_argument, "two weights are named 'w'");
}

// A weight with a side over 2^24 is refused before pruning and before writing, not written into a file that
// loading then refuses (an F32 [2^24 + 1, 0] tensor also walked 2^24 empty rows before).
TEST(Safetensors, SidesTheReaderRefusesAreNeitherPrunedNorWritten) {
  constexpr int64_t kTooLong = kMaxCompressedSide + 1;
  ModelFile model;
  model.weights.push_back({"w", StTensor{"w", StDType::F32, {kTooLong, 0}, {}}});
  ModelPruneOptions options;
  options.spec = parse_format_spec("2:4");
  EXPECT_NMKIT_ERROR(select_weights(model, options), ErrorCode::invalid_argument,
                     "tensor 'w': shape [16777217, 0] has a side over 2^24");
  NmMatrix tall;
  tall.rows = kTooLong, tall.cols = 0, tall.n = 2, tall.m = 4;
  tall.values = TypedBuffer(DType::f32, 0);
  model.weights[0].weight = SparseMatrix{tall};
  EXPECT_NMKIT_ERROR(model_to_safetensors(model), ErrorCode::invalid_argument,
                     "compressed weight 'w': shape [16777217, 0] has a side over 2^24");
}

// An empty tensor at the offset where a non-empty one starts (as serialize_safetensors lays them out) overlaps
// nothing: accepted, and it round-trips (a fuzzer found the file rejected after its own round trip).
TEST(Safetensors, EmptyTensorsSharingAnOffsetAreAccepted) {
  const SafetensorsFile file = parse_safetensors(
      raw_file(
          R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"e":{"dtype":"U8","shape":[0],"data_offsets":[0,0]},"m":{"dtype":"U8","shape":[0],"data_offsets":[1,1]}})",
          1),
      "empty.safetensors");
  ASSERT_EQ(file.tensors.size(), 3u);
  const SafetensorsFile back = parse_safetensors(serialize_safetensors(file), "round-trip");
  ASSERT_NE(back.find("a"), nullptr);
  EXPECT_EQ(back.find("a")->data, file.find("a")->data);
  ASSERT_NE(back.find("e"), nullptr);
  EXPECT_TRUE(back.find("e")->data.empty());
  // Still an overlap: two tensors with bytes in common, with an empty one between them.
  expect_rejected(
      raw_file(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          8),
      "overlap");
}

TEST(Safetensors, UnknownFormatVersionIsRejected) {
  SafetensorsFile f;
  f.metadata["nmkit.format_version"] = "9";
  EXPECT_NMKIT_ERROR(model_from_safetensors(f, "v9.safetensors"), ErrorCode::io_error, "format version '9'");
}

TEST(Safetensors, WritesAreAtomic) {
  const fs::path dir = temp_dir();
  const fs::path target = dir / "out.safetensors";
  { std::ofstream(target) << "previous content"; }
  SafetensorsFile bad;
  bad.tensors.push_back({"x", StDType::F32, {4}, std::vector<std::byte>(3)});  // sizes disagree: nothing is written
  EXPECT_NMKIT_ERROR(write_safetensors(target.string(), bad), ErrorCode::invalid_argument, "holds 3 bytes");
  std::ifstream in(target);
  std::string content((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(content, "previous content");
  EXPECT_NMKIT_ERROR(write_safetensors((dir / "missing_dir" / "x.safetensors").string(), SafetensorsFile{}),
                     ErrorCode::io_error, "does not exist");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1);  // no temporary file left behind
  fs::remove_all(dir);
}

TEST(Safetensors, ReadsTheRealModel) {
  const ModelFile model = load_model(NMKIT_TEST_MODEL);
  int matrices = 0;
  for (const auto& w : model.weights) {
    const auto& t = std::get<StTensor>(w.weight);
    if (t.shape.size() == 2 && t.dtype == StDType::F32) ++matrices;
  }
  EXPECT_GE(matrices, 36);  // 6 layers x (q, k, v, o, up, down)
  const SafetensorsFile f = read_safetensors(NMKIT_TEST_MODEL);
  const StTensor* up = f.find("encoder.layer.0.intermediate.dense.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->shape, (std::vector<int64_t>{1536, 384}));
  EXPECT_NMKIT_ERROR(read_safetensors("/nonexistent/model.safetensors"), ErrorCode::io_error, "cannot open");
}

// Found by the fuzzers (fuzz/, docs/testing.md "Fuzzing"): the reader accepted a shape whose non-zero dimensions
// overflow int64_t when a later dimension is 0 ([2^62, 2, 0] holds nothing, but numel() multiplied 2^62 * 2 first).
TEST(Safetensors, ShapesWhoseDimensionsOverflowInt64AreRejectedEvenWhenEmpty) {
  expect_rejected(raw_file(R"({"t":{"dtype":"F32","shape":[4611686018427387904,2,0],"data_offsets":[0,0]}})", 0),
                  "overflows 64 bits");
  const SafetensorsFile ok = parse_safetensors(
      raw_file(R"({"t":{"dtype":"F32","shape":[4611686018427387903,0,2],"data_offsets":[0,0]}})", 0), "ok");
  ASSERT_EQ(ok.tensors.size(), 1u);
  EXPECT_EQ(ok.tensors[0].numel(), 0);
  // An empty 2-D tensor converts (its bytes were copied with memcpy from a null pointer).
  const DenseMatrix empty = to_dense_matrix(StTensor{"e", StDType::F32, {0, 3}, {}});
  EXPECT_EQ(empty.rows, 0);
  EXPECT_EQ(empty.cols, 3);
}

// Found by the fuzzers: compressed weights whose shape no part bounds. A tile weight of 2^40 x 2^24 with no stored
// tile loaded, and rows * cols then overflowed int64_t (format_density, decompress); an N:M weight of 2^40 rows and
// no columns loaded only after validate() walked all its rows (hours); a side past 2^63 was read as negative.
TEST(Safetensors, CompressedShapesTooLargeToUseAreRejected) {
  SafetensorsFile tile;
  tile.metadata["nmkit:w"] =
      R"({"format":"tile","shape":[1099511627776,16777216],"dtype":"f32","tile_rows":1024,"tile_cols":1024})";
  tile.tensors.push_back({"w.ptr", StDType::I32, {16385}, std::vector<std::byte>(16385 * 4)});
  tile.tensors.push_back({"w.indices", StDType::I32, {0}, {}});
  tile.tensors.push_back({"w.data", StDType::F32, {0, 1024, 1024}, {}});
  EXPECT_NMKIT_ERROR(model_from_safetensors(tile, "m.safetensors"), ErrorCode::io_error, "implausibly large");

  SafetensorsFile tall;
  tall.metadata["nmkit:w"] = R"({"format":"nm","shape":[1099511627776,0],"dtype":"f32","n":2,"m":4})";
  tall.tensors.push_back({"w.values", StDType::F32, {int64_t{1} << 40, 0}, {}});
  tall.tensors.push_back({"w.indices", StDType::U8, {0}, {}});
  EXPECT_NMKIT_ERROR(model_from_safetensors(tall, "m.safetensors"), ErrorCode::io_error, "implausibly large");

  SafetensorsFile negative;
  negative.metadata["nmkit:w"] =
      R"({"format":"tile","shape":[4,18446744073709551615],"dtype":"f32","tile_rows":2,"tile_cols":2})";
  negative.tensors.push_back({"w.ptr", StDType::I32, {1}, std::vector<std::byte>(4)});
  negative.tensors.push_back({"w.indices", StDType::I32, {0}, {}});
  negative.tensors.push_back({"w.data", StDType::F32, {0, 2, 2}, {}});
  EXPECT_NMKIT_ERROR(model_from_safetensors(negative, "m.safetensors"), ErrorCode::io_error, "implausibly large");

  // At the limit, and empty: loads (its empty parts copied without memcpy from a null pointer) and decompresses.
  SafetensorsFile empty;
  empty.metadata["nmkit:w"] = R"({"format":"nm","shape":[0,16777216],"dtype":"f16","n":2,"m":4})";
  empty.tensors.push_back({"w.values", StDType::F16, {0, 8388608}, {}});
  empty.tensors.push_back({"w.indices", StDType::U8, {0}, {}});
  const ModelFile model = model_from_safetensors(empty, "m.safetensors");
  ASSERT_EQ(model.weights.size(), 1u);
  const DenseMatrix dense = decompress(std::get<SparseMatrix>(model.weights[0].weight));
  EXPECT_EQ(dense.rows, 0);
  EXPECT_EQ(dense.cols, 16777216);
}

}  // namespace
}  // namespace nmkit
