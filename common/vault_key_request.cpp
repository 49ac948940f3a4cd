// Asking the proxy for a vault key (see vault_key_request.hpp).
#include "cpp_only.hpp"

#include "vault_key_request.hpp"

#include <nlohmann/json.hpp>

#include "stripe_response.hpp"

namespace billguard {

namespace {

// prefix followed by exactly `length` letters or digits.
bool IsIdentifier(const std::string& text, const std::string& prefix, std::size_t length) {
  if (text.size() != prefix.size() + length || text.compare(0, prefix.size(), prefix) != 0)
    return false;
  for (std::size_t i = prefix.size(); i < text.size(); ++i) {
    const char c = text[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  return true;
}

}  // namespace

bool IsVaultKey(const std::string& text) {
  return IsIdentifier(text, "vk_live_", 32) || IsIdentifier(text, "vk_test_", 32);
}

HttpRequest VaultKeyRequest(const std::string& api_base, const std::string& issuer_token,
                            const std::string& json_body, const std::string& user_agent) {
  HttpRequest request;
  request.post = true;
  request.url = api_base + "/keys";
  request.headers = {"Authorization: Bearer " + issuer_token, "Content-Type: application/json",
                     "User-Agent: " + user_agent};
  request.body = json_body;
  return request;
}

IssuedVaultKey ReadIssuedVaultKey(const HttpResponse& response) {
  IssuedVaultKey issued;
  issued.http_status = response.status;
  if (response.status == 0) {
    issued.message = "no answer: " + PrintableExcerpt(response.transport_error, 200);
    return issued;
  }
  const nlohmann::json body = nlohmann::json::parse(response.body, nullptr, false);
  const auto text = [&](const nlohmann::json& object, const char* name) -> std::string {
    if (!object.is_object() || !object.contains(name) || !object[name].is_string()) return "";
    return object[name].get<std::string>();
  };
  if (response.status == 200) {
    const std::string secret = text(body, "vault_key");
    const std::string key_id = text(body, "key_id");
    if (IsVaultKey(secret) && IsIdentifier(key_id, "vkey_", 16)) {
      issued.vault_key = secret;
      issued.key_id = key_id;
    } else {
      issued.message = "the answer to POST /keys holds no vault key";
    }
    return issued;
  }
  const nlohmann::json error =
      body.is_object() && body.contains("error") ? body["error"] : nlohmann::json();
  issued.message = PrintableExcerpt(text(error, "message"), 300);
  if (issued.message.empty()) issued.message = PrintableExcerpt(response.body, 300);
  if (response.status == 409 && text(error, "code") == kBudgetCapDiffers &&
      error.contains("cap_cents") && error["cap_cents"].is_number_integer() &&
      error["cap_cents"].get<long long>() > 0) {
    issued.existing_cap_cents = error["cap_cents"].get<long long>();
  }
  return issued;
}

}  // namespace billguard
