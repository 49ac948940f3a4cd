// Where Stripe requests may go. Pure C++.
#pragma once

#include "cpp_only.hpp"

#include <string>

namespace billguard {

// Why `url` cannot be where Stripe requests go (billguard.api_base, the
// proxy's --upstream), or "" when it can; one sentence, for a detail line.
// https:// goes anywhere; plain http:// only to a loopback host (127.x.y.z,
// [::1], localhost), because the key travels in every request's
// Authorization header. The URL is parsed by libcurl, the code that will connect, and must
// be written exactly as libcurl writes it back, so that no other spelling of
// a host can pass for loopback.
std::string ApiBaseError(const std::string& url);

}  // namespace billguard
