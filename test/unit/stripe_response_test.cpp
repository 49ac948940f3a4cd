// Unit tests of reading and judging Stripe's answers (common/stripe_response.*),
// run plain and under AddressSanitizer and UndefinedBehaviorSanitizer:
// the judgement's truth table, the fields kept, and answers no Stripe would
// send (malformed, huge, deeply nested, not UTF-8, NUL bytes, random bytes)
// that must each end in a sensible outcome without harm.
#include <random>
#include <string>

#include "stripe_response.hpp"
#include "tap.hpp"

namespace {

using billguard::Outcome;
using tap::Is;
using tap::Ok;

billguard::HttpResponse Answer(long status, const std::string& body,
                               const std::string& should_retry = "") {
  billguard::HttpResponse r;
  r.status = status;
  r.body = body;
  r.should_retry = should_retry;
  r.request_id = "req_unit1";
  return r;
}

std::string Judged(long status, const std::string& body, const std::string& should_retry = "",
                   int attempt = 1, int max_attempts = 10) {
  billguard::ChargeAnswer answer = billguard::ReadChargeAnswer(Answer(status, body, should_retry));
  return billguard::OutcomeName(billguard::JudgeCharge(answer, attempt, max_attempts));
}

std::string Error(const std::string& type, const std::string& code = "") {
  return R"({"error":{"type":")" + type + R"(","code":")" + code + R"("}})";
}

void TruthTable() {
  const std::string pi = R"({"id":"pi_1","object":"payment_intent","status":"succeeded"})";
  Is(Judged(200, pi), "completed", "200 succeeded: completed");
  Is(Judged(201, pi), "completed", "201: completed");
  Is(Judged(200, pi, "false"), "completed", "200 with Should-Retry false: completed");
  Is(Judged(200, R"({"id":"pi_1","status":"processing"})"), "completed", "processing: completed");
  Is(Judged(200, R"({"id":"ch_1","object":"charge","status":"pending"})"), "completed",
     "a pending charge: completed");
  Is(Judged(200, R"({"id":"pi_1","status":"requires_action"})"), "failed",
     "requires_action: failed (not charged)");
  Is(Judged(200, R"({"id":"pi_1","status":"requires_payment_method"})"), "failed",
     "requires_payment_method: failed");
  Is(Judged(200, R"({"object":"payment_intent"})"), "needs_review",
     "2xx without an id: needs_review");
  Is(Judged(401, Error("invalid_request_error")), "paused", "401: paused");
  Is(Judged(403, Error("invalid_request_error")), "paused", "403: paused");
  {
    // Stripe's 403 for a connected account the platform may not act on.
    const std::string no_access =
        R"({"error":{"type":"invalid_request_error","message":"The provided key 'sk_test_****abcd')"
        R"( does not have access to account 'acct_1Gone' (or that account does not exist)."}})";
    const std::string no_permission =
        R"({"error":{"type":"invalid_request_error","message":"The provided key 'rk_test_****abcd')"
        R"( does not have the required permissions for this endpoint on account 'acct_1A'."}})";
    billguard::ChargeAnswer answer = billguard::ReadChargeAnswer(Answer(403, no_access));
    Is(billguard::OutcomeName(billguard::JudgeCharge(answer, 1, 10, true)), "failed",
       "403 no access to the connected account a record charges on: failed, nothing paused");
    answer = billguard::ReadChargeAnswer(Answer(403, no_access));
    Is(billguard::OutcomeName(billguard::JudgeCharge(answer, 1, 10, false)), "paused",
       "... the same 403 of a platform record: paused");
    answer = billguard::ReadChargeAnswer(Answer(403, no_permission));
    Is(billguard::OutcomeName(billguard::JudgeCharge(answer, 1, 10, true)), "paused",
       "a restricted key without a permission, on a connected account: paused (the key's)");
    answer = billguard::ReadChargeAnswer(Answer(401, no_access));
    Is(billguard::OutcomeName(billguard::JudgeCharge(answer, 1, 10, true)), "paused",
       "a 401 on a connected account: paused");
  }
  Is(Judged(401, Error("invalid_request_error"), "true"), "paused",
     "401 with Should-Retry: paused");
  Is(Judged(400, Error("idempotency_error")), "needs_review",
     "400 idempotency_error: needs_review");
  Is(Judged(400, Error("idempotency_error"), "true"), "needs_review",
     "idempotency_error with Should-Retry true: needs_review");
  Is(Judged(409, Error("idempotency_error", "idempotency_key_in_use")), "throttled",
     "409 key in use: throttled");
  Is(Judged(409, Error("idempotency_error", "idempotency_key_in_use"), "false"), "failed",
     "409 with Should-Retry false: failed (a 4xx)");
  Is(Judged(429, Error("rate_limit_error", "rate_limit")), "throttled", "429: throttled");
  Is(Judged(429, Error("rate_limit_error", "rate_limit"), "true"), "throttled",
     "429 with Should-Retry true: throttled");
  // The proxy's spend cap, told apart from Stripe's own 429 by the body.
  const std::string cap = R"({"error":{"type":"invalid_request_error","code":"spend_cap_exceeded",)"
                          R"("message":"spend cap exceeded for billing_period 2026-08"}})";
  Is(Judged(429, cap), "blocked", "429 spend_cap_exceeded (the proxy's cap): blocked");
  Is(Judged(429, cap, "true"), "blocked", "... whatever Should-Retry says");
  Is(Judged(429, cap, "", 10, 3), "blocked", "... past max_attempts too");
  Is(Judged(429, Error("rate_limit_error", "lock_timeout")), "throttled",
     "429 lock_timeout (Stripe's): throttled");
  Is(Judged(429, R"({"error":{"message":"spend cap exceeded for billing_period 2026-08"}})"),
     "throttled", "a 429 with the cap's message but not its code: throttled, never guessed");
  Is(Judged(400, cap), "failed", "spend_cap_exceeded on a 400: not the cap's answer, failed");
  // The proxy's throttles: its budget's room is held by open reservations,
  // or the key is being reconciled. Retried with the same key, never
  // terminal, whatever the header says.
  const std::string pending =
      R"({"error":{"type":"invalid_request_error","code":"spend_cap_pending"}})";
  Is(Judged(429, pending, "true"), "throttled", "429 spend_cap_pending: throttled");
  Is(Judged(429, pending, "false"), "throttled", "... also if a front proxy says otherwise");
  Is(Judged(429, pending, "", 10, 3), "throttled", "... past max_attempts too");
  const std::string reconciling =
      R"({"error":{"type":"api_error","code":"reservation_reconciling"}})";
  Is(Judged(409, reconciling, "true"), "throttled", "409 reservation_reconciling: throttled");
  Is(Judged(409, reconciling, ""), "throttled", "... without Should-Retry too");
  Is(Judged(409, reconciling, "", 10, 3), "throttled", "... past max_attempts too");
  Is(Judged(400, pending), "failed", "spend_cap_pending on a 400: not the proxy's throttle");
  Is(Judged(403, Error("invalid_request_error", "currency_not_allowed")), "blocked",
     "403 currency_not_allowed (no budget in that currency): blocked");
  Is(Judged(403, Error("invalid_request_error", "endpoint_not_allowed")), "paused",
     "403 endpoint_not_allowed: paused (a configuration to fix)");
  Is(Judged(500, Error("api_error")), "unknown", "500: unknown");
  Is(Judged(500, Error("api_error"), "true"), "retry", "500 with Should-Retry true: retry");
  Is(Judged(500, Error("api_error"), "false"), "unknown", "500 with Should-Retry false: unknown");
  Is(Judged(500, Error("api_error"), "", 20, 20), "needs_review",
     "a cached 500 at max_attempts: needs_review (only a person can settle it)");
  Is(Judged(502, Error("api_error")), "retry", "502: retry");
  Is(Judged(503, Error("api_error")), "retry", "503: retry");
  Is(Judged(504, ""), "retry", "504 without a body: retry");
  Is(Judged(503, Error("api_error"), "false"), "needs_review",
     "503 with Should-Retry false: needs_review (a 5xx never proves nothing was charged)");
  Is(Judged(599, ""), "retry", "599: retry");
  Is(Judged(402, Error("card_error", "card_declined")), "failed", "402 declined: failed");
  Is(Judged(402, Error("card_error", "card_declined"), "True"), "retry",
     "402 with Should-Retry: True (any case): retry");
  Is(Judged(400, Error("invalid_request_error", "parameter_missing")), "failed", "400: failed");
  Is(Judged(404, Error("invalid_request_error", "resource_missing")), "failed", "404: failed");
  Is(Judged(302, ""), "needs_review", "a redirect: needs_review (not proof of anything)");
  Is(Judged(502, "<html>Bad gateway</html>"), "retry", "502 with an HTML body: retry");

  // Attempts: 409 and 429 never exhaust; a 4xx that says retry fails when
  // exhausted; anything indeterminate needs review, never 'failed'.
  Is(Judged(429, "", "", 10, 3), "throttled", "429 past max_attempts: throttled, never exhausts");
  Is(Judged(409, Error("idempotency_error", "idempotency_key_in_use"), "", 10, 3), "throttled",
     "409 past max_attempts: throttled, never exhausts");
  Is(Judged(503, Error("api_error"), "", 2, 3), "retry", "503 at attempt 2 of 3: retry");
  Is(Judged(503, Error("api_error"), "", 3, 3), "needs_review",
     "503 at attempt 3 of 3: needs_review");
  Is(Judged(402, Error("card_error"), "true", 3, 3), "failed",
     "402 with Should-Retry true at max_attempts: failed (a decline charges nothing)");

  billguard::HttpResponse timeout = Answer(0, "");
  timeout.transport_error = "Operation timed out after 30000 milliseconds";
  billguard::ChargeAnswer t = billguard::ReadChargeAnswer(timeout);
  Is(billguard::OutcomeName(billguard::JudgeCharge(t, 1, 3)), "retry", "a timeout: retry");
  t = billguard::ReadChargeAnswer(timeout);
  Is(billguard::OutcomeName(billguard::JudgeCharge(t, 3, 3)), "needs_review",
     "a timeout at max_attempts: needs_review, never failed");
  Ok(t.message.find("attempts exhausted") != std::string::npos, "... and the message says why");
  billguard::HttpResponse refused = timeout;
  refused.transport_error = "Failed to connect to 127.0.0.1 port 9: Connection refused";
  refused.request_sent = false;
  t = billguard::ReadChargeAnswer(refused);
  Is(billguard::OutcomeName(billguard::JudgeCharge(t, 10, 3)), "not_sent",
     "a request that never left: not_sent, even past max_attempts");
}

