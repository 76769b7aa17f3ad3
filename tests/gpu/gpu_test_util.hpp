#pragma once
// Shared helpers of the GPU tests: skipping without a device, device buffers, dtype-encoded host data.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    std::string why;                                                    \
    if (!cuda_available(&why)) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

inline void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

struct DeviceBytes {
  void* ptr = nullptr;
  explicit DeviceBytes(std::size_t bytes) { check(cudaMalloc(&ptr, bytes + 16), "cudaMalloc"); }
  ~DeviceBytes() { cudaFree(ptr); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};

// Host buffer of `dtype` values (as raw bytes) from floats already rounded to that dtype.
inline std::vector<std::byte> encode(const std::vector<float>& v, DType dtype) {
  TypedBuffer b(dtype, v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b.set(i, v[i]);
  return {b.data(), b.data() + b.size_bytes()};
}

inline std::vector<float> decode(const std::vector<std::byte>& bytes, DType dtype) {
  std::vector<float> out(bytes.size() / dtype_size(dtype));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(bytes.data(), dtype, i);
  return out;
}

inline std::vector<float> rounded_random(std::size_t count, DType dtype, uint32_t seed) {
  std::vector<float> v = test::random_nonzero(count, seed);
  for (float& x : v) x = round_to(dtype, x);
  return v;
}

// One product D = act(alpha * A * B + beta * C + bias) of shape R x K x C, its dtypes and layouts.
struct Problem {
  int64_t r, k, c;
  DType dtype;
  DType out;
  Layout b_layout, d_layout;
  float alpha, beta;
  bool bias;
  Activation act;
  SpmmDesc desc() const { return {r, k, c, dtype, out, b_layout, d_layout, alpha, beta, bias, act}; }
};

inline std::string describe(const Problem& t) {
  return std::to_string(t.r) + "x" + std::to_string(t.k) + "x" + std::to_string(t.c) + " " + dtype_name(t.dtype) + "->" +
         dtype_name(t.out) + " B " + layout_name(t.b_layout) + " D " + layout_name(t.d_layout) + " alpha " +
         std::to_string(t.alpha) + " beta " + std::to_string(t.beta) + (t.bias ? " bias" : "") + " act " +
         activation_name(t.act);
}

// Every dtype pairing, B and D layout and epilogue on one R x K x C shape with tails (alpha 0.75; beta -0.5
// with ReLU/GELU; a bias except with ReLU).
inline std::vector<Problem> layout_and_epilogue_problems(int64_t r, int64_t k, int64_t c) {
  std::vector<Problem> out;
  for (DType dtype : {DType::f16, DType::bf16})
    for (DType result : {dtype, DType::f32})
      for (Layout bl : {Layout::col_major, Layout::row_major})
        for (Layout dl : {Layout::col_major, Layout::row_major})
          for (Activation act : {Activation::none, Activation::relu, Activation::gelu})
            out.push_back({r, k, c, dtype, result, bl, dl, 0.75f, act == Activation::none ? 0.0f : -0.5f,
                           act != Activation::relu, act});
  return out;
}

// Fresh random B, C and bias (seeded), D poisoned with NaN; `launch(b, c, d, bias)` runs the GPU product on
// device pointers. Returns the relative Frobenius error of D against the CPU oracle spmm(a, ...), or 1 (and a
// failure) when an element of D was not written.
template <class Launch>
double error_against_oracle(const SparseMatrix& a, const Problem& t, uint32_t seed, Launch&& launch) {
  const std::vector<float> b = rounded_random(t.k * t.c, t.dtype, seed + 1);
  const std::vector<float> c = rounded_random(t.r * t.c, t.out, seed + 2);
  const std::vector<float> bias = test::random_nonzero(t.r, seed + 3);
  const auto b_bytes = encode(b, t.dtype), c_bytes = encode(c, t.out);
  const std::size_t d_bytes = t.r * t.c * dtype_size(t.out);

  DeviceBytes db(b_bytes.size()), dc(c_bytes.size()), dd(d_bytes), dbias(bias.size() * 4);
  check(cudaMemcpy(db.ptr, b_bytes.data(), b_bytes.size(), cudaMemcpyHostToDevice), "copy B");
  check(cudaMemcpy(dc.ptr, c_bytes.data(), c_bytes.size(), cudaMemcpyHostToDevice), "copy C");
  check(cudaMemcpy(dbias.ptr, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), "copy bias");
  check(cudaMemset(dd.ptr, 0xff, d_bytes), "poison D");  // NaN in every dtype: an unwritten output fails

  launch(static_cast<const void*>(db.ptr), static_cast<const void*>(dc.ptr), dd.ptr, static_cast<const float*>(dbias.ptr));
  check(cudaDeviceSynchronize(), "kernel");
  std::vector<std::byte> d_host(d_bytes);
  check(cudaMemcpy(d_host.data(), dd.ptr, d_bytes, cudaMemcpyDeviceToHost), "copy D");

  std::vector<float> want(t.r * t.c);
  spmm(a, {b.data(), t.k, t.c, t.b_layout}, {c.data(), t.r, t.c, t.d_layout}, {want.data(), t.r, t.c, t.d_layout},
       {t.alpha, t.beta, t.bias ? bias.data() : nullptr, t.act});
  const std::vector<float> got = decode(d_host, t.out);
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << describe(t) << ": element " << i << " not written or not finite";
      return 1.0;
    }
  return test::relative_frobenius(got, want);
}

// Sets an environment variable for one scope: plans read the NMKIT_* experiment switches when they are created.
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

// The sm90 kernel's schedules (NMKIT_SM90_SCHEDULE; KernelConfig::register_epilogue, persistent_ctas).
inline constexpr const char* kSm90Schedules[] = {"staged", "registers", "persistent"};

// Relative Frobenius error allowed against the fp32 CPU oracle (inputs are exact in the dtype; the GPU
// accumulates in fp32 in another order and rounds the output).
inline double tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 2e-3; }

}  // namespace nmkit::gpu
