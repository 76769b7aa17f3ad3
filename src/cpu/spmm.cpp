#include "nmkit/cpu/spmm.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nmkit/error.hpp"
#include "../format/row_group_entries.hpp"

namespace nmkit {
namespace {

// A's stored entries per row (CSR, fp32): every format reduces to this for the reference.
struct RowEntries {
  std::vector<int64_t> row_start;  // (R + 1)
  std::vector<int64_t> col;
  std::vector<float> value;
};

template <class RowGroupFormat>  // NmMatrix, VnmMatrix
RowEntries entries_of(const RowGroupFormat& a) {
  RowEntries e;
  e.row_start.assign(static_cast<std::size_t>(a.rows + 1), 0);
  detail::for_each_stored_value(a, [&](int64_t r, int64_t c, std::size_t vi) {
    e.col.push_back(c), e.value.push_back(a.values.get(vi));
    e.row_start[static_cast<std::size_t>(r + 1)] = static_cast<int64_t>(e.col.size());
  });
  for (int64_t r = 0; r < a.rows; ++r)  // rows whose values all lie in the padding
    e.row_start[r + 1] = std::max(e.row_start[r + 1], e.row_start[r]);
  return e;
}

RowEntries entries_of(const TileMatrix& a) {
  // Tiles of each tile row, in tile-column order (the CSC encoding transposed).
  std::vector<std::vector<std::pair<int64_t, int32_t>>> tiles_of_row(static_cast<std::size_t>(a.grid_rows()));
  for (int64_t tc = 0; tc < a.grid_cols(); ++tc)
    for (int32_t t = a.ptr[tc]; t < a.ptr[tc + 1]; ++t) tiles_of_row[a.indices[t]].emplace_back(tc, t);
  RowEntries e;
  e.row_start.push_back(0);
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t tr = r / a.tile_rows, i = r % a.tile_rows;
    for (const auto& [tc, t] : tiles_of_row[static_cast<std::size_t>(tr)])
      for (int j = 0; j < a.tile_cols; ++j) {
        const int64_t c = tc * a.tile_cols + j;
        if (c < a.cols)
          e.col.push_back(c),
              e.value.push_back(a.data.get(static_cast<std::size_t>(t * a.tile_elems() + i * a.tile_cols + j)));
      }
    e.row_start.push_back(static_cast<int64_t>(e.col.size()));
  }
  return e;
}

void check_shapes(const char* who, int64_t r, int64_t k, ConstMatrixRef b, ConstMatrixRef c, MatrixRef d,
                  const Epilogue& epilogue) {
  const std::string name(who);
  require(b.rows == k, ErrorCode::invalid_argument,
          name + ": B has " + std::to_string(b.rows) + " rows, A has K=" + std::to_string(k) + " columns");
  require(d.rows == r && d.cols == b.cols, ErrorCode::invalid_argument,
          name + ": D is " + std::to_string(d.rows) + "x" + std::to_string(d.cols) + ", expected " + std::to_string(r) +
              "x" + std::to_string(b.cols));
  require(b.data != nullptr || b.rows * b.cols == 0, ErrorCode::invalid_argument, name + ": B is null");
  require(d.data != nullptr || d.rows * d.cols == 0, ErrorCode::invalid_argument, name + ": D is null");
  if (epilogue.beta != 0.0f) {
    require(c.data != nullptr && c.rows == r && c.cols == b.cols, ErrorCode::invalid_argument,
            name + ": beta != 0 needs C of shape " + std::to_string(r) + "x" + std::to_string(b.cols));
  }
}

// B as row-major fp32 rows, so that each A entry adds a contiguous, vectorisable row of B.
std::vector<float> rows_of_b(ConstMatrixRef b) {
  std::vector<float> out(static_cast<std::size_t>(b.rows * b.cols));
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < b.rows; ++k)
    for (int64_t j = 0; j < b.cols; ++j) out[static_cast<std::size_t>(k * b.cols + j)] = b.at(k, j);
  return out;
}

// Applies the epilogue to row r, columns [j0, j0 + acc.size()) of D.
void store_row(int64_t r, int64_t j0, const std::vector<float>& acc, ConstMatrixRef c, MatrixRef d, const Epilogue& e) {
  const float bias = e.bias ? e.bias[r] : 0.0f;
  for (std::size_t i = 0; i < acc.size(); ++i) {
    const int64_t j = j0 + static_cast<int64_t>(i);
    float out = e.alpha * acc[i] + bias;
    if (e.beta != 0.0f) out += e.beta * c.at(r, j);
    d.at(r, j) = apply_activation(e.activation, out);
  }
}

// Columns of D computed together: B's slice of K x kColumnChunk floats stays in cache across rows.
constexpr int64_t kColumnChunk = 256;

void run_entries(const RowEntries& a, ConstMatrixRef b, ConstMatrixRef c, MatrixRef d, const Epilogue& e) {
  const std::vector<float> brows = rows_of_b(b);
  const int64_t cols = b.cols;
  for (int64_t j0 = 0; j0 < cols; j0 += kColumnChunk) {
    const int64_t width = std::min(kColumnChunk, cols - j0);
#pragma omp parallel
    {
      std::vector<float> acc(static_cast<std::size_t>(width));
#pragma omp for schedule(dynamic, 8)
      for (int64_t r = 0; r < d.rows; ++r) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t p = a.row_start[r]; p < a.row_start[r + 1]; ++p) {
          const float x = a.value[static_cast<std::size_t>(p)];
          const float* brow = brows.data() + a.col[static_cast<std::size_t>(p)] * cols + j0;
          for (int64_t j = 0; j < width; ++j) acc[static_cast<std::size_t>(j)] += x * brow[j];
        }
        store_row(r, j0, acc, c, d, e);
      }
    }
  }
}

}  // namespace

double relative_frobenius_error(std::span<const float> got, std::span<const float> want) {
  require(got.size() == want.size(), ErrorCode::invalid_argument, "relative_frobenius_error: sizes differ");
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = double{got[i]} - want[i];
    num += d * d, den += double{want[i]} * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

void spmm(const SparseMatrix& a, ConstMatrixRef b, ConstMatrixRef c, MatrixRef d, const Epilogue& epilogue) {
  validate(a);
  check_shapes("spmm", rows_of(a), cols_of(a), b, c, d, epilogue);
  const RowEntries entries = std::visit([](const auto& x) { return entries_of(x); }, a);
  run_entries(entries, b, c, d, epilogue);
}

void gemm(const DenseMatrix& a, ConstMatrixRef b, ConstMatrixRef c, MatrixRef d, const Epilogue& epilogue) {
  check_shapes("gemm", a.rows, a.cols, b, c, d, epilogue);
  const std::vector<float> af = a.to_float();
  const std::vector<float> brows = rows_of_b(b);
  const int64_t k_dim = a.cols, cols = b.cols;
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<std::size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < a.rows; ++r) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < k_dim; ++k) {
        const float x = af[static_cast<std::size_t>(r * k_dim + k)];
        const float* brow = brows.data() + k * cols;
        for (int64_t j = 0; j < cols; ++j) acc[static_cast<std::size_t>(j)] += x * brow[j];
      }
      store_row(r, 0, acc, c, d, epilogue);
    }
  }
}

}  // namespace nmkit
