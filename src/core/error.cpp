#include "nmkit/error.hpp"

namespace nmkit {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid argument";
    case ErrorCode::pattern_violation:
      return "pattern violation";
    case ErrorCode::unsupported:
      return "unsupported";
    case ErrorCode::cuda_error:
      return "CUDA error";
    case ErrorCode::io_error:
      return "I/O error";
  }
  return "error";
}

}  // namespace nmkit
