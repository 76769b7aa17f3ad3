#pragma once
// Force-included by fuzz/CMakeLists.txt where clang is older than 17 and nmkit/util/overloaded.hpp has no deduction
// guide: those clangs do not deduce an aggregate's template arguments (C++20's P1816), which `overloaded{...}` needs.
#include "nmkit/util/overloaded.hpp"

namespace nmkit {
template <class... Ts>
overloaded(Ts...) -> overloaded<Ts...>;
}  // namespace nmkit
