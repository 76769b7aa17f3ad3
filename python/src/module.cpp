// nmkit._nmkit: the nanobind extension behind the nmkit Python package. Thin: it converts arrays and strings,
// calls the library, and turns nmkit::Error into Python exceptions. The Python layer (nmkit/__init__.py,
// nmkit/torch.py) holds the user-facing API and checks tensors before their pointers reach run().
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/variant.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/device.hpp"
#include "nmkit/error.hpp"
#include "nmkit/format/quantized.hpp"
#include "nmkit/format/spec.hpp"
#include "nmkit/io/model.hpp"
#include "nmkit/prune/magnitude.hpp"
#include "nmkit/prune/method.hpp"
#include "nmkit/prune/obs.hpp"
#include "nmkit/prune/select.hpp"
#include "nmkit/prune/wanda.hpp"
#ifdef NMKIT_PYTHON_CUDA
#include "nmkit/attention/dfss_gpu.hpp"
#include "nmkit/gpu/sparse_linear.hpp"
#endif

namespace nb = nanobind;
using namespace nb::literals;

namespace nmkit::python {
namespace {

using HostMatrix = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using HostVector = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using NumpyMatrix = nb::ndarray<nb::numpy, float, nb::ndim<2>>;
using NumpyVector = nb::ndarray<nb::numpy, float, nb::ndim<1>>;

// A compressed weight in its logical format (docs/formats.md) and, when it came from pruning, the energy kept.
struct SparseWeight {
  SparseMatrix matrix;
  std::optional<double> energy;
};

// An N:M weight with 8-bit values and an fp32 scale per row (docs/formats.md, "N:M with 8-bit values"), and the
// energy its pruning kept (measured before quantization).
struct QuantizedWeight {
  QuantizedNmMatrix matrix;
  std::optional<double> energy;
};

#ifdef NMKIT_PYTHON_CUDA
// A run's layouts from nmkit.torch's flags: x given as x^T (rows ldx apart), y written as y^T.
gpu::RunLayout run_layout(bool x_features, int64_t ldx, bool y_features) {
  const auto layout = [](bool features) {
    return features ? gpu::ActivationLayout::feature_major : gpu::ActivationLayout::token_major;
  };
  return {layout(x_features), layout(y_features), ldx};
}
#endif

// What pruning and compression return: float values (f32, f16, bf16) or 8-bit ones.
using AnyWeight = std::variant<SparseWeight, QuantizedWeight>;

// How the kept values are stored: in `dtype`, or (for an 8-bit `quantize`) quantized per row from f32 values.
struct ValueStorage {
  DType dtype = DType::f32;
  std::optional<QuantType> quantize;
};

// The storage `name` asks for, checked against `spec` before anything is pruned: 8-bit types for N:M only, in the
// CLI's words (tools/nmkit/cmd_prune.cpp, src/prune/prune_model.cpp).
ValueStorage parse_value_storage(const std::string& name, const FormatSpec& spec) {
  if (is_quant_type_name(name)) {
    const QuantType type = parse_quant_type(name);
    require(std::holds_alternative<NmSpec>(spec), ErrorCode::unsupported,
            std::string("8-bit values (") + quant_type_name(type) +
                ") are supported for N:M formats only (2:4, N:M), not " + to_string(spec));
    return {DType::f32, type};
  }
  try {
    return {parse_dtype(name), std::nullopt};
  } catch (const Error&) {
    throw Error(ErrorCode::invalid_argument,
                "unknown dtype '" + name + "' (expected f32, f16, bf16, or 8-bit: fp8 (= e4m3), e5m2, int8)");
  }
}

// The pruned (or compressed) weight with its values stored as `storage` asks: converted, or quantized per row.
AnyWeight store_values(SparseMatrix compressed, std::optional<double> energy, const ValueStorage& storage) {
  if (storage.quantize) return QuantizedWeight{quantize_nm(std::get<NmMatrix>(compressed), *storage.quantize), energy};
  if (dtype_of(compressed) != storage.dtype) compressed = convert_values(compressed, storage.dtype);
  return SparseWeight{std::move(compressed), energy};
}

// A float32 numpy array that owns `values` (rows x cols, row-major).
NumpyMatrix to_numpy(std::vector<float> values, int64_t rows, int64_t cols) {
  auto* owned = new std::vector<float>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return NumpyMatrix(owned->data(), {static_cast<size_t>(rows), static_cast<size_t>(cols)}, owner);
}

// A weight (SparseWeight or QuantizedWeight, dequantized) expanded to a dense float32 array, without the GIL: seconds
// for a large weight, during which other threads' pruning goes on.
template <class Weight>
NumpyMatrix dense_array(const Weight& w) {
  std::vector<float> values;
  int64_t rows = 0, cols = 0;
  {
    nb::gil_scoped_release released;
    const DenseMatrix d = decompress(w.matrix);
    values = d.to_float();
    rows = d.rows;
    cols = d.cols;
  }
  return to_numpy(std::move(values), rows, cols);
}

NumpyVector to_numpy(std::vector<float> values) {
  auto* owned = new std::vector<float>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return NumpyVector(owned->data(), {owned->size()}, owner);
}

// The weight rounded to `dtype`. Values that would overflow are refused (from_float); non-zero values that round
// to zero are reported: a RuntimeWarning with their count, or ValueError when no non-zero value survives (the
// weight would be stored, and its energy measured, as all zeros).
DenseMatrix to_dense_matrix(const HostMatrix& weight, DType dtype) {
  const auto rows = static_cast<int64_t>(weight.shape(0)), cols = static_cast<int64_t>(weight.shape(1));
  const std::span<const float> values(weight.data(), weight.size());
  require_finite(values, cols, "weight");
  DenseMatrix dense = DenseMatrix::from_float(rows, cols, values, dtype);
  if (const int64_t flushed = count_flushed_to_zero(values, dtype); flushed > 0) {
    const auto nonzero =
        static_cast<int64_t>(std::count_if(values.begin(), values.end(), [](float v) { return v != 0.0f; }));
    const std::string what = std::to_string(flushed) + " of the weight's " + std::to_string(nonzero) +
                             " non-zero values are below " + dtype_name(dtype) +
                             "'s smallest subnormal and round to zero";
    require(flushed < nonzero, ErrorCode::invalid_argument,
            what + ": nothing would be kept; store as f32 or scale the weight");
    if (PyErr_WarnEx(PyExc_RuntimeWarning, (what + " (store as f32 to keep them)").c_str(), 1) != 0)
      throw nb::python_error();
  }
  return dense;
}

void translate_errors(const std::exception_ptr& p, void*) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    PyObject* type = PyExc_RuntimeError;  // cuda_error
    switch (e.code()) {
      case ErrorCode::invalid_argument:
      case ErrorCode::pattern_violation:
        type = PyExc_ValueError;
        break;
      case ErrorCode::unsupported:
        type = PyExc_NotImplementedError;
        break;
      case ErrorCode::io_error:
        type = PyExc_OSError;
        break;
      case ErrorCode::cuda_error:
        break;
    }
    PyErr_SetString(type, e.what());
  }
}

