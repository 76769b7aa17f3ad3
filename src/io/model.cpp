#include "nmkit/io/model.hpp"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "nmkit/error.hpp"
#include "nmkit/util/overloaded.hpp"
#include "nmkit/format/bit_packing.hpp"

namespace nmkit {
namespace {

using json = nlohmann::json;

constexpr const char* kDescriptionPrefix = "nmkit:";  // metadata key of a compressed weight's description
constexpr const char* kFormatVersionKey = "nmkit.format_version";
constexpr const char* kFormatVersion = "1";

StDType st_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return StDType::F32;
    case DType::f16:
      return StDType::F16;
    case DType::bf16:
      return StDType::BF16;
  }
  return StDType::F32;
}

template <class T>
StTensor part(const std::string& name, StDType dtype, std::vector<int64_t> shape, const T* data, std::size_t bytes) {
  StTensor t{name, dtype, std::move(shape), {}};
  const auto* p = reinterpret_cast<const std::byte*>(data);
  t.data.assign(p, p + bytes);
  return t;
}

StTensor values_part(const std::string& name, const TypedBuffer& values, std::vector<int64_t> shape) {
  return part(name, st_dtype_of(values.dtype()), std::move(shape), values.data(), values.size_bytes());
}

// Reads the parts of one compressed weight, checking each one's dtype and shape against its description.
class PartReader {
 public:
  PartReader(const SafetensorsFile& file, const std::string& origin, const std::string& weight,
             std::set<std::string>& used)
      : file_(file), origin_(origin), weight_(weight), used_(used) {}

  const StTensor& get(const std::string& suffix, const std::vector<StDType>& dtypes,
                      const std::vector<int64_t>& shape) {
    const std::string name = weight_ + "." + suffix;
    const StTensor* t = file_.find(name);
    if (!t) fail("part '" + name + "' is missing");
    if (!used_.insert(name).second) fail("part '" + name + "' is claimed by two compressed weights");
    if (std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end())
      fail("part '" + name + "' has dtype " + st_dtype_name(t->dtype) + ", expected " + st_dtype_name(dtypes.front()));
    if (t->shape != shape)
      fail("part '" + name + "' has shape " + json(t->shape).dump() + ", expected " + json(shape).dump());
    return *t;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(ErrorCode::io_error, origin_ + ": compressed tensor '" + weight_ + "': " + what);
  }

 private:
  const SafetensorsFile& file_;
  const std::string& origin_;
  const std::string& weight_;
  std::set<std::string>& used_;
};

TypedBuffer buffer_from(const StTensor& t, DType dtype) {
  TypedBuffer b(dtype, t.data.size() / dtype_size(dtype));
  std::copy(t.data.begin(), t.data.end(), b.data());  // not memcpy: an empty part's data() is null
  return b;
}

template <class T>
std::vector<T> array_from(const StTensor& t) {
  std::vector<T> v(t.data.size() / sizeof(T));
  std::copy(t.data.begin(), t.data.end(), reinterpret_cast<std::byte*>(v.data()));
  return v;
}

int64_t get_int(const json& d, const char* key, PartReader& reader) {
  const auto it = d.find(key);
  constexpr int64_t kMaxParameter = 1 << 20;  // far above any V, N, M or tile side; keeps int casts exact
  if (it == d.end() || !it->is_number_integer()) reader.fail(std::string("description lacks integer '") + key + "'");
  const int64_t value = it->get<int64_t>();
  if (value < 0 || value > kMaxParameter) reader.fail(std::string("description's '") + key + "' is out of range");
  return value;
}

// The safetensors dtype of an 8-bit value part.
StDType st_dtype_of(QuantType type) {
  switch (type) {
    case QuantType::e4m3:
      return StDType::F8_E4M3;
    case QuantType::e5m2:
      return StDType::F8_E5M2;
    case QuantType::int8:
      return StDType::I8;
  }
  return StDType::U8;
}

