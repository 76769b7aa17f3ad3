// SparseLinear: one device weight of any GPU format and a plan per token bucket, behind y = act(x W^T + bias).
// Host code only: it packs, uploads and dispatches to the three families' plan/run APIs.
#include "nmkit/gpu/sparse_linear.hpp"

#include <sstream>
#include <unordered_map>
#include <variant>

#include "nmkit/error.hpp"
#include "nmkit/gpu/detail/token_buckets.hpp"
#include "nmkit/gpu/tile_spmm.hpp"
#include "nmkit/gpu/vnm_spmm.hpp"
#include "nmkit/util/overloaded.hpp"

namespace nmkit::gpu {

using DeviceWeight = std::variant<DeviceNm24, DeviceVnm, DeviceTiles>;
using Plan = std::variant<Nm24SpmmPlan, VnmSpmmPlan, TileSpmmPlan>;

struct SparseLinear::Impl {
  DeviceWeight weight;
  std::string format;
  Activation activation = Activation::none;
  bool bias = false;
  std::unordered_map<int64_t, Plan> plans;  // by token bucket (detail::token_bucket); tiles by token count

  // The product y^T (R x T, col-major) = W (R x K) x^T (K x T, col-major): x and y row-major as they are.
  SpmmDesc desc(int64_t tokens) const {
    SpmmDesc d;
    d.rows = rows(), d.cols = cols(), d.n = tokens;
    d.dtype = d.out_dtype = dtype();
    d.b_layout = d.d_layout = Layout::col_major;
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

  // The plan for `tokens`: its bucket's, run with `tokens` (the 2:4 and V:N:M plans take any C; a tile plan's
  // schedules and workspace are made for its C, so tiles plan per token count).
  Plan plan(int64_t tokens) {
    const bool tiles = std::holds_alternative<DeviceTiles>(weight);
    const int64_t planned = tiles ? tokens : detail::token_bucket(tokens);
    auto it = plans.find(planned);
    if (it == plans.end()) {
      const SpmmDesc d = desc(planned);
      Plan made = std::visit(
          overloaded{
              [&](const DeviceNm24&) -> Plan { return Nm24SpmmPlan::create(d); },
              [&](const DeviceVnm& w) -> Plan { return VnmSpmmPlan::create(d, w.v(), w.m()); },
              [&](const DeviceTiles& w) -> Plan { return TileSpmmPlan::create(d, w.tile_rows(), w.tile_cols()); },
          },
          weight);
      it = plans.emplace(planned, std::move(made)).first;
    }
    if (planned == tokens) return it->second;
    return std::visit(overloaded{
                          [&](const Nm24SpmmPlan& p) -> Plan { return p.for_tokens(tokens); },
                          [&](const VnmSpmmPlan& p) -> Plan { return p.for_tokens(tokens); },
                          [&](const TileSpmmPlan& p) -> Plan { return p; },
                      },
                      it->second);
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
            return DeviceVnm::upload(pack_vnm(a, VnmForm::automatic, Layout::col_major));
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
  auto impl = std::make_unique<Impl>(Impl{upload(weight), format_name(weight), activation, bias, {}});
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
  const Plan plan = impl_->plan(tokens);
  std::visit(
      overloaded{
          [&](const Nm24SpmmPlan& p) { p.run(stream, std::get<DeviceNm24>(impl_->weight), x, nullptr, y, bias); },
          [&](const VnmSpmmPlan& p) { p.run(stream, std::get<DeviceVnm>(impl_->weight), x, nullptr, y, bias); },
          [&](const TileSpmmPlan& p) { p.run(stream, std::get<DeviceTiles>(impl_->weight), x, nullptr, y, bias); },
      },
      plan);
}

std::string SparseLinear::kernel(int64_t tokens) {
  require(tokens > 0, ErrorCode::invalid_argument,
          "SparseLinear::kernel: tokens must be > 0, got " + std::to_string(tokens));
  const Plan plan = impl_->plan(tokens);
  std::ostringstream os;
  std::visit(overloaded{
                 [&](const Nm24SpmmPlan& p) { os << p.config(); },
                 [&](const VnmSpmmPlan& p) {
                   os << vnm_form_name(std::get<DeviceVnm>(impl_->weight).form()) << " " << p.config();
                 },
                 [&](const TileSpmmPlan& p) { os << kernel_name(p.kernel_for(std::get<DeviceTiles>(impl_->weight))); },
             },
             plan);
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
