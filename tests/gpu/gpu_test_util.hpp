#pragma once
// Shared helpers of the GPU tests: skipping without a device, device buffers, dtype-encoded host data.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <vector>

#include "nmkit/cpu/spmm.hpp"
#include "nmkit/device.hpp"
#include "nmkit/gpu/nm24_spmm.hpp"
#include "test_util.hpp"

namespace nmkit::gpu {

#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    const DeviceQuery cuda = query_cuda_devices();                                 \
    if (cuda.devices.empty()) GTEST_SKIP() << "no CUDA device: " << cuda.why_none; \
  } while (0)

inline void check(cudaError_t e, const char* what) {
  ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
}

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
  int64_t ldb = 0;  // B's leading dimension (0: dense); the gap past each column or row of B holds NaN
  SpmmDesc desc() const { return {r, k, c, dtype, out, b_layout, d_layout, alpha, beta, bias, act, ldb}; }
};

inline std::string describe(const Problem& t) {
  return std::to_string(t.r) + "x" + std::to_string(t.k) + "x" + std::to_string(t.c) + " " + dtype_name(t.dtype) +
         "->" + dtype_name(t.out) + " B " + layout_name(t.b_layout) + " D " + layout_name(t.d_layout) + " alpha " +
         std::to_string(t.alpha) + " beta " + std::to_string(t.beta) + (t.bias ? " bias" : "") + " act " +
         activation_name(t.act) + (t.ldb != 0 ? " ldb " + std::to_string(t.ldb) : "");
}

// B (K x C in `layout`, dense values `b`) laid out with leading dimension ldb (0: dense) as `dtype` bytes, NaN in
// the gap past each column (col-major) or row (row-major): a kernel that reads it poisons its output.
inline std::vector<std::byte> encode_strided(const std::vector<float>& b, int64_t k, int64_t c, Layout layout,
                                             int64_t ldb, DType dtype) {
  const int64_t lines = layout == Layout::col_major ? c : k, line = layout == Layout::col_major ? k : c;
  const int64_t ld = ldb == 0 ? line : ldb;
  std::vector<float> strided(static_cast<std::size_t>(lines * ld), std::nanf(""));
  for (int64_t i = 0; i < lines; ++i)
    for (int64_t j = 0; j < line; ++j) strided[i * ld + j] = b[i * line + j];
  return encode(strided, dtype);
}

// Relative Frobenius error allowed against the fp32 CPU oracle (inputs are exact in the dtype; the GPU
// accumulates in fp32 in another order and rounds the output).
inline double tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : 2e-3; }

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
  const auto b_bytes = encode_strided(b, t.k, t.c, t.b_layout, t.ldb, t.dtype), c_bytes = encode(c, t.out);
  const std::size_t d_bytes = t.r * t.c * dtype_size(t.out);

  DeviceBytes db(b_bytes.size()), dc(c_bytes.size()), dd(d_bytes), dbias(bias.size() * 4);
  check(cudaMemcpy(db.ptr, b_bytes.data(), b_bytes.size(), cudaMemcpyHostToDevice), "copy B");
  check(cudaMemcpy(dc.ptr, c_bytes.data(), c_bytes.size(), cudaMemcpyHostToDevice), "copy C");
  check(cudaMemcpy(dbias.ptr, bias.data(), bias.size() * 4, cudaMemcpyHostToDevice), "copy bias");
  check(cudaMemset(dd.ptr, 0xff, d_bytes), "poison D");  // NaN in every dtype: an unwritten output fails

  launch(static_cast<const void*>(db.ptr), static_cast<const void*>(dc.ptr), dd.ptr,
         static_cast<const float*>(dbias.ptr));
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
  // Each element within its own allowance too: output rounding of its value, plus the norm tolerance of the RMS.
  const double out_eps = t.out == DType::f32 ? 0x1p-23 : t.out == DType::bf16 ? 0x1p-8 : 0x1p-11;
  std::size_t worst = 0;
  if (test::worst_element_excess(got, want, 2.0 * out_eps, tolerance(t.dtype), &worst) > 1.0) {
    const bool col_major = t.d_layout == Layout::col_major;
    const auto row = col_major ? worst % t.r : worst / t.c, col = col_major ? worst / t.r : worst % t.c;
    ADD_FAILURE() << describe(t) << ": D(" << row << ", " << col << ") is " << got[worst] << ", the oracle says "
                  << want[worst];
  }
  return test::relative_frobenius(got, want);
}