void bind_formats(nb::module_& m) {
  nb::class_<SparseWeight>(m, "SparseWeight",
                           "A pruned weight in nmkit's logical format (2:4 / N:M, vnm:V:N:M or tile:RxC).")
      .def_prop_ro("format", [](const SparseWeight& w) { return format_name(w.matrix); })
      .def_prop_ro("shape", [](const SparseWeight& w) { return std::make_tuple(rows_of(w.matrix), cols_of(w.matrix)); })
      .def_prop_ro("dtype", [](const SparseWeight& w) { return std::string(dtype_name(dtype_of(w.matrix))); })
      .def_prop_ro(
          "density", [](const SparseWeight& w) { return format_density(w.matrix); },
          "Fraction of the matrix's entries the compressed form keeps (N/M over whole groups; tail groups\n"
          "and edge tiles count only their entries inside the matrix), as `nmkit inspect` prints it.")
      .def_prop_ro(
          "storage_bytes", [](const SparseWeight& w) { return storage_bytes(w.matrix); },
          "Bytes of the compressed arrays (values and indices).")
      .def_prop_ro(
          "dense_bytes",
          [](const SparseWeight& w) {
            return static_cast<int64_t>(rows_of(w.matrix) * cols_of(w.matrix) * dtype_size(dtype_of(w.matrix)));
          })
      .def_prop_ro(
          "energy", [](const SparseWeight& w) { return w.energy; },
          "Kept L1 over total L1 of the weight it was pruned from (None when not pruned by nmkit).")
      .def("to_dense", &dense_array<SparseWeight>,
           "The weight expanded to a dense float32 array (pruned entries are zero).")
      .def(
          "astype",
          [](const SparseWeight& w, const std::string& dtype) {
            return SparseWeight{convert_values(w.matrix, parse_dtype(dtype)), w.energy};
          },
          "dtype"_a, "The same weight with its values rounded to `dtype` (f32, f16 or bf16).")
      .def(
          "validate", [](const SparseWeight& w) { validate(w.matrix); },
          "Checks every invariant of the format; raises ValueError naming the first violation.")
      .def("__repr__", [](const SparseWeight& w) {
        return "SparseWeight(format='" + format_name(w.matrix) + "', shape=(" + std::to_string(rows_of(w.matrix)) +
               ", " + std::to_string(cols_of(w.matrix)) + "), dtype=" + dtype_name(dtype_of(w.matrix)) + ")";
      });

  nb::class_<QuantizedWeight>(
      m, "QuantizedWeight",
      "A pruned N:M weight whose kept values are 8-bit codes (e4m3, e5m2 or int8) with an fp32\n"
      "scale per row: value = code * scales[row] (docs/formats.md).")
      .def_prop_ro("format", [](const QuantizedWeight& w) { return format_name(w.matrix); })
      .def_prop_ro("shape", [](const QuantizedWeight& w) { return std::make_tuple(w.matrix.rows, w.matrix.cols); })
      .def_prop_ro(
          "dtype", [](const QuantizedWeight& w) { return std::string(quant_type_name(w.matrix.type())); },
          "The codes' type: e4m3 (fp8), e5m2 or int8.")
      .def_prop_ro(
          "density", [](const QuantizedWeight& w) { return format_density(w.matrix); },
          "Fraction of the matrix's entries the compressed form keeps, as for SparseWeight.")
      .def_prop_ro(
          "storage_bytes", [](const QuantizedWeight& w) { return storage_bytes(w.matrix); },
          "Bytes of the compressed arrays: codes, indices and the fp32 scales.")
      .def_prop_ro(
          "dense_bytes", [](const QuantizedWeight& w) { return dense_storage_bytes(w.matrix); },
          "Bytes of the same weight dense at 8 bits with its scales (R * K + 4 R), as `nmkit inspect` compares.")
      .def_prop_ro(
          "energy", [](const QuantizedWeight& w) { return w.energy; },
          "Kept L1 over total L1 of the weight it was pruned from, before quantization (None when not pruned).")
      .def_prop_ro(
          "scales", [](const QuantizedWeight& w) { return to_numpy(w.matrix.scales); }, nb::rv_policy::move,
          "The per-row scales, float32 (R,): a row's largest |value| over the code type's largest (0 for a zero row).")
      .def("to_dense", &dense_array<QuantizedWeight>,
           "The weight dequantized (code * scale) and expanded to a dense float32 array (pruned entries are zero).")
      .def(
          "validate", [](const QuantizedWeight& w) { validate(w.matrix); },
          "Checks every invariant (N:M's, the codes and the scales); raises ValueError naming the first violation.")
      .def("__repr__", [](const QuantizedWeight& w) {
        return "QuantizedWeight(format='" + format_name(w.matrix) + "', shape=(" + std::to_string(w.matrix.rows) +
               ", " + std::to_string(w.matrix.cols) + "), dtype=" + quant_type_name(w.matrix.type()) + ")";
      });

  m.def(
      "prune",
      [](const HostMatrix& weight, const std::string& format, const std::string& dtype) {
        const FormatSpec spec = parse_format_spec(format);
        const ValueStorage storage = parse_value_storage(dtype, spec);
        DenseMatrix dense = to_dense_matrix(weight, storage.dtype);
        nb::gil_scoped_release released;  // pruning large weights takes seconds
        PruneResult r = prune_magnitude(dense, spec);
        return store_values(std::move(r.compressed), r.energy, storage);
      },
      "weight"_a, "format"_a, "dtype"_a,
      "Prunes a float32 (R, K) array by magnitude into `format` (\"2:4\", \"vnm:128:2:8\", \"tile:64x64:0.25\") and\n"
      "compresses it with values stored as `dtype` (f32, f16 or bf16: a SparseWeight; for N:M, fp8 (= e4m3), e5m2 or\n"
      "int8, quantized per row after pruning: a QuantizedWeight).");
  m.def(
      "compress",
      [](const HostMatrix& weight, const std::string& format, const std::string& dtype) {
        const FormatSpec spec = parse_format_spec(format);
        const ValueStorage storage = parse_value_storage(dtype, spec);
        return store_values(compress(to_dense_matrix(weight, storage.dtype), spec), std::nullopt, storage);
      },
      "weight"_a, "format"_a, "dtype"_a,
      "Compresses a float32 (R, K) array that already satisfies `format` (a tile spec's density is ignored: every\n"
      "tile holding a non-zero is kept). Raises ValueError naming the first row and group that break the pattern.");
  m.def(
      "spmm",
      [](const SparseWeight& a, const HostMatrix& b, std::optional<HostVector> bias, float alpha,
         const std::string& activation) {
        const int64_t rows = rows_of(a.matrix), k = cols_of(a.matrix);
        require(static_cast<int64_t>(b.shape(0)) == k, ErrorCode::invalid_argument,
                "spmm: B has " + std::to_string(b.shape(0)) + " rows, the weight " + std::to_string(k) + " columns");
        require(!bias || static_cast<int64_t>(bias->shape(0)) == rows, ErrorCode::invalid_argument,
                "spmm: the bias has " + std::to_string(bias ? bias->shape(0) : 0) + " values, the weight " +
                    std::to_string(rows) + " rows");
        const auto n = static_cast<int64_t>(b.shape(1));
        std::vector<float> d(static_cast<size_t>(rows * n));
        Epilogue epilogue{alpha, 0.0f, bias ? bias->data() : nullptr, parse_activation(activation)};
        {
          nb::gil_scoped_release released;
          spmm(a.matrix, ConstMatrixRef{b.data(), k, n}, ConstMatrixRef{}, MatrixRef{d.data(), rows, n}, epilogue);
        }
        return to_numpy(std::move(d), rows, n);
      },
      "a"_a, "b"_a, "bias"_a = nb::none(), "alpha"_a = 1.0f, "activation"_a = "none",
      "The CPU reference product act(alpha * A @ B + bias): A a SparseWeight (R, K), B float32 (K, C); returns\n"
      "float32 (R, C). The oracle nmkit's GPU kernels are tested against.");
  m.def(
      "load_file",
      [](const std::string& path, bool with_metadata) -> nb::object {
        // A directory reached the reader as a file and came back as a MemoryError (std::bad_alloc).
        std::error_code ignored;
        require(!std::filesystem::is_directory(path, ignored), ErrorCode::io_error,
                path + ": is a directory, not a file written by nmkit prune");
        ModelFile model = load_model(path);
        nb::dict out;
        for (NamedWeight& w : model.weights) {
          if (auto* q = std::get_if<QuantizedNmMatrix>(&w.weight))
            out[nb::str(w.name.c_str())] = nb::cast(QuantizedWeight{std::move(*q), std::nullopt});
          else if (auto* sparse = std::get_if<SparseMatrix>(&w.weight))
            out[nb::str(w.name.c_str())] = nb::cast(SparseWeight{std::move(*sparse), std::nullopt});
        }
        if (!with_metadata) return out;
        nb::dict metadata;
        for (const auto& [key, value] : model.metadata) metadata[nb::str(key.c_str())] = nb::str(value.c_str());
        return nb::make_tuple(out, metadata);
      },
      "path"_a, "with_metadata"_a = false,
      "The compressed weights of a file written by `nmkit prune`, by name, as SparseWeights or (8-bit values)\n"
      "QuantizedWeights (validated; dense tensors are left to the safetensors package); with_metadata: also the\n"
      "file's user metadata (str -> str), as a (weights, metadata) pair.");
}

