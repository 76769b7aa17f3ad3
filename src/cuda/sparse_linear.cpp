// SparseLinear: one device weight of any GPU format and a plan per token bucket, behind y = act(x W^T + bias).
// Host code only: it packs, uploads and dispatches to the three families' plan/run APIs.
#include "nmkit/gpu/sparse_linear.hpp"

#include <algorithm>
#include <sstream>
#include <unordered_map>
#include <variant>
#include <vector>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/token_buckets.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/util/overloaded.hpp"
#include "transpose.hpp"

namespace nmkit::gpu {

using DeviceWeight = std::variant<DeviceNm24, DeviceVnm, DeviceTiles>;
using Plan = std::variant<Nm24SpmmPlan, VnmSpmmPlan, TileSpmmPlan>;

namespace {

// A condensed V:N:M weight gathers its B rows: from x[T, K] (B col-major) element by element along K, which reads
// all of x whatever the sparsity (0.05-0.93x cuBLAS at T = 4096), or from x^T (B row-major) by 16-byte copies of
// rows (2.16x at 128:2:8). From this many tokens on, the layer transposes x first (a T x K copy, a few per cent of
// the product) and runs the row gather on the first T - T % 8 tokens, the rest as below; under it, where reading
// the weight binds, it gathers from x directly.
constexpr int64_t kTransposeTokens = 64;
constexpr int64_t kRowCopyTokens = 8;  // the row gather copies 16-byte pieces: C % 8 == 0

}  // namespace

struct SparseLinear::Impl {
  DeviceWeight weight;
  std::string format;
  Activation activation = Activation::none;
  bool bias = false;
  // By token bucket (detail::token_bucket; tiles by token count), times 2, + 1 where B is x transposed.
  std::unordered_map<int64_t, Plan> plans;
  // x^T for the row gather, grown to the largest T seen. A buffer once used stays allocated while the layer
  // lives, so that CUDA graphs captured with it stay valid.
  std::vector<DeviceBuffer> transposed;

  // The product y^T (R x T, col-major) = W (R x K) x^T (K x T): x as it is (B col-major) or transposed (B
  // row-major); y row-major as it is.
  SpmmDesc desc(int64_t tokens, Layout b_layout) const {
    SpmmDesc d;
    d.rows = rows(), d.cols = cols(), d.n = tokens;
    d.dtype = d.out_dtype = dtype();
    d.b_layout = b_layout, d.d_layout = Layout::col_major;
    d.bias = bias, d.activation = activation;
    return d;
  }
  int64_t rows() const noexcept {
    return std::visit([](const auto& w) { return w.rows(); }, weight);
  }
  int64_t cols() const noexcept {
    return std::visit([](const auto& w) { return w.cols(); }, weight);
  }
  DType dtype() const noexcept {
    return std::visit([](const auto& w) { return w.dtype(); }, weight);
  }

  // The plan made for `tokens`' bucket (detail::token_bucket; tiles plan per token count: their schedules and
  // workspace are made for their C), made on first use.
  const Plan& bucket_plan(int64_t tokens, Layout b_layout) {
    const int64_t planned = std::holds_alternative<DeviceTiles>(weight) ? tokens : detail::token_bucket(tokens);
    const int64_t key = 2 * planned + (b_layout == Layout::row_major ? 1 : 0);
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    const SpmmDesc d = desc(planned, b_layout);
    Plan made = std::visit(
        overloaded{
            [&](const DeviceNm24&) -> Plan { return Nm24SpmmPlan::create(d); },
            [&](const DeviceVnm& w) -> Plan { return VnmSpmmPlan::create(d, w.v(), w.m()); },
            [&](const DeviceTiles& w) -> Plan { return TileSpmmPlan::create(d, w.tile_rows(), w.tile_cols()); },
        },
        weight);
    return plans.emplace(key, std::move(made)).first->second;
  }

  // Runs y = the product for `tokens` with its bucket's plan (the 2:4 and V:N:M plans take any C: for_tokens).
  void run(int64_t tokens, Layout b_layout, Stream stream, const void* x, void* y, const float* bias) {
    const Plan& plan = bucket_plan(tokens, b_layout);
    std::visit(overloaded{
                   [&](const Nm24SpmmPlan& p) {
                     const DeviceNm24& w = std::get<DeviceNm24>(weight);
                     if (p.desc().n == tokens)
                       p.run(stream, w, x, nullptr, y, bias);
                     else
                       p.for_tokens(tokens).run(stream, w, x, nullptr, y, bias);
                   },
                   [&](const VnmSpmmPlan& p) {
                     const DeviceVnm& w = std::get<DeviceVnm>(weight);
                     if (p.desc().n == tokens)
                       p.run(stream, w, x, nullptr, y, bias);
                     else
                       p.for_tokens(tokens).run(stream, w, x, nullptr, y, bias);
                   },
                   [&](const TileSpmmPlan& p) { p.run(stream, std::get<DeviceTiles>(weight), x, nullptr, y, bias); },
               },
               plan);
  }

  // The tokens whose x a run transposes for the row gather (a multiple of 8; 0: none).
  int64_t transposed_tokens(int64_t tokens) const {
    const auto* vnm = std::get_if<DeviceVnm>(&weight);
    if (!vnm || vnm->form() != VnmForm::condensed || tokens < kTransposeTokens) return 0;
    return tokens / kRowCopyTokens * kRowCopyTokens;
  }