// An N:M weight with 8-bit values: the N:M parts with 8-bit values, plus one fp32 scale per row.
QuantizedNmMatrix read_quantized_nm(const json& d, int64_t rows, int64_t cols, QuantType type, PartReader& reader) {
  QuantizedNmMatrix a;
  a.rows = rows, a.cols = cols;
  a.n = static_cast<int>(get_int(d, "n", reader)), a.m = static_cast<int>(get_int(d, "m", reader));
  check_nm_pattern(a.n, a.m);
  const int64_t per_row = a.groups() * a.n;
  a.values.type = type;
  a.values.codes = array_from<uint8_t>(reader.get("values", {st_dtype_of(type)}, {rows, per_row}));
  a.indices = array_from<uint8_t>(
      reader.get("indices", {StDType::U8},
                 {static_cast<int64_t>(packed_bytes(static_cast<std::size_t>(rows * per_row), a.index_bits()))}));
  a.scales = array_from<float>(reader.get("scales", {StDType::F32}, {rows}));
  validate(a);
  return a;
}

using CompressedWeight = std::variant<SparseMatrix, QuantizedNmMatrix>;

// The writer refuses what the reader would refuse: a file nmkit cannot read back is not written.
void check_stored_shape(const std::string& name, int64_t rows, int64_t cols) {
  try {
    check_compressed_shape(rows, cols);
  } catch (const Error& e) {
    throw Error(e.code(), "compressed weight '" + name + "': " + e.what());
  }
}

CompressedWeight read_compressed(const SafetensorsFile& file, const std::string& origin, const std::string& name,
                                 const std::string& description, std::set<std::string>& used) {
  PartReader reader(file, origin, name, used);
  const json d = json::parse(description, nullptr, false);
  if (d.is_discarded() || !d.is_object()) reader.fail("description is not a JSON object");
  const auto format_it = d.find("format");
  if (format_it == d.end() || !format_it->is_string()) reader.fail("description lacks a string 'format'");
  const auto shape_it = d.find("shape");
  if (shape_it == d.end() || !shape_it->is_array() || shape_it->size() != 2 || !(*shape_it)[0].is_number_unsigned() ||
      !(*shape_it)[1].is_number_unsigned())
    reader.fail("description's 'shape' must be two non-negative integers");
  const uint64_t rows_u = (*shape_it)[0].get<uint64_t>(), cols_u = (*shape_it)[1].get<uint64_t>();
  constexpr auto kMaxSide = static_cast<uint64_t>(kMaxCompressedSide);
  if (rows_u > kMaxSide || cols_u > kMaxSide)
    reader.fail("shape [" + std::to_string(rows_u) + ", " + std::to_string(cols_u) +
                "] is implausibly large (each side must be at most 2^24)");
  const auto rows = static_cast<int64_t>(rows_u), cols = static_cast<int64_t>(cols_u);
  const auto dtype_it = d.find("dtype");
  if (dtype_it == d.end() || !dtype_it->is_string()) reader.fail("description lacks a string 'dtype'");
  const std::string format = format_it->get<std::string>();
  const std::string dtype_text = dtype_it->get<std::string>();
  if (is_quant_type_name(dtype_text)) {
    if (format != "nm")
      reader.fail("8-bit values (dtype '" + dtype_text + "') are stored for format nm only, not '" + format + "'");
    try {
      return read_quantized_nm(d, rows, cols, parse_quant_type(dtype_text), reader);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::io_error) throw;
      reader.fail(e.what());
    }
  }
  DType dtype;
  try {
    dtype = parse_dtype(dtype_text);
  } catch (const Error& e) {
    reader.fail(std::string(e.what()) + " or an 8-bit type (e4m3, e5m2, int8)");
  }
  const std::vector<StDType> value_dtype{st_dtype_of(dtype)};

  try {
    if (format == "nm") {
      NmMatrix a;
      a.rows = rows, a.cols = cols;
      a.n = static_cast<int>(get_int(d, "n", reader)), a.m = static_cast<int>(get_int(d, "m", reader));
      check_nm_pattern(a.n, a.m);
      const int64_t per_row = a.groups() * a.n;
      a.values = buffer_from(reader.get("values", value_dtype, {rows, per_row}), dtype);
      a.indices = array_from<uint8_t>(
          reader.get("indices", {StDType::U8},
                     {static_cast<int64_t>(packed_bytes(static_cast<std::size_t>(rows * per_row), a.index_bits()))}));
      validate(a);
      return a;
    }
    if (format == "vnm") {
      VnmMatrix a;
      a.rows = rows, a.cols = cols;
      a.v = static_cast<int>(get_int(d, "v", reader)), a.n = static_cast<int>(get_int(d, "n", reader));
      a.m = static_cast<int>(get_int(d, "m", reader));
      check_vnm_pattern(a.v, a.n, a.m);
      const int64_t per_row = a.groups() * a.n;
      a.values = buffer_from(reader.get("values", value_dtype, {rows, per_row}), dtype);
      a.m_indices = array_from<uint8_t>(
          reader.get("m_indices", {StDType::U8},
                     {static_cast<int64_t>(packed_bytes(static_cast<std::size_t>(rows * per_row), kVnmMIndexBits))}));
      a.column_loc = array_from<uint8_t>(
          reader.get("column_loc", {StDType::U8}, {a.row_blocks(), a.groups(), int64_t{kVnmSelectedColumns}}));
      validate(a);
      return a;
    }
    if (format == "tile") {
      TileMatrix a;
      a.rows = rows, a.cols = cols;
      a.tile_rows = static_cast<int>(get_int(d, "tile_rows", reader));
      a.tile_cols = static_cast<int>(get_int(d, "tile_cols", reader));
      check_tile_shape(a.tile_rows, a.tile_cols);
      a.ptr = array_from<int32_t>(reader.get("ptr", {StDType::I32}, {a.grid_cols() + 1}));
      // The stored tiles' count comes from the indices part itself (one per tile), so its rank is checked first.
      const StTensor* indices = file.find(name + ".indices");
      if (indices && indices->shape.size() != 1)
        reader.fail("part '" + name + ".indices' has shape " + json(indices->shape).dump() +
                    ", expected one dimension [stored tiles]");
      const int64_t nnz = indices ? indices->shape[0] : 0;
      a.indices = array_from<int32_t>(reader.get("indices", {StDType::I32}, {nnz}));
      a.data = buffer_from(reader.get("data", value_dtype, {nnz, a.tile_rows, a.tile_cols}), dtype);
      validate(a);
      return a;
    }
  } catch (const Error& e) {
    if (e.code() == ErrorCode::io_error) throw;
    reader.fail(e.what());
  }
  reader.fail("unknown format '" + format + "' (expected nm, vnm or tile)");
}

}  // namespace

