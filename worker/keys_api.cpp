// The key API (see keys_api.hpp).
#include "keys_api.hpp"

#include <nlohmann/json.hpp>

#include <cctype>

#include "credentials.hpp"
#include "stripe_errors.hpp"
#include "vault_key_request.hpp"

namespace billguard::proxy {

namespace {

using nlohmann::json;

enum class Role { kNone, kIssuer, kAdmin };

Role RoleOf(const ProxyContext& context, const Request& req) {
  const auto token = PresentedCredential(req.get_header_value("Authorization"));
  if (!token) return Role::kNone;
  if (TokenMatches(*token, context.admin_token)) return Role::kAdmin;
  if (context.issuer_token && TokenMatches(*token, *context.issuer_token)) return Role::kIssuer;
  return Role::kNone;
}

void Error(Response& res, int status, const std::string& message) {
  AnswerJson(res, status,
             StripeErrorBody(status >= 500 ? "api_error" : "invalid_request_error", "", message));
}

// A USD amount as decimal text for numeric. nlohmann writes integers as they
// are and other numbers in the shortest form that reads back as the same
// double, so 54890.1 stays 54890.1; the ledger refuses what is not whole cents.
std::string DecimalText(const json& value) {
  return value.dump();
}

// A numeric from the ledger (e.g. "54890.10") as a JSON number.
json Number(const std::string& text) {
  return json::parse(text);
}

// Runs a ledger call and answers its errors.
template <typename Fn>
void WithLedger(Response& res, Fn&& fn) {
  try {
    fn();
  } catch (const DatabaseUnavailable&) {
    Error(res, 503, "the spend-cap ledger is unavailable; retry later");
  } catch (const LedgerError& e) {
    Error(res, e.http_status, e.what());
  }
}

// A 409 of POST /keys: the period's budget exists with another cap. The
// answer names that cap in cents (code budget_cap_differs, cap_cents), so
// an issuer that lost its key (a restored database, more records claimed
// since) can join the budget at its cap instead of stalling; only the
// admin raises a cap.
void AnswerCapDiffers(Response& res, const LedgerError& e) {
  const std::string message = e.what();
  json error = json::parse(StripeErrorBody(e.type, kBudgetCapDiffers, message))["error"];
  // The ledger's message (vault_issue_key): "... already has a cap of 55.00 USD".
  const std::string marker = "already has a cap of ";
  const std::size_t at = message.find(marker);
  long long cents = 0;
  std::size_t digits = 0;
  bool point = false;
  for (std::size_t i = at == std::string::npos ? message.size() : at + marker.size();
       i < message.size(); ++i) {
    const char c = message[i];
    if (c == '.' && !point) {
      point = true;
    } else if (std::isdigit(static_cast<unsigned char>(c)) && cents < 1000000000000000LL) {
      cents = cents * 10 + (c - '0');
      digits += point ? 1 : 0;
    } else {
      break;
    }
  }
  if (point && digits == 2 && cents > 0) error["cap_cents"] = cents;
  AnswerJson(res, 409, json{{"error", error}}.dump());
}

void AnswerStatus(ProxyContext& context, Response& res, const std::string& key_id) {
  json status = json::parse(context.ledger.KeyStatus(key_id));
  status["key_id"] = key_id;
  status["revoked"] = !status["revoked_at"].is_null();
  AnswerJson(res, 200, status.dump());
}

void IssueKey(ProxyContext& context, const Request& req, Response& res) {
  const CountedRequest counted(context.metrics, "keys", res.status);
  const Role role = RoleOf(context, req);
  if (role == Role::kNone) {
    return Error(res, 401, "POST /keys needs the issuer or the admin token");
  }
  const json body = json::parse(req.body, nullptr, false);
  KeyRequest key;
  key.livemode = context.livemode;
  if (role == Role::kIssuer) key.issuer_max_period_usd = context.issuer_max_period_usd;
  const auto text = [&](const char* name, std::string* out) {
    if (!body.is_object() || !body.contains(name) || !body[name].is_string()) return false;
    *out = body[name].get<std::string>();
    return true;
  };
  const bool valid = text("vendor", &key.vendor) && text("billing_period", &key.billing_period) &&
                     text("expires_at", &key.expires_at) && body.contains("period_usd_cap") &&
                     body["period_usd_cap"].is_number() && body.contains("allowed_endpoints") &&
                     body["allowed_endpoints"].is_array() &&
                     std::all_of(body["allowed_endpoints"].begin(), body["allowed_endpoints"].end(),
                                 [](const json& e) { return e.is_string(); });
  if (!valid) {
    return Error(res, 400,
                 "POST /keys takes a JSON object: {\"vendor\": string, \"billing_period\": "
                 "\"YYYY-MM\", \"period_usd_cap\": number, \"allowed_endpoints\": [string], "
                 "\"expires_at\": timestamp}");
  }
  key.period_usd_cap = DecimalText(body["period_usd_cap"]);
  key.allowed_endpoints = body["allowed_endpoints"].get<std::vector<std::string>>();
  WithLedger(res, [&] {
    NewKey issued;
    try {
      issued = context.ledger.IssueKey(key);
    } catch (const LedgerError& e) {
      // 403: the ledger refused the issuer token more than the dispatcher's key.
      if (e.http_status == 403) {
        return AnswerJson(res, 403, StripeErrorBody(e.type, "issuer_not_allowed", e.what()));
      }
      if (e.http_status != 409) throw;
      return AnswerCapDiffers(res, e);
    }
    AnswerJson(res, 200,
               json{{"vault_key", issued.vault_key},
                    {"key_id", issued.key_id},
                    {"cap_usd", Number(issued.cap_usd)},
                    {"vendor", issued.vendor}}
                   .dump());
  });
}

// GET, DELETE and POST /keys/{key_id}: the admin's.
void ManageKey(ProxyContext& context, const Request& req, Response& res) {
  const CountedRequest counted(context.metrics, "keys", res.status);
  const Role role = RoleOf(context, req);
  if (role == Role::kNone)
    return Error(res, 401, req.method + " /keys/{key_id} needs the admin token");
  if (role != Role::kAdmin) return Error(res, 403, "the issuer token may only create keys");
  const std::string key_id = req.matches[1];
  if (req.method == "POST") {
    const json body = json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("period_usd_cap") ||
        !body["period_usd_cap"].is_number()) {
      return Error(res, 400, "POST /keys/{key_id} takes {\"period_usd_cap\": number}");
    }
    return WithLedger(res, [&] {
      context.ledger.RaiseCap(key_id, DecimalText(body["period_usd_cap"]));
      AnswerStatus(context, res, key_id);
    });
  }
  WithLedger(res, [&] {
    if (req.method == "DELETE") context.ledger.RevokeKey(key_id);
    AnswerStatus(context, res, key_id);
  });
}

}  // namespace

void RegisterKeysApi(Router& router, ProxyContext& context) {
  router.Post("/keys", [&](const Request& req, Response& res) { IssueKey(context, req, res); });
  const auto manage = [&](const Request& req, Response& res) { ManageKey(context, req, res); };
  router.Get(R"(/keys/(vkey_[A-Za-z0-9]{16}))", manage);
  router.Delete(R"(/keys/(vkey_[A-Za-z0-9]{16}))", manage);
  router.Post(R"(/keys/(vkey_[A-Za-z0-9]{16}))", manage);
}

}  // namespace billguard::proxy
