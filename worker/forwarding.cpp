// Forwarding Stripe API requests (see forwarding.hpp).
#include "forwarding.hpp"

#include <chrono>

#include "credentials.hpp"
#include "forwarded_headers.hpp"
#include "ledger_request.hpp"
#include "reconciler.hpp"
#include "stripe_errors.hpp"
#include "stripe_request_parser.hpp"
#include "upstream_answer.hpp"

namespace billguard::proxy {

namespace {

void Refuse(Response& res, int status, const std::string& type, const std::string& code,
            const std::string& message) {
  AnswerJson(res, status, StripeErrorBody(type, code, message));
}

}  // namespace

void HandleStripeRequest(ProxyContext& context, const Request& req, Response& res) {
  std::string decision = "rejected";
  const auto count = [&] { context.metrics.CountRequest(decision, res.status); };

  const auto credential = PresentedCredential(req.get_header_value("Authorization"));
  if (!credential || !LooksLikeVaultKey(*credential)) {
    // Never forwarded, and never echoed: it may be the real key.
    Refuse(res, 401, "invalid_request_error", "vault_key_required",
           "the spend-cap proxy accepts only vault keys (Authorization: Bearer vk_live_... or "
           "vk_test_...)");
    return count();
  }
  // As Stripe keeps test keys away from live data: a vk_test_ key, issued
  // while the proxy held a test key, never spends through a live one.
  if ((credential->compare(0, 8, "vk_live_") == 0) != context.livemode) {
    Refuse(res, 401, "invalid_request_error", "vault_key_wrong_mode",
           std::string("a ") + (context.livemode ? "vk_test_" : "vk_live_") +
               " key cannot be used while the proxy holds a " +
               (context.livemode ? "live" : "test") + " Stripe key");
    return count();
  }
  ForwardedHeaders headers;
  ParsedRequest parsed;
  try {
    headers = ForwardedHeaders::Of(req);
    parsed =
        ParseStripeRequest(req.method, req.target, req.get_header_value("Content-Type"), req.body);
    if (!headers.idempotency_key() && NeedsIdempotencyKey(parsed)) {
      throw BadRequest(400, "idempotency_key_required",
                       "a " + parsed.method +
                           " that can move money needs an Idempotency-Key: the spend-cap ledger "
                           "counts a request by its key");
    }
  } catch (const BadRequest& e) {
    Refuse(res, e.http_status, "invalid_request_error", e.code, e.what());
    return count();
  }
  const std::string idempotency_key = headers.idempotency_key().value_or("");

  Authorization authorization;
  try {
    const ForwardedRequest request = LedgerRequest(parsed, *credential, headers);
    authorization = context.ledger.Authorize(request);
    if (authorization.decision == "reconcile") {
      authorization =
          ReconcileBeforeForwarding(context.ledger, context.upstream, request, authorization);
    }
  } catch (const DatabaseUnavailable&) {
    decision = "unavailable";
    res.set_header("Stripe-Should-Retry", "true");
    Refuse(res, 503, "api_error", "ledger_unavailable",
           "the spend-cap ledger is unavailable; nothing was sent to Stripe, retry later");
    return count();
  } catch (const LedgerError& e) {
    Refuse(res, e.http_status, e.type, "", e.what());
    return count();
  }
  decision = authorization.decision;
  if (decision == "refused" || decision == "replayed") {
    if (decision == "replayed") {
      res.set_header("Idempotent-Replayed", "true");
      if (!authorization.request_id.empty()) res.set_header("Request-Id", authorization.request_id);
    } else {
      // A refusal stands until the budget changes, unless the ledger says
      // it is a throttle (room held by open reservations, a key being
      // reconciled).
      res.set_header("Stripe-Should-Retry", authorization.should_retry ? "true" : "false");
    }
    AnswerJson(res, authorization.http_status, authorization.body);
    return count();
  }

  const auto started = std::chrono::steady_clock::now();
  const HttpResponse response = context.upstream.Send(parsed.method, req.target, req.body, headers);
  context.metrics.ObserveUpstream(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  const UpstreamAnswer answer = ReadUpstreamAnswer(response);
  if (authorization.reserves()) {
    // Kept until the database takes it, should it not now (ledger.hpp).
    context.ledger.Settle(authorization.key_id, idempotency_key, authorization.attempt, answer,
                          headers.stripe_account());
  }
  if (response.status == 0) {
    res.set_header("Stripe-Should-Retry", "true");
    Refuse(res, 502, "api_error", "upstream_unavailable",
           "no answer from Stripe (" + response.transport_error +
               "); retry with the same Idempotency-Key");
    return count();
  }
  if (!response.idempotent_replayed.empty()) {
    res.set_header("Idempotent-Replayed", response.idempotent_replayed);
  }
  if (!response.should_retry.empty()) res.set_header("Stripe-Should-Retry", response.should_retry);
  if (answer.request_id) res.set_header("Request-Id", *answer.request_id);
  // The body the ledger keeps, so that a replay answers the same bytes.
  AnswerJson(res, answer.status, answer.body);
  count();
}

}  // namespace billguard::proxy
