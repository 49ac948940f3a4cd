// Stripe request encoding (see stripe_request.hpp).
#include "cpp_only.hpp"

#include "stripe_request.hpp"

#include "errors.hpp"

namespace billguard {

namespace {

bool IsUnreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '~';
}

void AppendEncoded(std::string& out, const std::string& text, bool space_as_plus) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (unsigned char c : text) {
    if (IsUnreserved(c)) {
      out.push_back(static_cast<char>(c));
    } else if (c == ' ' && space_as_plus) {
      out.push_back('+');
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0x0f]);
    }
  }
}

}  // namespace

std::string FormEncode(const FormFields& fields) {
  std::string out;
  for (const auto& [name, value] : fields) {
    if (!out.empty()) out.push_back('&');
    AppendEncoded(out, name, true);
    out.push_back('=');
    AppendEncoded(out, value, true);
  }
  return out;
}

std::string PercentEncode(const std::string& text) {
  std::string out;
  AppendEncoded(out, text, false);
  return out;
}

FormFields ChargeFields(const ChargeRecord& r, const std::string& endpoint, ChargeForm form) {
  FormFields fields = {
      {"amount", std::to_string(r.amount_cents)},
      {"currency", r.currency},
      {"customer", r.stripe_customer},
  };
  if (endpoint == "/v1/payment_intents") {
    if (!r.payment_method.empty()) fields.emplace_back("payment_method", r.payment_method);
    fields.emplace_back("confirm", "true");
    fields.emplace_back("off_session", "true");
    // From API version 2023-08-16 a PaymentIntent without payment method
    // types takes the dashboard's automatic payment methods, and confirming
    // one that may redirect asks for a return_url, which an off-session
    // charge can never use. Automatic methods without redirects, rather
    // than payment_method_types[]=card, keep every saved method that needs
    // no customer (cards, SEPA and ACH debits, whose charges come back
    // "processing") whatever the account's settings and API version.
    if (form == ChargeForm::kOffSession) {
      fields.emplace_back("automatic_payment_methods[enabled]", "true");
      fields.emplace_back("automatic_payment_methods[allow_redirects]", "never");
    }
  } else if (endpoint == "/v1/charges") {
    if (!r.payment_method.empty()) fields.emplace_back("source", r.payment_method);
  } else {
    throw InvalidParameter("unsupported Stripe endpoint \"" + endpoint +
                           "\": use /v1/payment_intents or /v1/charges");
  }
  if (r.application_fee_cents >= 0) {
    fields.emplace_back("application_fee_amount", std::to_string(r.application_fee_cents));
  }
  fields.emplace_back("description", r.description.empty()
                                         ? "billguard " + r.customer_id + " " + r.billing_period
                                         : r.description);
  // billguard's own keys come first and win: the search finds the charge by
  // billguard_key, and a user's key of the same name is left out.
  static const char* const kOwnKeys[] = {"billguard_key", "billing_period", "customer_id"};
  fields.emplace_back("metadata[billguard_key]", r.idempotency_key);
  fields.emplace_back("metadata[billing_period]", r.billing_period);
  fields.emplace_back("metadata[customer_id]", r.customer_id);
  for (const auto& [key, value] : r.metadata) {
    bool own = false;
    for (const char* k : kOwnKeys) own = own || key == k;
    if (!own) fields.emplace_back("metadata[" + key + "]", value);
  }
  return fields;
}

std::string SearchPath(const std::string& endpoint, const std::string& idempotency_key) {
  return endpoint +
         "/search?query=" + PercentEncode("metadata['billguard_key']:'" + idempotency_key + "'");
}

namespace {

HttpRequest RequestTo(const StripeAccount& account, const std::string& path, std::uint64_t tag) {
  HttpRequest request;
  request.tag = tag;
  request.url = account.api_base + path;
  request.headers = {"Authorization: Bearer " + account.api_key,
                     "Stripe-Version: " + account.stripe_version,
                     "User-Agent: " + account.user_agent};
  return request;
}

}  // namespace

HttpRequest ChargeRequest(const StripeAccount& account, const std::string& endpoint,
                          const std::string& body, const std::string& idempotency_key,
                          std::uint64_t tag) {
  HttpRequest request = RequestTo(account, endpoint, tag);
  request.post = true;
  request.body = body;
  request.headers.push_back("Idempotency-Key: " + idempotency_key);
  request.headers.push_back("Content-Type: application/x-www-form-urlencoded");
  return request;
}

HttpRequest SearchRequest(const StripeAccount& account, const std::string& endpoint,
                          const std::string& idempotency_key, std::uint64_t tag) {
  HttpRequest request = RequestTo(account, SearchPath(endpoint, idempotency_key), tag);
  request.post = false;
  return request;
}

}  // namespace billguard