void Fields() {
  billguard::HttpResponse r = Answer(
      402,
      R"({"error":{"type":"card_error","code":"card_declined","decline_code":"generic_decline",)"
      R"("message":"Your card was declined.","payment_intent":{"id":"pi_nested","status":"x"}}})");
  r.idempotent_replayed = "true";
  billguard::ChargeAnswer a = billguard::ReadChargeAnswer(r);
  Is(a.error_type + "|" + a.error_code + "|" + a.decline_code + "|" + a.message,
     "card_error|card_declined|generic_decline|Your card was declined.", "a Stripe error's fields");
  Is(a.object_id, "", "an id nested in the error is not the answer's id");
  Ok(a.replayed && a.request_id == "req_unit1", "Idempotent-Replayed and Request-Id are kept");
  a = billguard::ReadChargeAnswer(Answer(200, R"({"id":"pi_9","object":"payment_intent",)"
                                              R"("metadata":{"id":"nope"},"status":"succeeded"})"));
  Is(a.object_id + "|" + a.object_type + "|" + a.object_status, "pi_9|payment_intent|succeeded",
     "a 2xx object's id, type and status, not those of nested objects");
  a = billguard::ReadChargeAnswer(Answer(200, R"({"id":"pi_\u00e9\"x\u0000y"})"));
  Is(a.object_id, "pi_??\"x?y", "strings are printable ASCII: no NUL, no multi-byte");

  const std::string key = "0f3fe6c7ee131571ac54c216d9553542";
  auto search = [&](const std::string& body) {
    return billguard::ReadSearchAnswer(Answer(200, body), key);
  };
  billguard::SearchAnswer s = search(
      R"({"object":"search_result","data":[)"
      R"({"id":"pi_other","status":"succeeded","metadata":{"billguard_key":"x"}},)"
      R"({"id":"pi_declined","status":"requires_payment_method","metadata":{"billguard_key":")" +
      key + R"("}},{"id":"pi_ours","status":"succeeded","metadata":{"billguard_key":")" + key +
      R"("}}]})");
  Is(s.found_id, "pi_ours", "search: the charged object carrying the key");
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5)), "completed",
     "search found: completed");
  s = search(R"({"data":[{"id":"pi_a","status":"succeeded","amount":4900,"currency":"usd",)"
             R"("customer":"cus_A","metadata":{"billguard_key":")" +
             key +
             R"("}},{"id":"pi_b","status":"succeeded","amount":1.5,"customer":null,)"
             R"("metadata":{"billguard_key":")" +
             key +
             R"("}},{"id":"pi_c","status":"failed","amount":7,"metadata":{"billguard_key":")" +
             key + R"("}}]})");
  std::string found;
  for (const billguard::FoundCharge& f : s.found) {
    found += f.id + "/" + (f.amount ? std::to_string(*f.amount) : "-") + "/" + f.currency + "/" +
             f.customer + ";";
  }
  Is(found, "pi_a/4900/usd/cus_A;pi_b/-//;",
     "search: every charged object carrying the key, with its amount, currency and customer "
     "(record_answers compares them with the record)");
  Is(s.found_id, "pi_a", "search: found_id is the first of them");
  s = search(R"({"data":[{"id":"ch_1","object":"charge","paid":true,"status":"pending",)"
             R"("metadata":{"billguard_key":")" +
             key + R"("}}]})");
  Is(s.found_id, "ch_1", "search: a paid charge counts");
  s = search(R"({"data":[]})");
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5)), "absent",
     "search found nothing: absent");
  s = search(R"({"data":{"id":"pi_ours"}})");
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5)), "retry",
     "search without a list: retry");
  s = billguard::ReadSearchAnswer(Answer(500, Error("api_error")), key);
  Is(std::string(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5))) + "|" + s.message,
     "retry|search failed with HTTP 500", "search answered 500: retry");
  s = search(R"({"data":[]})");
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 4, 5)), "absent",
     "search found nothing after 4 of max_unknown_cycles 5: absent, re-sent");
  Is(std::string(billguard::OutcomeName(billguard::JudgeSearch(s, 5, 5))) + "|" + s.message,
     "needs_review|no charge found for the key after 5 indeterminate answers, each followed by a "
     "search (max_unknown_cycles): reconcile before retrying",
     "search found nothing after max_unknown_cycles 5: needs_review, with the reason");
  s = search(R"({"data":[{"id":"pi_late","status":"succeeded","metadata":{"billguard_key":")" +
             key + R"("}}]})");
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 5, 5)), "completed",
     "search found the charge after max_unknown_cycles: completed all the same");
  s = billguard::ReadSearchAnswer(Answer(500, Error("api_error")), key);
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 5, 5)), "retry",
     "search answered 500 after max_unknown_cycles: retry (it told nothing)");
  s = billguard::ReadSearchAnswer(Answer(401, ""), key);
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5)), "paused",
     "search answered 401: paused");
  s = billguard::ReadSearchAnswer(Answer(403, ""), key);
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5, true)), "retry",
     "search on a connected account answered 403: retry, the record stays unknown");
  s = billguard::ReadSearchAnswer(Answer(403, ""), key);
  Is(billguard::OutcomeName(billguard::JudgeSearch(s, 0, 5, false)), "paused",
     "... on the platform: paused");

  // A page of a list: where it ends, and every object carrying the key.
  s = search(R"({"object":"list","has_more":true,"data":[)"
             R"({"id":"pi_3","created":1700000300,"status":"requires_payment_method",)"
             R"("metadata":{"billguard_key":")" +
             key +
             R"("}},{"id":"pi_2","created":1700000200,"status":"succeeded"},)"
             R"({"id":"pi_1","created":1700000100,"status":"succeeded",)"
             R"("metadata":{"billguard_key":")" +
             key + R"("}}]})");
  Is(std::to_string(s.elements) + " " + (s.has_more ? "more" : "last") + " " + s.last_id + " " +
         std::to_string(s.oldest_created),
     "3 more pi_1 1700000100", "a list page: its size, has_more, last id and oldest creation");
  Is(s.keyed_ids.size() == 2 ? s.keyed_ids[0] + " " + s.keyed_ids[1] : "?", "pi_3 pi_1",
     "... every object carrying the key, charged or not");
  Is(s.found_id, "pi_1", "... and the charged one");
  s = search(R"({"object":"list","has_more":false,"data":[]})");
  Is(std::to_string(s.elements) + (s.has_more ? " more " : " last ") +
         std::to_string(s.oldest_created),
     "0 last -1", "an empty last page");
}

