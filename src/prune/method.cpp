#include "nmkit/prune/method.hpp"

#include <string>

#include "nmkit/error.hpp"

namespace nmkit {

PruneMethod parse_prune_method(std::string_view name) {
  if (name == "magnitude") return PruneMethod::magnitude;
  if (name == "wanda") return PruneMethod::wanda;
  if (name == "obs") return PruneMethod::obs;
  throw Error(ErrorCode::invalid_argument,
              "unknown pruning method '" + std::string(name) + "' (expected magnitude, wanda or obs)");
}

const char* prune_method_name(PruneMethod m) noexcept {
  return m == PruneMethod::magnitude ? "magnitude" : m == PruneMethod::wanda ? "wanda" : "obs";
}

}  // namespace nmkit