void bind_device(nb::module_& m) {
  // For nmkit.torch, which checks a layer's arguments before it needs the device (and CUDA build) to make it.
  m.def(
      "_check_activation", [](const std::string& name) { return std::string(activation_name(parse_activation(name))); },
      "name"_a, "The activation's name if the kernels know it; ValueError naming the ones they know otherwise.");

  m.def("build_info", [] {
    const BuildInfo b = build_info();
    nb::dict d;
    d["version"] = b.version;
    d["cuda"] = b.cuda;
    d["cuda_architectures"] = b.cuda_architectures;
    d["compiler"] = b.compiler;
    return d;
  });
  m.def(
      "cuda_devices",
      [] {
        const DeviceQuery q = query_cuda_devices();
        nb::list devices;
        for (const DeviceInfo& d : q.devices)
          devices.append(
              nb::make_tuple(d.index, d.name, nb::make_tuple(d.cc_major, d.cc_minor), d.sm_count, d.memory_bytes));
        return nb::make_tuple(devices, q.why_none);
      },
      "([(index, name, (major, minor), sm_count, memory_bytes)], why_none): the CUDA devices this process sees.");

#ifdef NMKIT_PYTHON_CUDA
  nb::class_<gpu::SparseLinear>(m, "_SparseLinear")
      .def(nb::new_([](const SparseWeight& w, const std::string& activation, bool bias) {
             return gpu::SparseLinear::create(w.matrix, parse_activation(activation), bias);
           }),
           "weight"_a, "activation"_a = "none", "bias"_a = false)
      // An 8-bit 2:4 weight run on x and y of `dtype` (f16 or bf16), x quantized per token inside run().
      .def(nb::new_([](const QuantizedWeight& w, const std::string& activation, bool bias, const std::string& dtype) {
             return gpu::SparseLinear::create(w.matrix, parse_dtype(dtype), parse_activation(activation), bias);
           }),
           "weight"_a, "activation"_a, "bias"_a, "dtype"_a)
      // Raw device pointers and a cudaStream_t as integers: nmkit.torch checks the tensors they come from.
      .def(
          "run",
          [](gpu::SparseLinear& self, uintptr_t x, uintptr_t y, int64_t tokens, uintptr_t bias, uintptr_t stream) {
            self.run(reinterpret_cast<gpu::Stream>(stream), reinterpret_cast<const void*>(x),
                     reinterpret_cast<void*>(y), tokens, reinterpret_cast<const float*>(bias));
          },
          "x"_a, "y"_a, "tokens"_a, "bias"_a, "stream"_a)
      .def(
          "run_on",
          [](gpu::SparseLinear& self, uintptr_t x, uintptr_t y, int64_t tokens, uintptr_t bias, uintptr_t stream,
             uintptr_t workspace, std::size_t workspace_bytes, bool x_features, int64_t ldx, bool y_features) {
            self.run(reinterpret_cast<gpu::Stream>(stream), reinterpret_cast<const void*>(x),
                     reinterpret_cast<void*>(y), tokens, reinterpret_cast<const float*>(bias),
                     gpu::SparseLinear::Workspace{reinterpret_cast<void*>(workspace), workspace_bytes},
                     run_layout(x_features, ldx, y_features));
          },
          "x"_a, "y"_a, "tokens"_a, "bias"_a, "stream"_a, "workspace"_a, "workspace_bytes"_a, "x_features"_a = false,
          "ldx"_a = 0, "y_features"_a = false,
          "run() on the caller's scratch (workspace_bytes(tokens, ...) bytes at `workspace`, 16-byte aligned); "
          "x_features: x given as x^T [K, T] (rows ldx apart), y_features: y written as y^T [R, T].")
      .def(
          "workspace_bytes",
          [](const gpu::SparseLinear& self, int64_t tokens, bool x_features, int64_t ldx) {
            return self.workspace_bytes(tokens, run_layout(x_features, ldx, false));
          },
          "tokens"_a, "x_features"_a = false, "ldx"_a = 0)
      .def_prop_ro("reads_feature_major_in_place", &gpu::SparseLinear::reads_feature_major_in_place)
      .def(
          "run_quantized",
          [](gpu::SparseLinear& self, uintptr_t codes, uintptr_t scales, uintptr_t y, int64_t tokens, uintptr_t bias,
             uintptr_t stream) {
            self.run_quantized(reinterpret_cast<gpu::Stream>(stream), reinterpret_cast<const uint8_t*>(codes),
                               reinterpret_cast<const float*>(scales), reinterpret_cast<void*>(y), tokens,
                               reinterpret_cast<const float*>(bias));
          },
          "codes"_a, "scales"_a, "y"_a, "tokens"_a, "bias"_a, "stream"_a,
          "An 8-bit layer on x already quantized: tokens x K codes (16-byte aligned) and a float32 scale per token.")
      .def(
          "kernel",
          [](gpu::SparseLinear& self, int64_t tokens, bool x_features, int64_t ldx, bool y_features) {
            return self.kernel(tokens, run_layout(x_features, ldx, y_features));
          },
          "tokens"_a, "x_features"_a = false, "ldx"_a = 0, "y_features"_a = false)
      .def_prop_ro("in_features", &gpu::SparseLinear::in_features)
      .def_prop_ro("out_features", &gpu::SparseLinear::out_features)
      .def_prop_ro("dtype", [](const gpu::SparseLinear& s) { return std::string(dtype_name(s.dtype())); })
      .def_prop_ro("quantized",
                   [](const gpu::SparseLinear& s) -> std::optional<std::string> {
                     if (const auto type = s.quantized()) return std::string(quant_type_name(*type));
                     return std::nullopt;
                   })
      .def_prop_ro("activation",
                   [](const gpu::SparseLinear& s) { return std::string(activation_name(s.activation())); })
      .def_prop_ro("has_bias", &gpu::SparseLinear::has_bias)
      .def_prop_ro("format", &gpu::SparseLinear::format)
      .def_prop_ro("plans", &gpu::SparseLinear::plans);

  // Fused DFSS attention (nmkit/attention/dfss_gpu.hpp) on raw device pointers: nmkit.torch.dfss_attention checks the
  // tensors and passes their strides. A plan is made per call (create is host code: validation and the kernel's
  // configuration), so that nothing is cached across devices or shapes.
  using Strides = std::tuple<int64_t, int64_t, int64_t>;  // batch, head, token: elements
  m.def(
      "_attention",
      [](uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t lse, uintptr_t cu_seqlens_q,
         uintptr_t cu_seqlens_k, int64_t batch, int64_t heads, int64_t kv_heads, int64_t seq_q, int64_t seq_k,
         int64_t total_q, int64_t total_k, int head_dim, const std::string& dtype, const std::string& pattern,
         bool causal, std::optional<float> scale, bool variable_lengths, const Strides& q_strides,
         const Strides& k_strides, const Strides& v_strides, const Strides& o_strides, uintptr_t stream) {
        const auto strides = [](const Strides& s) {
          return gpu::AttentionStrides{std::get<0>(s), std::get<1>(s), std::get<2>(s)};
        };
        gpu::AttentionDesc desc;
        desc.batch = batch;
        desc.heads = heads;
        desc.kv_heads = kv_heads;
        desc.seq_q = seq_q;
        desc.seq_k = seq_k;
        desc.total_q = total_q;
        desc.total_k = total_k;
        desc.head_dim = head_dim;
        desc.dtype = parse_dtype(dtype);
        if (pattern == "2:4")
          desc.pattern = gpu::AttentionPattern::nm24;
        else if (pattern == "dense")
          desc.pattern = gpu::AttentionPattern::dense;
        else
          throw Error(ErrorCode::invalid_argument,
                      "unknown attention pattern '" + pattern + "' (expected 2:4 or dense)");
        desc.causal = causal;
        desc.scale = scale;
        desc.variable_lengths = variable_lengths;
        desc.q = strides(q_strides);
        desc.k = strides(k_strides);
        desc.v = strides(v_strides);
        desc.o = strides(o_strides);
        const gpu::AttentionPlan plan = gpu::AttentionPlan::create(desc);
        gpu::AttentionTensors tensors;
        tensors.q = reinterpret_cast<const void*>(q);
        tensors.k = reinterpret_cast<const void*>(k);
        tensors.v = reinterpret_cast<const void*>(v);
        tensors.o = reinterpret_cast<void*>(o);
        tensors.lse = reinterpret_cast<float*>(lse);
        tensors.cu_seqlens_q = reinterpret_cast<const int32_t*>(cu_seqlens_q);
        tensors.cu_seqlens_k = reinterpret_cast<const int32_t*>(cu_seqlens_k);
        plan.run(reinterpret_cast<gpu::Stream>(stream), tensors);
      },
      "q"_a, "k"_a, "v"_a, "o"_a, "lse"_a, "cu_seqlens_q"_a, "cu_seqlens_k"_a, "batch"_a, "heads"_a, "kv_heads"_a,
      "seq_q"_a, "seq_k"_a, "total_q"_a, "total_k"_a, "head_dim"_a, "dtype"_a, "pattern"_a, "causal"_a,
      "scale"_a.none(), "variable_lengths"_a, "q_strides"_a, "k_strides"_a, "v_strides"_a, "o_strides"_a, "stream"_a,
      "O = softmax(prune(scale * Q K^T)) V on raw device pointers (0 for lse / cu_seqlens when absent), strides\n"
      "(batch, head, token) in elements, total_q / total_k the varlen tensors' token extents (0 otherwise), one\n"
      "launch on `stream`; nmkit.torch.dfss_attention is the API.");
#endif
}

