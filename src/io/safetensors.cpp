#include "nmkit/io/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "nmkit/error.hpp"
#include "nmkit/io/output_file.hpp"

namespace nmkit {
namespace {

using json = nlohmann::json;

constexpr std::size_t kHeaderLengthBytes = 8;
constexpr std::size_t kHeaderAlignment = 8;  // the header is padded with spaces to keep data aligned
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeInfo {
  StDType dtype;
  const char* name;
  std::size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {StDType::BOOL, "BOOL", 1}, {StDType::U8, "U8", 1},           {StDType::I8, "I8", 1},
    {StDType::U16, "U16", 2},   {StDType::I16, "I16", 2},         {StDType::F16, "F16", 2},
    {StDType::BF16, "BF16", 2}, {StDType::U32, "U32", 4},         {StDType::I32, "I32", 4},
    {StDType::F32, "F32", 4},   {StDType::U64, "U64", 8},         {StDType::I64, "I64", 8},
    {StDType::F64, "F64", 8},   {StDType::F8_E4M3, "F8_E4M3", 1}, {StDType::F8_E5M2, "F8_E5M2", 1},
};

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw Error(ErrorCode::io_error, origin + ": " + what);
}

std::string tensor_ctx(const std::string& name) { return "tensor '" + name + "'"; }

}  // namespace

const char* st_dtype_name(StDType dtype) noexcept {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.name;
  return "?";
}

std::size_t st_dtype_size(StDType dtype) noexcept {
  for (const auto& info : kDTypes)
    if (info.dtype == dtype) return info.size;
  return 0;
}

int64_t StTensor::numel() const noexcept {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const StTensor* SafetensorsFile::find(const std::string& name) const noexcept {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

SafetensorsFile parse_safetensors(std::span<const std::byte> file, const std::string& origin,
                                  const SafetensorsLimits& limits) {
  if (file.size() < kHeaderLengthBytes)
    fail(origin, "file too short for a safetensors header (" + std::to_string(file.size()) + " bytes)");
  uint64_t header_len = 0;
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i) header_len |= static_cast<uint64_t>(file[i]) << (8 * i);
  if (header_len > limits.max_header_bytes)
    fail(origin, "header length " + std::to_string(header_len) + " exceeds the limit of " +
                     std::to_string(limits.max_header_bytes) + " bytes");
  if (header_len > file.size() - kHeaderLengthBytes)
    fail(origin, "header length " + std::to_string(header_len) + " runs past the end of the file (" +
                     std::to_string(file.size()) + " bytes): truncated or not a safetensors file");
  const char* header_begin = reinterpret_cast<const char*>(file.data() + kHeaderLengthBytes);
  // JSON keeps the last of repeated keys silently; a header naming a tensor twice is lying, so count them.
  std::set<std::string> top_level_keys;
  std::string repeated_key;
  const json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !top_level_keys.insert(parsed.get<std::string>()).second &&
        repeated_key.empty())
      repeated_key = parsed.get<std::string>();
    return true;
  };
  const json header = json::parse(header_begin, header_begin + header_len, note_keys, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) fail(origin, "header is not a JSON object");
  if (!repeated_key.empty()) fail(origin, "header names '" + repeated_key + "' more than once");

  const std::span<const std::byte> data = file.subspan(kHeaderLengthBytes + header_len);
  SafetensorsFile out;
  struct Range {
    uint64_t begin, end;
    std::size_t tensor;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) fail(origin, "__metadata__ is not a JSON object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) fail(origin, "__metadata__ value of '" + key + "' is not a string");
        out.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    const std::string ctx = tensor_ctx(name);
    if (!entry.is_object()) fail(origin, ctx + ": entry is not a JSON object");
    StTensor tensor;
    tensor.name = name;
    const auto dtype_it = entry.find("dtype");
    if (dtype_it == entry.end() || !dtype_it->is_string()) fail(origin, ctx + ": missing or non-string dtype");
    const std::string dtype_name = dtype_it->get<std::string>();
    const auto* info =
        std::find_if(std::begin(kDTypes), std::end(kDTypes), [&](const DTypeInfo& d) { return dtype_name == d.name; });
    if (info == std::end(kDTypes)) fail(origin, ctx + ": unknown dtype '" + dtype_name + "'");
    tensor.dtype = info->dtype;

    const auto shape_it = entry.find("shape");
    if (shape_it == entry.end() || !shape_it->is_array()) fail(origin, ctx + ": missing or non-array shape");
    // The product of the non-zero dimensions must fit in int64_t: it bounds every partial product, so that
    // numel() (int64_t, any zero dimension last) cannot overflow even when a zero makes the element count 0.
    uint64_t numel = 1, nonzero_product = 1;
    for (const auto& dim : *shape_it) {
      if (!dim.is_number_unsigned()) fail(origin, ctx + ": shape holds a value that is not a non-negative integer");
      const uint64_t d = dim.get<uint64_t>();
      if (d != 0 && nonzero_product > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / d)
        fail(origin, ctx + ": shape overflows 64 bits (its non-zero dimensions multiply past 2^63 - 1)");
      if (d != 0) nonzero_product *= d;
      numel *= d;
      tensor.shape.push_back(static_cast<int64_t>(d));
    }
    if (numel > std::numeric_limits<uint64_t>::max() / info->size) fail(origin, ctx + ": byte size overflows 64 bits");
    const uint64_t nbytes = numel * info->size;

    const auto offsets_it = entry.find("data_offsets");
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned())
      fail(origin, ctx + ": data_offsets must be two non-negative integers");
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>(), end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end)
      fail(origin, ctx + ": data_offsets begin " + std::to_string(begin) + " > end " + std::to_string(end));
    if (end > data.size())
      fail(origin, ctx + ": data_offsets end " + std::to_string(end) + " is past the data section (" +
                       std::to_string(data.size()) + " bytes): truncated file or lying header");
    if (end - begin != nbytes)
      fail(origin, ctx + ": holds " + std::to_string(end - begin) + " bytes but dtype " + dtype_name +
                       " and shape need " + std::to_string(nbytes));
    ranges.push_back({begin, end, out.tensors.size()});
    out.tensors.push_back(std::move(tensor));
  }

  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  // An empty tensor holds no bytes, so it overlaps nothing, wherever its offsets point (the writer gives it the
  // offset of the tensor after it).
  const Range* previous = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (previous != nullptr && r.begin < previous->end)
      fail(origin, "tensors '" + out.tensors[previous->tensor].name + "' and '" + out.tensors[r.tensor].name +
                       "' overlap in the data section");
    previous = &r;
  }
  for (const Range& r : ranges) {
    auto& t = out.tensors[r.tensor];
    t.data.assign(data.begin() + static_cast<std::ptrdiff_t>(r.begin),
                  data.begin() + static_cast<std::ptrdiff_t>(r.end));
  }
  // File order: by data offset, as the writer laid them out.
  std::vector<StTensor> ordered;
  ordered.reserve(ranges.size());
  for (const Range& r : ranges) ordered.push_back(std::move(out.tensors[r.tensor]));
  out.tensors = std::move(ordered);
  return out;
}

