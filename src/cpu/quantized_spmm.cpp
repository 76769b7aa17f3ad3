#include "nmkit/cpu/quantized_spmm.hpp"

#include <string>
#include <vector>

#include "nmkit/error.hpp"
#include "../format/row_group_entries.hpp"

namespace nmkit {
namespace {

bool is_fp8(QuantType type) noexcept { return type != QuantType::int8; }

// The stored entries of one weight row inside the matrix: dense column and code.
struct WeightEntry {
  int64_t col;
  uint8_t code;
};

template <class Dot>
void run(const QuantizedNmMatrix& w, const QuantizedRows& x, ConstMatrixRef c, MatrixRef d, const Epilogue& e,
         DType output, Dot&& dot) {
  std::vector<std::vector<WeightEntry>> rows(static_cast<std::size_t>(w.rows));
  detail::for_each_stored_value(w, [&](int64_t r, int64_t col, std::size_t vi) {
    rows[r].push_back({col, w.values.codes[vi]});
  });
  const int64_t tokens = x.rows;
#pragma omp parallel for schedule(dynamic, 8)
  for (int64_t r = 0; r < w.rows; ++r) {
    const float bias = e.bias ? e.bias[r] : 0.0f;
    for (int64_t t = 0; t < tokens; ++t) {
      const double scaled = static_cast<double>(e.alpha) * w.scales[static_cast<std::size_t>(r)] *
                            x.scales[static_cast<std::size_t>(t)] * dot(rows[r], t);
      float out = static_cast<float>(scaled) + bias;
      if (e.beta != 0.0f) out += e.beta * c.at(r, t);
      d.at(r, t) = round_to(output, apply_activation(e.activation, out));
    }
  }
}

}  // namespace

void quantized_spmm(const QuantizedNmMatrix& w, const QuantizedRows& x, ConstMatrixRef c, MatrixRef d,
                    const Epilogue& epilogue, DType output) {
  validate(w);
  validate(x);
  require(is_fp8(w.type()) == is_fp8(x.values.type), ErrorCode::unsupported,
          std::string("quantized_spmm: a ") + quant_type_name(w.type()) + " weight with " +
              quant_type_name(x.values.type) + " activations (int8 takes int8, fp8 takes e4m3 or e5m2)");
  require(x.cols == w.cols, ErrorCode::invalid_argument,
          "quantized_spmm: activations have " + std::to_string(x.cols) +
              " features, the weight has K=" + std::to_string(w.cols));
  require(d.rows == w.rows && d.cols == x.rows && (d.data != nullptr || d.rows * d.cols == 0),
          ErrorCode::invalid_argument,
          "quantized_spmm: D is " + std::to_string(d.rows) + "x" + std::to_string(d.cols) + ", expected " +
              std::to_string(w.rows) + "x" + std::to_string(x.rows));
  if (epilogue.beta != 0.0f)
    require(c.data != nullptr && c.rows == w.rows && c.cols == x.rows, ErrorCode::invalid_argument,
            "quantized_spmm: beta != 0 needs C of shape " + std::to_string(w.rows) + "x" + std::to_string(x.rows));
  const int64_t k_dim = x.cols;
  if (!is_fp8(w.type())) {
    run(w, x, c, d, epilogue, output, [&](const std::vector<WeightEntry>& row, int64_t t) {
      const uint8_t* xt = x.values.codes.data() + t * k_dim;
      int64_t sum = 0;
      for (const WeightEntry& entry : row)
        sum += int64_t{static_cast<int8_t>(entry.code)} * static_cast<int8_t>(xt[entry.col]);
      return static_cast<double>(sum);
    });
    return;
  }
  run(w, x, c, d, epilogue, output, [&](const std::vector<WeightEntry>& row, int64_t t) {
    const uint8_t* xt = x.values.codes.data() + t * k_dim;
    double sum = 0.0;
    for (const WeightEntry& entry : row)
      sum += static_cast<double>(code_value(w.type(), entry.code)) * code_value(x.values.type, xt[entry.col]);
    return sum;
  });
}

}  // namespace nmkit
