#pragma once
// The usual visitor helper: std::visit(overloaded{[](const A&) {...}, [](const B&) {...}}, v).

namespace nmkit {

template <class... Ts>
struct overloaded : Ts... {
  using Ts::operator()...;
};

}  // namespace nmkit