SafetensorsFile read_safetensors(const std::string& path, const SafetensorsLimits& limits) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error(ErrorCode::io_error, path + ": is a directory, not a safetensors file");
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(ErrorCode::io_error, path + ": cannot open for reading: " + std::strerror(errno));
  const std::streamoff size = in.tellg();
  if (size < 0) throw Error(ErrorCode::io_error, path + ": cannot determine the file size");
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size)) throw Error(ErrorCode::io_error, path + ": read failed");
  return parse_safetensors(bytes, path, limits);
}

std::vector<std::byte> serialize_safetensors(const SafetensorsFile& file) {
  json header = json::object();
  if (!file.metadata.empty()) header[kMetadataKey] = file.metadata;
  uint64_t offset = 0;
  for (const auto& t : file.tensors) {
    require(t.name != kMetadataKey, ErrorCode::invalid_argument, "a tensor cannot be named __metadata__");
    require(!header.contains(t.name), ErrorCode::invalid_argument, "duplicate tensor name '" + t.name + "'");
    int64_t numel = 1;
    for (int64_t d : t.shape) {
      require(d >= 0, ErrorCode::invalid_argument, "tensor '" + t.name + "' has a negative dimension");
      numel *= d;
    }
    require(static_cast<uint64_t>(numel) * st_dtype_size(t.dtype) == t.data.size(), ErrorCode::invalid_argument,
            "tensor '" + t.name + "' holds " + std::to_string(t.data.size()) + " bytes, its dtype and shape need " +
                std::to_string(static_cast<uint64_t>(numel) * st_dtype_size(t.dtype)));
    header[t.name] = {
        {"dtype", st_dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((kHeaderAlignment - text.size() % kHeaderAlignment) % kHeaderAlignment, ' ');
  std::vector<std::byte> out(kHeaderLengthBytes + text.size() + offset);
  for (std::size_t i = 0; i < kHeaderLengthBytes; ++i) out[i] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xff);
  std::memcpy(out.data() + kHeaderLengthBytes, text.data(), text.size());
  std::byte* p = out.data() + kHeaderLengthBytes + text.size();
  for (const auto& t : file.tensors) p = std::copy(t.data.begin(), t.data.end(), p);
  return out;
}

void write_safetensors(const std::string& path, const SafetensorsFile& file) {
  write_file_atomically(path, serialize_safetensors(file));
}

DenseMatrix to_dense_matrix(const StTensor& tensor) {
  require(tensor.shape.size() == 2, ErrorCode::invalid_argument,
          "tensor '" + tensor.name + "' is " + std::to_string(tensor.shape.size()) + "-D, a matrix must be 2-D");
  DType dtype;
  switch (tensor.dtype) {
    case StDType::F32:
      dtype = DType::f32;
      break;
    case StDType::F16:
      dtype = DType::f16;
      break;
    case StDType::BF16:
      dtype = DType::bf16;
      break;
    default:
      throw Error(ErrorCode::unsupported, "tensor '" + tensor.name + "' has dtype " + st_dtype_name(tensor.dtype) +
                                              "; matrices must be F32, F16 or BF16");
  }
  DenseMatrix m = DenseMatrix::zeros(tensor.shape[0], tensor.shape[1], dtype);
  require(tensor.data.size() == m.values.size_bytes(), ErrorCode::invalid_argument,
          "tensor '" + tensor.name + "' holds " + std::to_string(tensor.data.size()) + " bytes, its shape needs " +
              std::to_string(m.values.size_bytes()));
  std::copy(tensor.data.begin(), tensor.data.end(), m.values.data());  // not memcpy: an empty tensor's data() is null
  return m;
}

StTensor to_tensor(const std::string& name, const DenseMatrix& matrix) {
  static constexpr StDType kMap[] = {StDType::F32, StDType::F16, StDType::BF16};
  StTensor t{name, kMap[static_cast<int>(matrix.dtype())], {matrix.rows, matrix.cols}, {}};
  t.data.assign(matrix.values.data(), matrix.values.data() + matrix.values.size_bytes());
  return t;
}

}  // namespace nmkit
