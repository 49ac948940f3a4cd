// Unit tests of webhook signature verification (common/stripe_signature.cpp)
// and of loading the signing secret (common/webhook_secret.cpp), printing
// TAP. The expected signatures were computed by an independent
// implementation, OpenSSL's command line:
//   printf '%s' '1700000000.{"id":"evt_1"}' | openssl dgst -sha256 -hmac whsec_test_secret
#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "errors.hpp"
#include "stripe_signature.hpp"
#include "webhook_secret.hpp"

#include "tap.hpp"
#include "temp_files.hpp"

namespace {

const std::string kSecret = "whsec_test_secret";
const std::string kPayload = R"({"id":"evt_1"})";
constexpr std::int64_t kSigned = 1700000000;
// HMAC-SHA256 of "1700000000.{"id":"evt_1"}" with whsec_test_secret ...
const std::string kSignature = "248a374f50f943a28b0f6ab50faf9a7e7e29b710fa26df9fb1618b9bf8ea9c9a";
// ... with the previous secret, whsec_old_secret_1234 ...
const std::string kOldSecretSignature =
    "07d68c35fdd988ccb9d29951809de90f3f218797100d8c94d6276db42e239900";
// ... and of another event's payload, {"id":"evt_2"}, with whsec_test_secret.
const std::string kOtherPayloadSignature =
    "4eafae7374cc4fa6afd0085a0fa3e831d86e4316d466d14a00f00496ea8bc114";

// The error VerifyStripeSignature raises, or "" when it accepts.
std::string Verify(const std::string& payload, const std::string& header, std::int64_t now,
                   const std::string& secret = kSecret) {
  try {
    billguard::VerifyStripeSignature(payload, header, secret, now);
    return "";
  } catch (const billguard::InvalidParameter& e) {
    return e.what();
  }
}

void Accepted(const std::string& header, std::int64_t now, const std::string& name) {
  tap::Is(Verify(kPayload, header, now), "", name);
}

// Refused with a message containing `reason`, which never shows the secret
// or the signature expected.
void Refused(const std::string& payload, const std::string& header, std::int64_t now,
             const std::string& reason, const std::string& name) {
  const std::string error = Verify(payload, header, now);
  const bool clean = error.find(kSecret) == std::string::npos &&
                     error.find(kSignature) == std::string::npos &&
                     error.find(kOtherPayloadSignature) == std::string::npos;
  tap::Ok(error.find(reason) != std::string::npos && clean, name);
  if (error.find(reason) == std::string::npos || !clean)
    std::printf("#   error: '%s', expected '%s'\n", error.c_str(), reason.c_str());
}

std::string Header(const std::string& signatures, std::int64_t t = kSigned) {
  return "t=" + std::to_string(t) + "," + signatures;
}

}  // namespace