// Two layers z = W2 (W1 x), f16, B and D col-major (each output is the next layer's B), run on a non-blocking
// stream as four launches: both layers on x0, then both again on x1 into the same intermediate y, so that the third
// launch overwrites what the second reads. Eight rounds over poisoned y and z. Launched overlapping the kernel
// before them (programmatic dependent launch), the kernels must still wait for it: for its writes (read after write)
// and for its reads (write after read). `layer1(stream, x, y)` and `layer2(stream, y, z)` launch the GPU products;
// a1 (r1 x k) and a2 (r2 x r1) are their weights for the oracle, which rounds y to f16 as the device stores it.
template <class Layer1, class Layer2>
void expect_chained_layers(const SparseMatrix& a1, const SparseMatrix& a2, int64_t k, int64_t r1, int64_t r2, int64_t n,
                           Layer1&& layer1, Layer2&& layer2, const std::string& what) {
  constexpr DType kDtype = DType::f16;
  const auto oracle = [&](const SparseMatrix& a, const std::vector<float>& x, int64_t cols, int64_t rows) {
    std::vector<float> y(static_cast<std::size_t>(rows * n));
    spmm(a, {x.data(), cols, n, Layout::col_major}, {nullptr, rows, n, Layout::col_major},
         {y.data(), rows, n, Layout::col_major}, {1.0f, 0.0f, nullptr, Activation::none});
    for (float& v : y) v = round_to(kDtype, v);
    return y;
  };
  const std::vector<float> x[2] = {rounded_random(k * n, kDtype, 73), rounded_random(k * n, kDtype, 74)};
  const std::vector<float> want[2] = {oracle(a2, oracle(a1, x[0], k, r1), r1, r2),
                                      oracle(a2, oracle(a1, x[1], k, r1), r1, r2)};
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  DeviceBytes dx0(k * n * 2), dx1(k * n * 2), dy(r1 * n * 2), dz0(r2 * n * 2), dz1(r2 * n * 2);
  const auto x0_bytes = encode(x[0], kDtype), x1_bytes = encode(x[1], kDtype);
  check(cudaMemcpy(dx0.ptr, x0_bytes.data(), x0_bytes.size(), cudaMemcpyHostToDevice), "copy x0");
  check(cudaMemcpy(dx1.ptr, x1_bytes.data(), x1_bytes.size(), cudaMemcpyHostToDevice), "copy x1");
  for (int round = 0; round < 8; ++round) {
    check(cudaMemsetAsync(dy.ptr, 0xff, r1 * n * 2, stream), "poison y");  // NaN
    for (void* z : {dz0.ptr, dz1.ptr}) check(cudaMemsetAsync(z, 0xff, r2 * n * 2, stream), "poison z");
    layer1(stream, dx0.ptr, dy.ptr);
    layer2(stream, dy.ptr, dz0.ptr);
    layer1(stream, dx1.ptr, dy.ptr);
    layer2(stream, dy.ptr, dz1.ptr);
    check(cudaStreamSynchronize(stream), "layers");
    for (int pair = 0; pair < 2; ++pair) {
      std::vector<std::byte> bytes(static_cast<std::size_t>(r2 * n * 2));
      check(cudaMemcpy(bytes.data(), pair == 0 ? dz0.ptr : dz1.ptr, bytes.size(), cudaMemcpyDeviceToHost), "copy z");
      const std::vector<float> got = decode(bytes, kDtype);
      for (std::size_t i = 0; i < got.size(); ++i)
        ASSERT_TRUE(std::isfinite(got[i]))
            << what << " round " << round << " pair " << pair << ": element " << i << " not written";
      // y is rounded where the device's and the oracle's sums differ in order: a step of f16 carried into z.
      EXPECT_LE(test::relative_frobenius(got, want[pair]), 5 * tolerance(kDtype))
          << what << " round " << round << " pair " << pair;
    }
  }
  check(cudaStreamDestroy(stream), "stream");
}

}  // namespace nmkit::gpu
