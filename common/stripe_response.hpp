// Reading Stripe's answers and deciding what each means for its record.
// Pure C++ (no PostgreSQL headers): an answer, however malformed or large,
// is reduced here to a few typed, bounded, printable fields and one
// Outcome; SQL records them and never parses a body.
#pragma once

#include "cpp_only.hpp"

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "http_client.hpp"

namespace billguard {

// What an answer means for its record. Decided in Judge*(), once.
enum class Outcome {
  kCompleted,    // charged, or being charged (processing, pending)
  kFailed,       // definitively not charged: a decline, an invalid request
  kRetry,        // try again later with the same key; counts towards max_attempts
  kThrottled,    // a 429 or a key still in use (409): again soon, never exhausts
  kUnknown,      // Stripe cached an indeterminate result (a 500): search first
  kNeedsReview,  // a person must look: an idempotency conflict, an answer that
                 // cannot be read, an indeterminate outcome past max_attempts,
                 // a search that found nothing past max_unknown_cycles
  kPaused,       // the API key was refused: the attempt does not count
  kNotSent,      // the request provably never left: the attempt does not count
  kAbsent,       // a search found no charge for the key: send the charge now
  kBlocked,      // refused by billguard-proxy's spend cap: never sent again
};

// The error codes of billguard-proxy's refusals that are its spend cap
// speaking, not Stripe: a 429 spend_cap_exceeded (the period's budget has
// no room) and a 403 currency_not_allowed (the period has no budget in that
// currency). Stripe's own 429s carry rate_limit or lock_timeout.
inline constexpr const char* kSpendCapExceeded = "spend_cap_exceeded";
inline constexpr const char* kCurrencyNotAllowed = "currency_not_allowed";
// The proxy's throttles: a 429 spend_cap_pending (the budget's room is
// held by charges still in flight or of unknown outcome, which may give it
// back) and a 409 reservation_reconciling (the key is still reserved past
// the proxy's idempotency window, and the proxy is finding out at Stripe
// what its attempts did). Both say: the same request, with the same key,
// later.
inline constexpr const char* kSpendCapPending = "spend_cap_pending";
inline constexpr const char* kReservationReconciling = "reservation_reconciling";

// The name SQL records (billguard.record_charge_response and friends).
const char* OutcomeName(Outcome outcome);

// The fields billguard keeps of one answer to a charge request. Strings are
// printable ASCII and bounded, whatever the body held.
struct ChargeAnswer {
  long http_status = 0;      // 0: no HTTP answer (transport error in message)
  bool request_sent = true;  // false only when it provably never left
  bool replayed = false;
  std::optional<bool> should_retry;
  std::string request_id;
  std::string object_id;  // of the PaymentIntent or Charge of a 2xx
  std::string object_type;
  std::string object_status;
  std::optional<bool> paid;
  std::string error_type;  // of a Stripe error body, or set by JudgeCharge
  std::string error_code;
  std::string decline_code;
  std::string message;
  std::string body_excerpt;  // only when the body could not be read
};

// Reads a response to a charge request (a POST).
ChargeAnswer ReadChargeAnswer(const HttpResponse& response);

// What the answer of attempt `attempt` means. May set the error fields to
// say why (a 2xx without an id, a PaymentIntent not charged, attempts
// exhausted). `on_connected_account`: the request was sent with
// Stripe-Account, so a 403 saying the key has no access to that account
// fails the record instead of pausing the dispatcher.
Outcome JudgeCharge(ChargeAnswer& answer, int attempt, int max_attempts,
                    bool on_connected_account = false);

// What Stripe's 403 says when the platform may not act on the connected
// account a request names: "The provided key '...' does not have access to
// account 'acct_...' (or that account does not exist)".
inline constexpr const char* kNoAccessToAccount = "does not have access to account";

// A charged object a search found carrying the record's key. The key alone
// proves nothing (another database billing with the same key namespace on
// this Stripe account makes the same key for the same customer id): SQL
// takes it for the record's charge only if amount, currency and Stripe
// customer are the record's too (billguard.record_answers).
struct FoundCharge {
  std::string id;
  std::optional<long long> amount;  // absent when not an integer
  std::string currency;
  std::string customer;  // empty when none
};

// The fields billguard keeps of one answer to a search for a key.
struct SearchAnswer {
  long http_status = 0;
  bool request_sent = true;
  std::string request_id;
  bool listed = false;             // a 200 whose body holds a "data" list
  std::string found_id;            // the first charged object carrying the key, if any
  std::vector<FoundCharge> found;  // every one, in the answer's order (at most kMaxFound)
  std::string message;             // why the search told nothing
  // Where a page of a list ends, to read the next one: how many objects it
  // held, whether more follow, the last one's id and the oldest creation
  // time (Unix seconds, -1 if none said); and every object carrying the
  // key (at most 20), charged or not.
  std::size_t elements = 0;
  bool has_more = false;
  std::string last_id;
  long long oldest_created = -1;
  std::vector<std::string> keyed_ids;
};
inline constexpr std::size_t kMaxFound = 100;  // Stripe's largest page

SearchAnswer ReadSearchAnswer(const HttpResponse& response, std::string_view idempotency_key);
// What a search means for a record that has had `unknown_cycles`
// indeterminate answers (cached 500s) so far: found nothing after
// max_unknown_cycles of them, it needs review (the message says why), as
// re-sending only gets the cached 500 replayed.
// A 403 of a search on a connected account (`on_connected_account`) is a
// retry: that account's records stay unknown, the others are served.
Outcome JudgeSearch(SearchAnswer& answer, int unknown_cycles, int max_unknown_cycles,
                    bool on_connected_account = false);

// At most max_bytes of text, with every byte outside printable ASCII
// replaced by '?': safe in any database encoding, never a NUL.
std::string PrintableExcerpt(std::string_view text, std::size_t max_bytes);

}  // namespace billguard
