// libFuzzer harness: the compressed-tensor loader (model_from_safetensors over a parsed file: the nm / vnm / tile
// descriptions under "nmkit:<name>" and their parts, 8-bit N:M included). nmkit::Error from the reader or the loader is
// the expected outcome. Whatever they accept must be safe to use, and an Error there is a failure: every compressed
// weight passes validate() and decompresses (where its dense form has at most 2^24 elements) to a matrix of its shape
// and dtype that compresses back to the same values, and the model saves and loads again.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fuzz_util.hpp"
#include "nmkit/error.hpp"
#include "nmkit/io/model.hpp"

namespace {

using namespace nmkit;

FormatSpec spec_of(const SparseMatrix& s) {
  if (const auto* a = std::get_if<NmMatrix>(&s)) return NmSpec{a->n, a->m};
  if (const auto* a = std::get_if<VnmMatrix>(&s)) return VnmSpec{a->v, a->n, a->m};
  const auto& a = std::get<TileMatrix>(s);
  return TileSpec{a.tile_rows, a.tile_cols, 1.0};
}

void check_compressed(const SparseMatrix& s) {
  validate(s);
  fuzz::check(rows_of(s) >= 0 && cols_of(s) >= 0, "loaded a compressed weight of negative shape");
  (void)format_name(s);
  (void)storage_bytes(s);
  (void)format_density(s);
  if (!fuzz::dense_fits(rows_of(s), cols_of(s))) return;
  const DenseMatrix dense = decompress(s);
  fuzz::check(dense.rows == rows_of(s) && dense.cols == cols_of(s) && dense.dtype() == dtype_of(s),
              "decompress gave the wrong shape or dtype");
  // The dense matrix satisfies the pattern it came from, so it compresses again, to the same matrix.
  const SparseMatrix again = compress(dense, spec_of(s));
  fuzz::check_same_dense(decompress(again), dense, "decompress(compress(decompress(w))) differs from decompress(w)");
}

// An 8-bit N:M weight: valid codes and scales, so its dequantized form is finite and keeps the N:M pattern.
void check_quantized(const QuantizedNmMatrix& q) {
  validate(q);
  (void)format_name(q);
  (void)storage_bytes(q);
  (void)format_density(q);
  if (!fuzz::dense_fits(q.rows, q.cols)) return;
  const DenseMatrix dense = decompress(q);
  fuzz::check(dense.rows == q.rows && dense.cols == q.cols, "dequantizing gave the wrong shape");
  for (std::size_t i = 0; i < dense.values.size(); ++i)
    fuzz::check(std::isfinite(dense.values.get(i)), "a valid 8-bit weight dequantized to a non-finite value");
  const SparseMatrix again = compress(dense, NmSpec{q.n, q.m});
  fuzz::check_same_dense(decompress(again), dense, "a dequantized 8-bit weight does not compress back to N:M");
}

void check_loaded(const ModelFile& model) {
  for (const NamedWeight& w : model.weights) {
    if (const auto* s = std::get_if<SparseMatrix>(&w.weight)) check_compressed(*s);
    if (const auto* q = std::get_if<QuantizedNmMatrix>(&w.weight)) check_quantized(*q);
  }

  // What was loaded saves and loads again, to the same weights (zero-size tensors may share an offset, so the
  // order of weights is not part of the comparison).
  const SafetensorsFile written = parse_safetensors(serialize_safetensors(model_to_safetensors(model)), "round-trip");
  const ModelFile back = model_from_safetensors(written, "round-trip");
  fuzz::check(back.metadata == model.metadata, "metadata changed in a save/load round trip");
  const auto names = [](const ModelFile& m) {
    std::vector<std::pair<std::string, std::size_t>> out;  // (name, dense 0, compressed 1 or 8-bit N:M 2)
    for (const NamedWeight& w : m.weights) out.emplace_back(w.name, w.weight.index());
    std::sort(out.begin(), out.end());
    return out;
  };
  fuzz::check(names(back) == names(model), "the weights changed in a save/load round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  nmkit::fuzz::accept_then_use(
      [&] { return model_from_safetensors(parse_safetensors(bytes, "fuzz.safetensors"), "fuzz.safetensors"); },
      [](const ModelFile& m) { check_loaded(m); });
  return 0;
}
