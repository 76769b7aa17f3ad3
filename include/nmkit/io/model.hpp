#pragma once
// A model file: named weights, each dense, compressed, or compressed N:M with 8-bit values. Compressed weights are
// stored as named parts (w.values, w.indices, ...) plus a JSON description under the metadata key "nmkit:<name>".
#include <string>
#include <variant>
#include <vector>

#include "nmkit/format/quantized.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/io/safetensors.hpp"

namespace nmkit {

struct NamedWeight {
  std::string name;
  // Dense (any dtype, any rank), compressed, or N:M with 8-bit values and per-row scales.
  std::variant<StTensor, SparseMatrix, QuantizedNmMatrix> weight;
};

struct ModelFile {
  std::vector<NamedWeight> weights;
  std::map<std::string, std::string> metadata;  // user metadata (nmkit's own keys are not listed)
};

// Reads and validates: every part present with the right dtype and size, the format's own checks.
ModelFile load_model(const std::string& path);
ModelFile model_from_safetensors(const SafetensorsFile& file, const std::string& origin);
SafetensorsFile model_to_safetensors(const ModelFile& model);
void save_model(const std::string& path, const ModelFile& model);

}  // namespace nmkit
