// Where Stripe requests may go. Pure C++.
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

// https:// anywhere, or plain http:// only to a loopback host (127.0.0.0/8,
// localhost, [::1]): keys must never cross a network in clear text.
bool IsAcceptableApiBase(const std::string& url);

}  // namespace billguard
