// Exceptions thrown by billguard's pure C++ code. No PostgreSQL headers:
// this file is shared by the extension, the proxy and unit tests.
#pragma once

#include "cpp_only.hpp"

#include <stdexcept>
#include <string>

namespace billguard {

// Bad input from a caller; reported to SQL callers as SQLSTATE 22023
// (invalid_parameter_value) and never changes anything.
class InvalidParameter : public std::invalid_argument {
 public:
  explicit InvalidParameter(const std::string& message) : std::invalid_argument(message) {}
};

}  // namespace billguard