// Calibrated pruning of one weight from its input statistics (nmkit.torch.prune_model collects them by hooks),
// and the writer of whole model files.
template <typename Scalar>
AnyWeight prune_with_statistics(
    const HostMatrix& weight,
    const std::optional<nb::ndarray<const Scalar, nb::ndim<2>, nb::c_contig, nb::device::cpu>>& xtx, int64_t tokens,
    const std::string& format, const std::string& method_name, double damp, const std::string& candidates,
    const std::string& dtype) {
  const FormatSpec spec = parse_format_spec(format);
  const PruneMethod method = parse_prune_method(method_name);
  const ValueStorage storage = parse_value_storage(dtype, spec);
  ObsOptions obs;
  obs.damp = damp;
  obs.candidates = parse_obs_candidates(candidates);
  const auto rows = static_cast<int64_t>(weight.shape(0)), cols = static_cast<int64_t>(weight.shape(1));
  const std::span<const float> values(weight.data(), weight.size());
  require_finite(values, cols, "weight");
  const DenseMatrix dense = DenseMatrix::from_float(rows, cols, values, DType::f32);
  LayerStatistics stats;
  if (method != PruneMethod::magnitude) {
    require(xtx.has_value(), ErrorCode::invalid_argument,
            std::string("pruning method ") + prune_method_name(method) + " needs the input statistics X^T X");
    require(static_cast<int64_t>(xtx->shape(0)) == cols && static_cast<int64_t>(xtx->shape(1)) == cols,
            ErrorCode::invalid_argument,
            "X^T X is " + std::to_string(xtx->shape(0)) + "x" + std::to_string(xtx->shape(1)) + ", the weight has " +
                std::to_string(cols) + " columns (expected " + std::to_string(cols) + "x" + std::to_string(cols) + ")");
    require(tokens > 0, ErrorCode::invalid_argument,
            "the statistics must count at least one token, got " + std::to_string(tokens));
    stats.in_features = cols;
    stats.tokens = tokens;
    stats.xtx.assign(xtx->data(), xtx->data() + xtx->size());
  }
  AnyWeight out;
  {
    nb::gil_scoped_release released;  // OBS on large weights takes seconds to minutes
    PruneResult r;
    switch (method) {
      case PruneMethod::magnitude:
        r = prune_magnitude(dense, spec);
        break;
      case PruneMethod::wanda:
        r = prune_wanda(dense, stats, spec);
        break;
      case PruneMethod::obs:
        r = prune_obs(dense, stats, spec, obs);
        break;
    }
    out = store_values(std::move(r.compressed), r.energy, storage);
  }
  return out;
}

