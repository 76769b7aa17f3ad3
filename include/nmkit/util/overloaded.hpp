#pragma once
// The usual visitor helper: std::visit(overloaded{[](const A&) {...}, [](const B&) {...}}, v).

namespace nmkit {

template <class... Ts>
struct overloaded : Ts... {
  using Ts::operator()...;
};
// C++20 deduces this without a guide, but clang before 17 does not implement that part (the fuzzers build with it).
template <class... Ts>
overloaded(Ts...) -> overloaded<Ts...>;

}  // namespace nmkit
