#pragma once
// The pruning methods by name, for the callers that choose one at run time (schedules, whole models, the CLI).
#include <cstdint>
#include <string_view>

namespace nmkit {

enum class PruneMethod : uint8_t { magnitude, wanda, obs };
PruneMethod parse_prune_method(std::string_view name);  // "magnitude" | "wanda" | "obs"
const char* prune_method_name(PruneMethod m) noexcept;

}  // namespace nmkit