void check_compressed_shape(int64_t rows, int64_t cols) {
  require(rows <= kMaxCompressedSide && cols <= kMaxCompressedSide, ErrorCode::invalid_argument, [&] {
    return "shape [" + std::to_string(rows) + ", " + std::to_string(cols) +
           "] has a side over 2^24, the most a compressed weight in a model file may have";
  });
}

ModelFile model_from_safetensors(const SafetensorsFile& file, const std::string& origin) {
  ModelFile model;
  std::set<std::string> used;
  std::map<std::string, CompressedWeight> compressed;
  for (const auto& [key, value] : file.metadata) {
    if (key.rfind(kDescriptionPrefix, 0) == 0) {
      const std::string name = key.substr(std::strlen(kDescriptionPrefix));
      if (file.find(name))
        throw Error(ErrorCode::io_error, origin + ": '" + name +
                                             "' is both a dense tensor and a compressed weight (metadata key '" + key +
                                             "'); a name may stand for one weight only");
      compressed.emplace(name, read_compressed(file, origin, name, value, used));
    } else if (key == kFormatVersionKey) {
      if (value != kFormatVersion)
        throw Error(ErrorCode::io_error, origin + ": nmkit format version '" + value + "' is not supported (expected " +
                                             kFormatVersion + ")");
    } else {
      model.metadata[key] = value;
    }
  }
  // Weights in file order; a compressed weight stands where its first part is.
  std::set<std::string> emitted;
  for (const auto& t : file.tensors) {
    if (!used.count(t.name)) {
      model.weights.push_back({t.name, t});
      continue;
    }
    const std::string owner = t.name.substr(0, t.name.rfind('.'));
    if (emitted.insert(owner).second)
      std::visit([&](auto&& c) { model.weights.push_back({owner, std::move(c)}); }, std::move(compressed.at(owner)));
  }
  return model;
}