  void* transposed_buffer(std::size_t bytes) {
    if (transposed.empty() || transposed.back().size() < bytes) {
      const std::size_t grown = transposed.empty() ? 0 : 2 * transposed.back().size();
      transposed.emplace_back(std::max(bytes, grown));
    }
    return transposed.back().data();
  }
};

namespace {

DeviceWeight upload(const SparseMatrix& weight) {
  return std::visit(
      overloaded{
          [](const NmMatrix& a) -> DeviceWeight {
            require(a.n == 2 && a.m == 4, ErrorCode::unsupported,
                    "SparseLinear: an " + std::to_string(a.n) + ":" + std::to_string(a.m) +
                        " weight has no GPU kernel; the sparse tensor cores take 2:4 (or vnm:V:2:M for sparser "
                        "patterns)");
            return DeviceNm24::upload(pack_nm24(a));
          },
          [](const VnmMatrix& a) -> DeviceWeight {
            // The form that pays with x transposed (B row-major): condensed where the row gather beats full 2:4.
            return DeviceVnm::upload(pack_vnm(a, VnmForm::automatic, Layout::row_major));
          },
          [](const TileMatrix& a) -> DeviceWeight { return DeviceTiles::upload(pack_tiles(a)); },
      },
      weight);
}

}  // namespace

SparseLinear::SparseLinear(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SparseLinear::SparseLinear(SparseLinear&&) noexcept = default;
SparseLinear& SparseLinear::operator=(SparseLinear&&) noexcept = default;
SparseLinear::~SparseLinear() = default;

SparseLinear SparseLinear::create(const SparseMatrix& weight, Activation activation, bool bias) {
  const DType dtype = dtype_of(weight);
  require(dtype == DType::f16 || dtype == DType::bf16, ErrorCode::unsupported,
          std::string("SparseLinear: the GPU kernels take f16 or bf16 weights, got ") + dtype_name(dtype));
  auto impl = std::make_unique<Impl>(Impl{upload(weight), format_name(weight), activation, bias, {}, {}});
  return SparseLinear(std::move(impl));
}

void SparseLinear::run(Stream stream, const void* x, void* y, int64_t tokens, const float* bias) {
  require(tokens >= 0, ErrorCode::invalid_argument,
          "SparseLinear::run: tokens must be >= 0, got " + std::to_string(tokens));
  if (tokens == 0) return;
  require(x != nullptr && y != nullptr, ErrorCode::invalid_argument, "SparseLinear::run: x and y must not be null");
  require(impl_->bias == (bias != nullptr), ErrorCode::invalid_argument,
          impl_->bias ? "SparseLinear::run: the layer has a bias, but none was given"
                      : "SparseLinear::run: a bias was given to a layer made without one");
  const int64_t transposed = impl_->transposed_tokens(tokens);
  if (transposed == 0) return impl_->run(tokens, Layout::col_major, stream, x, y, bias);
  // The first `transposed` tokens through x^T and the row gather, the other (< 8) from x as it is.
  const std::size_t element = dtype_size(impl_->dtype());
  void* xt = impl_->transposed_buffer(static_cast<std::size_t>(transposed * impl_->cols()) * element);
  transpose_16bit(stream, x, xt, transposed, impl_->cols());
  impl_->run(transposed, Layout::row_major, stream, xt, y, bias);
  if (const int64_t rest = tokens - transposed; rest > 0)
    impl_->run(rest, Layout::col_major, stream, static_cast<const char*>(x) + transposed * impl_->cols() * element,
               static_cast<char*>(y) + transposed * impl_->rows() * element, bias);
}

std::string SparseLinear::kernel(int64_t tokens) {
  require(tokens > 0, ErrorCode::invalid_argument,
          "SparseLinear::kernel: tokens must be > 0, got " + std::to_string(tokens));
  const int64_t transposed = impl_->transposed_tokens(tokens);
  const int64_t run_tokens = transposed > 0 ? transposed : tokens;
  const Plan& plan = impl_->bucket_plan(run_tokens, transposed > 0 ? Layout::row_major : Layout::col_major);
  std::ostringstream os;
  if (transposed > 0) os << "x transposed, ";
  std::visit(overloaded{
                 [&](const Nm24SpmmPlan& p) { os << p.for_tokens(run_tokens).config(); },
                 [&](const VnmSpmmPlan& p) {
                   const DeviceVnm& w = std::get<DeviceVnm>(impl_->weight);
                   os << vnm_form_name(w.form()) << " " << p.for_tokens(run_tokens).config_for(w);
                 },
                 [&](const TileSpmmPlan& p) { os << kernel_name(p.kernel_for(std::get<DeviceTiles>(impl_->weight))); },
             },
             plan);
  if (transposed > 0 && transposed < tokens) os << "; the last " << tokens - transposed << " tokens from x";
  return os.str();
}

int64_t SparseLinear::in_features() const noexcept { return impl_->cols(); }
int64_t SparseLinear::out_features() const noexcept { return impl_->rows(); }
DType SparseLinear::dtype() const noexcept { return impl_->dtype(); }
Activation SparseLinear::activation() const noexcept { return impl_->activation; }
bool SparseLinear::has_bias() const noexcept { return impl_->bias; }
const std::string& SparseLinear::format() const noexcept { return impl_->format; }
std::size_t SparseLinear::plans() const noexcept { return impl_->plans.size(); }

}  // namespace nmkit::gpu
