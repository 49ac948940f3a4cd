// The key API (see keys_api.hpp).
#include "keys_api.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>

#include "credentials.hpp"
#include "stripe_errors.hpp"
#include "stripe_response.hpp"
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

// An amount as decimal text for numeric. nlohmann writes integers as they
// are and other numbers in the shortest form that reads back as the same
// double, so 54890.1 stays 54890.1; the ledger refuses what is not exact in
// the currency's minor units.
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
// answer names that cap in the currency's smallest unit (code
// budget_cap_differs, cap_cents), so an issuer that lost its key (a
// restored database, more records claimed since) can join the budget at its
// cap instead of stalling; only the admin raises a cap.
void AnswerCapDiffers(Response& res, const LedgerError& e) {
  const std::string message = e.what();
  json error = json::parse(StripeErrorBody(e.type, kBudgetCapDiffers, message))["error"];
  // The ledger's message (vault_issue_key): "... already has a cap of 55.00
  // USD", "... of 5000 JPY", "... of 1.250 KWD": written with exactly the
  // currency's decimals, so its digits are the cap in the smallest unit.
  const std::string marker = "already has a cap of ";
  const std::size_t at = message.find(marker);
  long long units = 0;
  std::size_t digits = 0;
  bool point = false;
  std::size_t i = at == std::string::npos ? message.size() : at + marker.size();
  for (; i < message.size(); ++i) {
    const char c = message[i];
    if (c == '.' && !point && digits > 0) {
      point = true;
    } else if (std::isdigit(static_cast<unsigned char>(c)) && units < 1000000000000000LL) {
      units = units * 10 + (c - '0');
      ++digits;
    } else {
      break;
    }
  }
  const bool then_code = i + 4 <= message.size() && message[i] == ' ' &&
                         std::isupper(static_cast<unsigned char>(message[i + 1]));
  if (then_code && units > 0) error["cap_cents"] = units;
  AnswerJson(res, 409, json{{"error", error}}.dump());
}

// A lower-case ISO 4217 code; the ledger checks it is one of billguard.currencies.
bool LooksLikeCurrency(const std::string& code) {
  return code.size() == 3 &&
         std::all_of(code.begin(), code.end(), [](char c) { return c >= 'a' && c <= 'z'; });
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
  const auto text = [&](const char* name, std::string* out) {
    if (!body.is_object() || !body.contains(name) || !body[name].is_string()) return false;
    *out = body[name].get<std::string>();
    return true;
  };
  const auto absent_or = [&](const char* name, bool (json::*is)() const) {
    return !body.is_object() || !body.contains(name) || (body[name].*is)();
  };
  const auto strings = [&](const char* name) {
    return body.contains(name) && body[name].is_array() &&
           std::all_of(body[name].begin(), body[name].end(),
                       [](const json& e) { return e.is_string(); });
  };
  const bool has_usd_cap = body.is_object() && body.contains("period_usd_cap");
  const bool has_cap = body.is_object() && body.contains("period_cap");
  const bool valid = text("vendor", &key.vendor) && text("billing_period", &key.billing_period) &&
                     text("expires_at", &key.expires_at) && has_usd_cap != has_cap &&
                     absent_or("period_usd_cap", &json::is_number) &&
                     absent_or("period_cap", &json::is_number) &&
                     absent_or("currency", &json::is_string) && strings("allowed_endpoints") &&
                     (!body.contains("stripe_accounts") || strings("stripe_accounts"));
  if (!valid) {
    return Error(res, 400,
                 "POST /keys takes a JSON object: {\"vendor\": string, \"billing_period\": "
                 "\"YYYY-MM\", \"currency\": ISO 4217 code (usd), \"period_usd_cap\": number "
                 "(USD) or \"period_cap\": number (in the currency), \"allowed_endpoints\": "
                 "[string], \"stripe_accounts\": [\"acct_...\"] (none), \"expires_at\": "
                 "timestamp}");
  }
  if (body.contains("currency")) key.currency = body["currency"].get<std::string>();
  if (!LooksLikeCurrency(key.currency)) {
    return Error(res, 400,
                 "currency must be a lower-case ISO 4217 code such as usd, eur or jpy, not \"" +
                     PrintableExcerpt(key.currency, 16) + "\"");
  }
  if (has_usd_cap) key.period_usd_cap = DecimalText(body["period_usd_cap"]);
  if (has_cap) key.period_cap = DecimalText(body["period_cap"]);
  key.allowed_endpoints = body["allowed_endpoints"].get<std::vector<std::string>>();
  if (body.contains("stripe_accounts")) {
    key.stripe_accounts = body["stripe_accounts"].get<std::vector<std::string>>();
  }
  if (role == Role::kIssuer) {
    // The operator's ceiling for a new budget in the currency asked; the
    // ledger refuses a new budget where there is none.
    key.issuer = true;
    if (!context.issuer_max_period_usd.empty()) {
      key.issuer_max_period_usd = context.issuer_max_period_usd;
    }
    const auto ceiling = context.issuer_max_period.find(key.currency);
    if (ceiling != context.issuer_max_period.end()) key.issuer_max_period = ceiling->second;
  }
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
    json answer{{"vault_key", issued.vault_key},
                {"key_id", issued.key_id},
                {"vendor", issued.vendor},
                {"currency", issued.currency},
                {"period_cap", Number(issued.cap)},
                {"cap_cents", issued.cap_cents},
                {"stripe_accounts", json::parse(issued.stripe_accounts_json)}};
    if (issued.cap_usd) answer["cap_usd"] = Number(*issued.cap_usd);
    AnswerJson(res, 200, answer.dump());
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
    const bool usd = body.is_object() && body.contains("period_usd_cap");
    const char* field = usd ? "period_usd_cap" : "period_cap";
    if (!body.is_object() || !body.contains(field) || !body[field].is_number() ||
        (usd && body.contains("period_cap"))) {
      return Error(res, 400,
                   "POST /keys/{key_id} takes {\"period_usd_cap\": number} for a budget in USD "
                   "or {\"period_cap\": number} in the budget's currency");
    }
    return WithLedger(res, [&] {
      // A cap in USD raises a budget in USD only: the ledger reads the
      // number in the budget's currency.
      if (usd && json::parse(context.ledger.KeyStatus(key_id))["currency"] != "usd") {
        return Error(res, 400,
                     "the budget of " + key_id + " is not in USD: raise it with period_cap");
      }
      context.ledger.RaiseCap(key_id, DecimalText(body[field]));
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
