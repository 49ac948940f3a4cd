// Who is calling: a vault key on /v1/ requests (as Stripe's clients send a
// key: Bearer, or HTTP basic with the key as user), a token on /keys.
#pragma once

#include <optional>
#include <string>

namespace billguard::proxy {

// The credential of an Authorization header, or nothing when it is missing
// or malformed.
std::optional<std::string> PresentedCredential(const std::string& authorization);

// vk_live_ or vk_test_ followed by 32 base62 characters.
bool LooksLikeVaultKey(const std::string& credential);

// Compares a presented token with the expected one in constant time.
bool TokenMatches(const std::string& presented, const std::string& expected);

}  // namespace billguard::proxy
