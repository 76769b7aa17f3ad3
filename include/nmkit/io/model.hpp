#pragma once
// A model file: named weights, each dense, compressed, or compressed N:M with 8-bit values. Compressed weights are
// stored as named parts (w.values, w.indices, ...) plus a JSON description under the metadata key "nmkit:<name>".
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "nmkit/format/quantized.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/io/safetensors.hpp"

namespace nmkit {

// The largest side of a compressed weight in a model file (2^24 = 16,777,216; the largest vocabularies are near
// 2^18): its element and byte counts then stay far from overflow, and the walks over rows that validation and
// decompression make stay short even for a matrix that stores nothing (no columns, no stored tile).
inline constexpr int64_t kMaxCompressedSide = int64_t{1} << 24;

// Throws Error(invalid_argument) naming the shape when a side is over kMaxCompressedSide: a weight that a model
// file could not hold compressed, checked before pruning and before writing.
void check_compressed_shape(int64_t rows, int64_t cols);

struct NamedWeight {
  std::string name;
  // Dense (any dtype, any rank), compressed, or N:M with 8-bit values and per-row scales.
  std::variant<StTensor, SparseMatrix, QuantizedNmMatrix> weight;
};

struct ModelFile {
  std::vector<NamedWeight> weights;
  std::map<std::string, std::string> metadata;  // user metadata (nmkit's own keys are not listed)
};

// Reads and validates: every part present with the right dtype and size, the format's own checks, no name used by
// two weights (a dense tensor and a compressed weight included), no compressed side over kMaxCompressedSide.
ModelFile load_model(const std::string& path);
ModelFile model_from_safetensors(const SafetensorsFile& file, const std::string& origin);
// Refuses (Error invalid_argument) what model_from_safetensors would refuse to read back: a name used twice, a
// compressed weight with a side over kMaxCompressedSide.
SafetensorsFile model_to_safetensors(const ModelFile& model);
void save_model(const std::string& path, const ModelFile& model);

}  // namespace nmkit
