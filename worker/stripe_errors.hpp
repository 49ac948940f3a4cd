// Refusals as Stripe shapes its errors, so every Stripe client surfaces them
// normally: {"error": {"type", "code", "message"}}.
#pragma once

#include <string>

namespace billguard::proxy {

// The code of POST /keys' 409 when the period's budget has another cap.
inline constexpr const char* kBudgetCapDiffers = "budget_cap_differs";

std::string StripeErrorBody(const std::string& type, const std::string& code,
                            const std::string& message);

}  // namespace billguard::proxy
