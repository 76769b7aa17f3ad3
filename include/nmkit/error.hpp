#pragma once
// nmkit::Error: the one exception type of the library. Every public function validates its
// inputs and throws this with a code and a message that names what is wrong (tensor, row, group).
#include <stdexcept>
#include <string>
#include <type_traits>

namespace nmkit {

enum class ErrorCode {
  invalid_argument,   // a shape, parameter or option that can never work
  pattern_violation,  // data that breaks a sparsity pattern (too many non-zeros in a group, ...)
  unsupported,        // valid, but not implemented for this dtype/arch/configuration
  cuda_error,         // a CUDA runtime or library call failed
  io_error,           // a file that cannot be read/written, or whose content is malformed
};

const char* to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(code, message) unless `condition` holds. Use for user-facing validation.
inline void require(bool condition, ErrorCode code, const std::string& message) {
  if (!condition) throw Error(code, message);
}

// A literal message: no std::string is made unless the check fails (checks on every run() stay allocation-free).
inline void require(bool condition, ErrorCode code, const char* message) {
  if (!condition) throw Error(code, message);
}

// The same with a message built only on failure: for checks inside per-element loops, where building the
// message every time would cost more than the check (validating an 8M-value matrix took 1.8 s that way), and on
// every run() of a plan.
template <class MakeMessage>
requires std::is_invocable_r_v<std::string, MakeMessage>
inline void require(bool condition, ErrorCode code, MakeMessage&& make_message) {
  if (!condition) throw Error(code, make_message());
}

}  // namespace nmkit
