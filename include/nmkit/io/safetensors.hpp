#pragma once
// safetensors files: an 8-byte little-endian header length, a JSON header, then the tensor bytes.
// Everything is validated before it is trusted (docs/formats.md lists the checks); writes are atomic.
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "nmkit/matrix.hpp"

namespace nmkit {

// The element types of the safetensors specification (F8_E4M3 and F8_E5M2: OCP FP8, one byte each).
enum class StDType : uint8_t { BOOL, U8, I8, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64, F8_E4M3, F8_E5M2 };

const char* st_dtype_name(StDType dtype) noexcept;  // "F16", ...
std::size_t st_dtype_size(StDType dtype) noexcept;

struct StTensor {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;

  int64_t numel() const noexcept;
};

struct SafetensorsFile {
  std::vector<StTensor> tensors;  // in file order
  std::map<std::string, std::string> metadata;

  const StTensor* find(const std::string& name) const noexcept;
};

struct SafetensorsLimits {
  uint64_t max_header_bytes = 100u << 20;  // the reference implementation's limit
};

// Parses an in-memory file; `origin` names it in error messages.
SafetensorsFile parse_safetensors(std::span<const std::byte> file, const std::string& origin,
                                  const SafetensorsLimits& limits = {});
SafetensorsFile read_safetensors(const std::string& path, const SafetensorsLimits& limits = {});
std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file);
// Writes to a temporary file beside `path`, then renames it over `path`.
void write_safetensors(const std::string& path, const SafetensorsFile& file);

// A 2-D F32/F16/BF16 tensor as a DenseMatrix (same dtype); Error otherwise.
DenseMatrix to_dense_matrix(const StTensor& tensor);
StTensor to_tensor(const std::string& name, const DenseMatrix& matrix);

}  // namespace nmkit
