// Unit tests of obtaining a vault key from billguard-proxy
// (common/issuer_token.cpp, common/vault_key_request.cpp), run plain and
// under AddressSanitizer and UndefinedBehaviorSanitizer: the issuer token
// file's rules, the POST /keys request, and every answer read to a key, the
// budget's cap of a 409, or a reason that never holds the secret.
#include <string>

#include "issuer_token.hpp"
#include "vault_key_request.hpp"

#include "tap.hpp"
#include "temp_files.hpp"

namespace {

using tap::Is;
using tap::Ok;

const std::string kToken = "issuer-abcdefghijklmnopqrstuvwxyz";
const std::string kSecret = "vk_test_0123456789abcdefghijABCDEFGHIJKL";

billguard::HttpResponse Answer(long status, const std::string& body) {
  billguard::HttpResponse r;
  r.status = status;
  r.body = body;
  return r;
}

void IssuerToken() {
  Is(billguard::LoadIssuerToken(temp_files::Write("  " + kToken + "\n", 0600)).token, kToken,
     "a token in a 0600 file, white space around it");
  const std::string open = temp_files::Write(kToken, 0640);
  const auto refused = billguard::LoadIssuerToken(open);
  Ok(refused.token.empty() && refused.error.find("group or world access") != std::string::npos,
     "a group-readable file is refused");
  Ok(refused.error.find(kToken) == std::string::npos &&
         refused.error.find(open) == std::string::npos,
     "... and the reason holds neither the token nor the path");
  Ok(billguard::LoadIssuerToken(temp_files::Write("short-token", 0600)).token.empty(),
     "a token under 24 characters is refused");
  Ok(billguard::LoadIssuerToken(temp_files::Write("issuer token with spaces inside it", 0600))
         .token.empty(),
     "a token with spaces is refused");
  Ok(!billguard::LoadIssuerToken("").error.empty(), "no file set: an error");
}

void Request() {
  const billguard::HttpRequest r =
      billguard::VaultKeyRequest("http://127.0.0.1:9", kToken, "{\"a\":1}", "billguard/test");
  Is(r.url, "http://127.0.0.1:9/keys", "POST <api_base>/keys");
  Ok(r.post && r.body == "{\"a\":1}", "... with the JSON body");
  Is(r.headers.at(0), "Authorization: Bearer " + kToken, "... and the issuer token");
  Is(r.headers.at(1), "Content-Type: application/json", "... as JSON");
}

void Answers() {
  const auto ok = billguard::ReadIssuedVaultKey(
      Answer(200, R"({"vault_key":")" + kSecret +
                      R"(","key_id":"vkey_0123456789abcdef","cap_usd":55.0,"vendor":"stripe"})"));
  Is(ok.vault_key + " " + ok.key_id, kSecret + " vkey_0123456789abcdef", "200: the key");
  const auto odd = billguard::ReadIssuedVaultKey(
      Answer(200, R"({"vault_key":"sk_live_notavaultkey","key_id":"vkey_0123456789abcdef"})"));
  Ok(odd.vault_key.empty() && !odd.message.empty(), "200 without a vault key: no key, a reason");
  Ok(odd.message.find("sk_live") == std::string::npos, "... which never echoes the body");
  const auto conflict = billguard::ReadIssuedVaultKey(
      Answer(409, R"({"error":{"type":"invalid_request_error","code":"budget_cap_differs",)"
                  R"("message":"billing_period 2026-08 of stripe already has a cap of 55.00 USD",)"
                  R"("cap_cents":5500}})"));
  Ok(conflict.existing_cap_cents && *conflict.existing_cap_cents == 5500,
     "409 budget_cap_differs: the budget's cap in cents");
  const auto other = billguard::ReadIssuedVaultKey(
      Answer(409, R"({"error":{"type":"invalid_request_error","cap_cents":5500}})"));
  Ok(!other.existing_cap_cents, "a 409 without the code: no cap taken from it");
  const auto fractional = billguard::ReadIssuedVaultKey(
      Answer(409, R"({"error":{"code":"budget_cap_differs","cap_cents":55.5}})"));
  Ok(!fractional.existing_cap_cents, "a cap that is not whole cents: none");
  const auto refused = billguard::ReadIssuedVaultKey(
      Answer(401, R"({"error":{"message":"POST /keys needs the issuer or the admin token"}})"));
  Is(refused.message, "POST /keys needs the issuer or the admin token", "401: its message");
  Ok(refused.vault_key.empty(), "... and no key");
  billguard::HttpResponse down;
  down.transport_error = "Connection refused";
  Is(billguard::ReadIssuedVaultKey(down).message, "no answer: Connection refused",
     "no answer: why");
  Ok(billguard::ReadIssuedVaultKey(Answer(200, std::string("\xff\x00{[", 4))).vault_key.empty(),
     "a body that is not JSON: no key");
}

}  // namespace

int main() {
  IssuerToken();
  Request();
  Answers();
  temp_files::RemoveAll();
  return tap::Done();
}
