// Refusals as Stripe shapes its errors, so every Stripe client surfaces them
// normally: {"error": {"type", "code", "message"}}.
#pragma once

#include <string>

namespace billguard::proxy {

std::string StripeErrorBody(const std::string& type, const std::string& code,
                            const std::string& message);

}  // namespace billguard::proxy
