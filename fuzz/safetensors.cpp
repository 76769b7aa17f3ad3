// libFuzzer harness: the safetensors reader (parse_safetensors, the one parser read_safetensors uses too).
// nmkit::Error from the parser is the expected outcome. A file it accepts must be self-consistent (every tensor's
// bytes match its dtype and shape, numel() does not overflow), must serialize and parse back to the same tensors and
// metadata, and its 2-D float tensors must convert to dense matrices; an Error there is a failure.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "fuzz_util.hpp"
#include "nmkit/error.hpp"
#include "nmkit/io/safetensors.hpp"

namespace {

using namespace nmkit;

void check_tensor(const StTensor& t) {
  const int64_t numel = t.numel();
  fuzz::check(numel >= 0, "accepted a tensor whose element count is negative");
  fuzz::check(st_dtype_size(t.dtype) != 0, "accepted a tensor of an unknown dtype");
  fuzz::check(static_cast<uint64_t>(numel) * st_dtype_size(t.dtype) == t.data.size(),
              "accepted a tensor whose bytes differ from its dtype and shape");
  if (t.shape.size() == 2 && (t.dtype == StDType::F32 || t.dtype == StDType::F16 || t.dtype == StDType::BF16)) {
    const DenseMatrix m = to_dense_matrix(t);
    fuzz::check(m.values.size_bytes() == t.data.size(), "to_dense_matrix changed the tensor's size");
  }
}

void check_loaded(const SafetensorsFile& file) {
  for (const StTensor& t : file.tensors) check_tensor(t);

  // Round trip: what was accepted is written and read back unchanged (zero-size tensors may share an offset, so
  // their relative order is not part of the comparison).
  const SafetensorsFile back = parse_safetensors(serialize_safetensors(file), "round-trip");
  fuzz::check(back.metadata == file.metadata, "metadata changed in a round trip");
  fuzz::check(back.tensors.size() == file.tensors.size(), "tensor count changed in a round trip");
  for (const StTensor& t : file.tensors) {
    const StTensor* u = back.find(t.name);
    fuzz::check(u != nullptr, "a tensor was lost in a round trip");
    fuzz::check(u->dtype == t.dtype && u->shape == t.shape && u->data == t.data, "a tensor changed in a round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  nmkit::fuzz::accept_then_use([&] { return parse_safetensors(bytes, "fuzz.safetensors"); },
                               [](const SafetensorsFile& f) { check_loaded(f); });
  return 0;
}
