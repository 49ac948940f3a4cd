// Stripe's webhook deliveries (see webhooks.hpp).
#include "webhooks.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "pqxx_compat.hpp"
#include "proxy_context.hpp"
#include "secret_flags.hpp"
#include "stripe_errors.hpp"

namespace billguard::proxy {

namespace {

constexpr const char* kIngest = "billguard.ingest_stripe_event(text, text)";

void Prepare(pqxx::connection& connection) {
  connection.prepare("ingest", "SELECT billguard.ingest_stripe_event($1, $2)");
}

// A delivery the database refused, as Stripe's clients would see an error:
// the delivery itself is wrong (22xxx: a bad signature, a stale timestamp, a
// payload that is not an event; P0002: a key no record holds), or this side
// failed (anything else, e.g. 55000 when no webhook secret is configured).
void AnswerRefusal(Response& res, const pqxx::sql_error& e) {
  const std::string state = pqxx_compat::SqlState(e);
  if (state.rfind("22", 0) == 0) {
    AnswerJson(res, 400,
               StripeErrorBody("invalid_request_error", "webhook_rejected",
                               pqxx_compat::ServerMessage(e)));
  } else if (state == "P0002") {
    AnswerJson(res, 404,
               StripeErrorBody("invalid_request_error", "resource_missing",
                               pqxx_compat::ServerMessage(e)));
  } else {
    std::fprintf(stderr, "billguard-proxy: a Stripe webhook could not be applied: %s\n",
                 pqxx_compat::ServerMessage(e).c_str());
    AnswerJson(res, 500,
               StripeErrorBody("api_error", "",
                               "the webhook could not be applied (SQLSTATE " + state +
                                   "); the proxy's log says why"));
  }
}

}  // namespace

WebhookInbox::WebhookInbox(const std::string& conninfo, std::size_t pool_size)
    : pool_(conninfo, pool_size, Prepare) {}

void WebhookInbox::CheckSchema() {
  try {
    pool_.RunUnprepared([&](pqxx::connection& connection) {
      pqxx::nontransaction tx(connection);
      const auto found = pqxx_compat::OneRowWith(
          tx,
          "SELECT current_database(), current_user, to_regprocedure($1) IS NOT NULL, "
          "coalesce(has_function_privilege(to_regprocedure($1), 'EXECUTE'), false)",
          kIngest);
      const std::string where = "--webhook-database " + found[0].as<std::string>();
      if (!found[2].as<bool>()) {
        throw StartupError(where + " has no " + kIngest +
                           ": CREATE EXTENSION billguard (0.2.0 or later), or ALTER EXTENSION "
                           "billguard UPDATE");
      }
      if (!found[3].as<bool>()) {
        throw StartupError("role " + found[1].as<std::string>() + " may not call " + kIngest +
                           " in " + where + ": grant what docs/privileges.md lists");
      }
      return 0;
    });
  } catch (const DatabaseUnavailable& e) {
    std::string message = e.what();
    throw StartupError("cannot reach the --webhook-database: " +
                       message.substr(0, message.find('\n')));
  } catch (const pqxx::sql_error& e) {
    // USAGE on schema billguard is missing, say.
    throw StartupError("--webhook-database: " + pqxx_compat::ServerMessage(e) +
                       ": grant what docs/privileges.md lists");
  }
}

std::string WebhookInbox::Ingest(const std::string& payload, const std::string& signature_header) {
  return pool_.Run([&](pqxx::connection& connection) {
    pqxx::nontransaction tx(connection);
    return pqxx_compat::OnePrepared(tx, "ingest", payload, signature_header)[0].as<std::string>();
  });
}

void RegisterWebhookEndpoint(Router& router, WebhookInbox& inbox, Metrics& metrics) {
  router.Post("/webhooks/stripe", [&](const Request& req, Response& res) {
    if (!req.has_header("Stripe-Signature")) {
      AnswerJson(res, 400,
                 StripeErrorBody("invalid_request_error", "webhook_rejected",
                                 "the Stripe-Signature header is missing"));
    } else {
      try {
        const std::string result = inbox.Ingest(req.body, req.get_header_value("Stripe-Signature"));
        AnswerJson(res, 200, nlohmann::json{{"received", true}, {"result", result}}.dump());
      } catch (const DatabaseUnavailable&) {
        AnswerJson(res, 503,
                   StripeErrorBody("api_error", "database_unavailable",
                                   "the billing database is unavailable; deliver it again later"));
      } catch (const pqxx::sql_error& e) {
        AnswerRefusal(res, e);
      }
    }
    metrics.CountRequest("webhook", res.status);
  });
}

}  // namespace billguard::proxy