// Answers that must each end in one sensible outcome, never a crash: the
// sanitizers report any out-of-bounds access, overflow or leak.
void Hostile() {
  const std::string deep_arrays(1000000, '[');
  const std::string deep_objects = [] {
    std::string s;
    for (int i = 0; i < 200000; ++i) s += R"({"a":)";
    return s + "1" + std::string(200000, '}');
  }();
  const std::string huge = R"({"id":"pi_1","pad":")" + std::string(4 << 20, 'x') + R"("})";
  struct Case {
    const char* name;
    long status;
    std::string body;
    const char* expected;
  } cases[] = {
      {"a number jsonb refuses (1e1000000)", 200, R"({"id":"pi_1","amount":1e1000000})",
       "needs_review"},
      {"1e1000000 in a 402", 402, R"({"error":{"type":"card_error","x":1e1000000}})", "failed"},
      {"1e1000000 in a 500", 500, R"({"error":{"type":"api_error","n":-1e1000000}})", "unknown"},
      {"a million nested arrays", 200, deep_arrays, "needs_review"},
      {"200,000 nested objects, well-formed", 200, deep_objects, "needs_review"},
      {"a 4 MiB body", 200, huge, "completed"},
      {"not UTF-8", 200, "{\"id\":\"pi_\xff\xfe\",\"status\":\"succeeded\"}", "needs_review"},
      {"a NUL byte outside a string", 200, std::string("{\"id\":\"pi_1\"\0}", 14), "needs_review"},
      {"an empty body", 200, "", "needs_review"},
      {"a bare string", 200, R"("pi_1")", "needs_review"},
      {"an array", 200, R"([{"id":"pi_1"}])", "needs_review"},
      {"truncated", 200, R"({"id":"pi_1","status":"succ)", "needs_review"},
      {"two objects", 200, R"({"id":"pi_1"}{"id":"pi_2"})", "needs_review"},
      {"an id that is a number", 200, R"({"id":12})", "needs_review"},
      {"a 402 that is HTML", 402, "<html>declined</html>", "failed"},
  };
  for (const Case& c : cases) {
    billguard::ChargeAnswer a = billguard::ReadChargeAnswer(Answer(c.status, c.body));
    const std::string outcome = billguard::OutcomeName(billguard::JudgeCharge(a, 1, 10));
    Is(outcome, c.expected, std::string("hostile answer, ") + c.name);
    Ok(a.body_excerpt.size() <= 500 && a.message.size() <= 600 && a.object_id.size() <= 255,
       std::string("hostile answer, ") + c.name + ": fields stay bounded");
  }
  billguard::ChargeAnswer a = billguard::ReadChargeAnswer(Answer(502, "\x01\x80<b>gateway\xff"));
  Is(a.body_excerpt, "?\?<b>gateway?", "an unreadable body is kept as a printable excerpt");

  // Random bytes and random JSON-ish text: every answer gets an outcome.
  std::mt19937 random(42);
  const std::string alphabet = "{}[]\":,0123456789.eE+-tfnrul\\ abc\x80\xff";
  int judged = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body(random() % 64, ' ');
    for (char& c : body) c = alphabet[random() % alphabet.size()];
    if (i % 2 == 0) body = R"({"id":"pi_r","error":)" + body;
    billguard::ChargeAnswer r = billguard::ReadChargeAnswer(Answer(200 + (i % 4) * 100, body));
    billguard::JudgeCharge(r, 1 + i % 12, 10);
    billguard::ReadSearchAnswer(Answer(200, body), "k");
    ++judged;
  }
  Ok(judged == 20000, "20,000 random answers judged without harm");
}

}  // namespace

int main() {
  TruthTable();
  Fields();
  Hostile();
  return tap::Done();
}