StDType parse_st_dtype(const std::string& name) {
  for (StDType t : {StDType::BOOL, StDType::U8, StDType::I8, StDType::U16, StDType::I16, StDType::F16, StDType::BF16,
                    StDType::U32, StDType::I32, StDType::F32, StDType::U64, StDType::I64, StDType::F64})
    if (name == st_dtype_name(t)) return t;
  throw Error(ErrorCode::invalid_argument, "unknown safetensors dtype '" + name + "'");
}

void bind_calibrated(nb::module_& m) {
  const char* doc =
      "Prunes a float32 (R, K) weight into `format` by `method` (magnitude, wanda or obs) from its inputs' statistics\n"
      "X^T X (K, K, float64 or float32; None for magnitude) over `tokens` tokens; OBS takes `damp` (a fraction of\n"
      "mean(diag H)) and `candidates` (diagonal, pairwise or combinatorial). Values are computed in float32 and "
      "stored\n"
      "as `dtype` (f32, f16, bf16, or for N:M quantized per row: fp8, e5m2, int8); energy is measured on the weight\n"
      "given.";
  m.def(
      "compress_selected",
      [](const HostMatrix& original, const HostMatrix& values,
         const nb::ndarray<const bool, nb::ndim<2>, nb::c_contig, nb::device::cpu>& kept, const std::string& format,
         const std::string& dtype) -> AnyWeight {
        const auto rows = static_cast<int64_t>(original.shape(0)), cols = static_cast<int64_t>(original.shape(1));
        require(static_cast<int64_t>(values.shape(0)) == rows && static_cast<int64_t>(values.shape(1)) == cols &&
                    static_cast<int64_t>(kept.shape(0)) == rows && static_cast<int64_t>(kept.shape(1)) == cols,
                ErrorCode::invalid_argument, "compress_selected: the weight, the values and the mask differ in shape");
        const FormatSpec spec = parse_format_spec(format);
        require(!std::holds_alternative<TileSpec>(spec), ErrorCode::unsupported,
                "compress_selected takes N:M and V:N:M masks (a tile format keeps whole tiles)");
        const ValueStorage storage = parse_value_storage(dtype, spec);
        const std::span<const float> o(original.data(), original.size()), v(values.data(), values.size());
        require_finite(o, cols, "weight");
        require_finite(v, cols, "values");
        Mask mask = Mask::none(rows, cols);
        for (std::size_t i = 0; i < mask.keep.size(); ++i) mask.keep[i] = kept.data()[i] ? 1 : 0;
        nb::gil_scoped_release released;
        PruneResult r = compress_selection(DenseMatrix::from_float(rows, cols, o, DType::f32),
                                           DenseMatrix::from_float(rows, cols, v, DType::f32),
                                           Selection{std::move(mask), {}}, spec);
        return store_values(std::move(r.compressed), r.energy, storage);
      },
      "original"_a, "values"_a, "kept"_a, "format"_a, "dtype"_a = "f32",
      "`values` (float32 (R, K), a solver's updated weight) compressed into an N:M or V:N:M `format` keeping the\n"
      "entries `kept` (bool (R, K)) marks, stored as `dtype`; the energy is that of `original` under the mask.\n"
      "Raises ValueError naming the first group the mask breaks.");
  m.def("prune_with_statistics", &prune_with_statistics<double>, "weight"_a, "xtx"_a.none(), "tokens"_a, "format"_a,
        "method"_a, "damp"_a = 0.01, "candidates"_a = "diagonal", "dtype"_a = "f32", doc);
  m.def("prune_with_statistics", &prune_with_statistics<float>, "weight"_a, "xtx"_a.none(), "tokens"_a, "format"_a,
        "method"_a, "damp"_a = 0.01, "candidates"_a = "diagonal", "dtype"_a = "f32", doc);
  m.def(
      "_save_file",
      [](const std::string& path, const nb::list& entries, const std::map<std::string, std::string>& metadata) {
        // entries: (name, SparseWeight or QuantizedWeight) or (name, safetensors dtype, shape, bytes), in order.
        ModelFile model;
        model.metadata = metadata;
        for (nb::handle item : entries) {
          const auto entry = nb::cast<nb::tuple>(item);
          std::string name = nb::cast<std::string>(entry[0]);
          if (entry.size() == 2) {
            if (nb::isinstance<QuantizedWeight>(entry[1]))
              model.weights.push_back({std::move(name), nb::cast<const QuantizedWeight&>(entry[1]).matrix});
            else
              model.weights.push_back({std::move(name), nb::cast<const SparseWeight&>(entry[1]).matrix});
            continue;
          }
          StTensor t;
          t.name = name;
          t.dtype = parse_st_dtype(nb::cast<std::string>(entry[1]));
          for (nb::handle d : nb::cast<nb::tuple>(entry[2])) t.shape.push_back(nb::cast<int64_t>(d));
          const auto bytes = nb::cast<nb::bytes>(entry[3]);
          const auto* data = static_cast<const std::byte*>(bytes.data());
          t.data.assign(data, data + bytes.size());
          model.weights.push_back({std::move(name), std::move(t)});
        }
        nb::gil_scoped_release released;
        save_model(path, model);
      },
      "path"_a, "entries"_a, "metadata"_a,
      "Writes an nmkit model file (safetensors): entries (name, SparseWeight or QuantizedWeight) are stored\n"
      "compressed, entries (name, dtype, shape, bytes) as dense tensors; nmkit.save_file is the user-facing wrapper.");
}

}  // namespace
}  // namespace nmkit::python

NB_MODULE(_nmkit, m) {
  m.doc() = "nmkit's C++ core (formats, pruning, the CPU reference and the GPU layers); use the nmkit package.";
  nb::register_exception_translator(nmkit::python::translate_errors);
  nmkit::python::bind_formats(m);
  nmkit::python::bind_device(m);
  nmkit::python::bind_calibrated(m);
}