ModelFile load_model(const std::string& path) { return model_from_safetensors(read_safetensors(path), path); }

SafetensorsFile model_to_safetensors(const ModelFile& model) {
  SafetensorsFile file;
  file.metadata = model.metadata;
  file.metadata[kFormatVersionKey] = kFormatVersion;
  std::set<std::string> names;
  for (const auto& w : model.weights)
    require(names.insert(w.name).second, ErrorCode::invalid_argument,
            [&] { return "two weights are named '" + w.name + "'; a model file holds one weight per name"; });
  for (const auto& w : model.weights) {
    std::visit(
        overloaded{
            [&](const StTensor& t) {
              StTensor copy = t;
              copy.name = w.name;
              file.tensors.push_back(std::move(copy));
            },
            [&](const SparseMatrix& s) {
              validate(s);
              check_stored_shape(w.name, rows_of(s), cols_of(s));
              json d = {{"shape", {rows_of(s), cols_of(s)}}, {"dtype", dtype_name(dtype_of(s))}};
              std::visit(
                  overloaded{
                      [&](const NmMatrix& a) {
                        d["format"] = "nm", d["n"] = a.n, d["m"] = a.m;
                        file.tensors.push_back(values_part(w.name + ".values", a.values, {a.rows, a.groups() * a.n}));
                        file.tensors.push_back(part(w.name + ".indices", StDType::U8,
                                                    {static_cast<int64_t>(a.indices.size())}, a.indices.data(),
                                                    a.indices.size()));
                      },
                      [&](const VnmMatrix& a) {
                        d["format"] = "vnm", d["v"] = a.v, d["n"] = a.n, d["m"] = a.m;
                        file.tensors.push_back(values_part(w.name + ".values", a.values, {a.rows, a.groups() * a.n}));
                        file.tensors.push_back(part(w.name + ".m_indices", StDType::U8,
                                                    {static_cast<int64_t>(a.m_indices.size())}, a.m_indices.data(),
                                                    a.m_indices.size()));
                        file.tensors.push_back(part(w.name + ".column_loc", StDType::U8,
                                                    {a.row_blocks(), a.groups(), int64_t{kVnmSelectedColumns}},
                                                    a.column_loc.data(), a.column_loc.size()));
                      },
                      [&](const TileMatrix& a) {
                        d["format"] = "tile", d["tile_rows"] = a.tile_rows, d["tile_cols"] = a.tile_cols;
                        file.tensors.push_back(part(w.name + ".ptr", StDType::I32, {static_cast<int64_t>(a.ptr.size())},
                                                    a.ptr.data(), a.ptr.size() * sizeof(int32_t)));
                        file.tensors.push_back(part(w.name + ".indices", StDType::I32,
                                                    {static_cast<int64_t>(a.indices.size())}, a.indices.data(),
                                                    a.indices.size() * sizeof(int32_t)));
                        file.tensors.push_back(
                            values_part(w.name + ".data", a.data, {a.nnz_tiles(), a.tile_rows, a.tile_cols}));
                      },
                  },
                  s);
              file.metadata[kDescriptionPrefix + w.name] = d.dump();
            },
            [&](const QuantizedNmMatrix& a) {
              validate(a);
              check_stored_shape(w.name, a.rows, a.cols);
              const json d = {{"format", "nm"},
                              {"shape", {a.rows, a.cols}},
                              {"dtype", quant_type_name(a.type())},
                              {"n", a.n},
                              {"m", a.m}};
              file.tensors.push_back(part(w.name + ".values", st_dtype_of(a.type()), {a.rows, a.groups() * a.n},
                                          a.values.codes.data(), a.values.codes.size()));
              file.tensors.push_back(part(w.name + ".indices", StDType::U8, {static_cast<int64_t>(a.indices.size())},
                                          a.indices.data(), a.indices.size()));
              file.tensors.push_back(
                  part(w.name + ".scales", StDType::F32, {a.rows}, a.scales.data(), a.scales.size() * sizeof(float)));
              file.metadata[kDescriptionPrefix + w.name] = d.dump();
            },
        },
        w.weight);
  }
  return file;
}

void save_model(const std::string& path, const ModelFile& model) {
  write_safetensors(path, model_to_safetensors(model));
}

}  // namespace nmkit