int main() {
  // A delivery as Stripe signs it.
  Accepted(Header("v1=" + kSignature), kSigned, "a v1 signature made with the secret is accepted");
  Accepted("v1=" + kSignature + ",t=1700000000", kSigned, "in any order");
  Accepted("t=1700000000, v1=" + kSignature, kSigned, "with a space after the comma");
  Accepted(Header("v1=" + kSignature + ",v0=deadbeef"), kSigned,
           "other schemes (v0) are ignored beside a v1");

  // Rolling the secret: Stripe signs with both; either may come first.
  Accepted(Header("v1=" + kOldSecretSignature + ",v1=" + kSignature), kSigned,
           "rotation: the new secret's signature after the old one's");
  Accepted(Header("v1=" + kSignature + ",v1=" + kOldSecretSignature), kSigned,
           "rotation: the new secret's signature before the old one's");
  tap::Is(Verify(kPayload, Header("v1=" + kOldSecretSignature + ",v1=" + kSignature), kSigned,
                 "whsec_old_secret_1234"),
          "", "rotation: a server still holding the old secret accepts the same delivery");

  // Tampering and the wrong secret.
  Refused(R"({"id":"evt_1" })", Header("v1=" + kSignature), kSigned, "no v1 signature",
          "a changed payload (one added space) is refused");
  Refused(R"({"id":"evt_2"})", Header("v1=" + kSignature), kSigned, "the payload was changed",
          "another event's payload under this signature is refused");
  Refused(kPayload, Header("v1=" + kOtherPayloadSignature), kSigned, "no v1 signature",
          "another event's signature is refused");
  Refused(kPayload, Header("v1=" + kOldSecretSignature), kSigned, "signed with another secret",
          "a signature made only with another secret is refused");
  Refused(kPayload, Header("v1=" + kSignature, kSigned + 1), kSigned + 1, "no v1 signature",
          "a changed timestamp is refused (it is signed too)");
  std::string upper = kSignature;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  Refused(kPayload, Header("v1=" + upper), kSigned, "no v1 signature",
          "upper-case hex is not Stripe's signature");
  Refused(kPayload, Header("v1=" + kSignature.substr(0, 63)), kSigned, "no v1 signature",
          "a truncated signature is refused");
  Refused(kPayload, Header("v0=" + kSignature), kSigned, "it has no v1 signature",
          "a v0 signature alone is refused");

  // The tolerance: five minutes either way.
  Accepted(Header("v1=" + kSignature), kSigned + 300, "300 s old is within the tolerance");
  Refused(kPayload, Header("v1=" + kSignature), kSigned + 301, "is 301 s old, beyond the 300 s",
          "301 s old is refused as a replayed or late delivery");
  Refused(kPayload, Header("v1=" + kSignature), kSigned + 86400, "s old",
          "a day-old delivery is refused");
  Accepted(Header("v1=" + kSignature), kSigned - 300, "300 s in the future is within it");
  Refused(kPayload, Header("v1=" + kSignature), kSigned - 301, "301 s in the future",
          "301 s in the future is refused");

  // Malformed headers.
  Refused(kPayload, "", kSigned, "malformed: it is empty", "an empty header is refused");
  Refused(kPayload, "v1=" + kSignature, kSigned, "it has no timestamp", "no t= is refused");
  Refused(kPayload, "t=1700000000", kSigned, "it has no v1 signature", "no v1= is refused");
  Refused(kPayload, "t=17e8,v1=" + kSignature, kSigned, "not a number of seconds",
          "a timestamp that is not digits is refused");
  Refused(kPayload, "t=-1,v1=" + kSignature, kSigned, "not a number of seconds",
          "a negative timestamp is refused");
  Refused(kPayload, Header("t=1700000001,v1=" + kSignature), kSigned, "more than one timestamp",
          "two timestamps are refused");
  Refused(kPayload, Header("v1=" + kSignature + ",garbage"), kSigned, "not scheme=value",
          "an element without '=' is refused");
  Refused(kPayload, Header("v1=" + std::string(9000, 'a')), kSigned, "longer than 8192 bytes",
          "a huge header is refused");

  // The secret file.
  const auto loaded = billguard::LoadWebhookSecrets(temp_files::Write(" " + kSecret + "\n", 0600));
  tap::Ok(loaded.secrets == std::vector<std::string>{kSecret},
          "a whsec_ secret in a mode 600 file is loaded, trimmed");
  // An account endpoint's secret and a Connect endpoint's, one a line.
  const auto two = billguard::LoadWebhookSecrets(
      temp_files::Write(kSecret + "\nwhsec_connect_endpoint_01\n", 0600));
  tap::Ok(two.secrets == std::vector<std::string>{kSecret, "whsec_connect_endpoint_01"},
          "two secrets, one a line: both loaded");
  bool verified_with_second = true;
  try {
    billguard::VerifyStripeSignature(kPayload, "t=1700000000,v1=" + kSignature,
                                     std::vector<std::string>{"whsec_connect_endpoint_01", kSecret},
                                     kSigned);
  } catch (const std::exception&) {
    verified_with_second = false;
  }
  tap::Ok(verified_with_second, "a delivery signed with either endpoint's secret is verified");
  bool refused_with_neither = false;
  try {
    billguard::VerifyStripeSignature(kPayload, "t=1700000000,v1=" + kSignature,
                                     std::vector<std::string>{"whsec_connect_endpoint_01"},
                                     kSigned);
  } catch (const std::invalid_argument&) {
    refused_with_neither = true;
  }
  tap::Ok(refused_with_neither, "... and one signed with neither is refused");
  const auto second_bad =
      billguard::LoadWebhookSecrets(temp_files::Write(kSecret + "\nsk_test_abcdefghij\n", 0600));
  tap::Is(second_bad.error,
          "secret 2 of billguard.webhook_secret_file is not a webhook signing secret (whsec_...)",
          "a second line that is not a secret is refused, saying which, without its content");
  std::string nine;
  for (int i = 0; i < 9; ++i) nine += "whsec_endpoint_000" + std::to_string(i) + "\n";
  tap::Ok(billguard::LoadWebhookSecrets(temp_files::Write(nine, 0600)).error.find("more than 8") !=
              std::string::npos,
          "more than 8 secrets are refused");
  const std::string open_file = temp_files::Write(kSecret, 0644);
  const auto world_readable = billguard::LoadWebhookSecrets(open_file);
  tap::Ok(world_readable.secrets.empty() &&
              world_readable.error.find("group or world access") != std::string::npos &&
              world_readable.error.find(open_file) == std::string::npos,
          "a world-readable secret file is refused, without its path in the message");
  const auto api_key = billguard::LoadWebhookSecrets(temp_files::Write("sk_test_abcdefghij", 0600));
  tap::Is(api_key.error,
          "billguard.webhook_secret_file does not hold a webhook signing secret (whsec_...)",
          "a file holding something else (an API key) is refused, without its content");
  tap::Is(billguard::LoadWebhookSecrets("").error, "billguard.webhook_secret_file is not set",
          "an unset setting is refused");

  temp_files::RemoveAll();
  return tap::Done();
}
