// Typed calls of the dispatch-queue SQL functions (see dispatch_queue.hpp).
#include "workers/dispatch_queue.hpp"

#include <nlohmann/json.hpp>
#include <stdexcept>

#include "settings/settings.hpp"
#include "postgres/spi_transaction.hpp"

namespace billguard {

namespace {

std::string Seconds(int seconds) {
  return std::to_string(seconds) + " seconds";
}

std::string SingleText(const std::vector<SqlRow>& rows) {
  if (rows.empty() || rows[0].empty() || !rows[0][0]) return "";
  return *rows[0][0];
}

}  // namespace

std::string InstalledExtensionVersion() {
  return SingleText(ExecuteInTransaction(
      "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'billguard'", {}));
}

long RequeueAbandoned() {
  return std::stol(SingleText(ExecuteInTransaction("SELECT billguard.requeue_abandoned()", {})));
}

std::vector<ClaimedRecord> ClaimDueRecords(int max_rows) {
  // A lease outlives one request with its retries inside libcurl, so only a
  // dead dispatcher's rows are ever taken over.
  const int lease_seconds = settings::request_timeout_ms / 1000 * 2 + 30;
  auto rows = ExecuteInTransaction(
      "SELECT idempotency_key, attempt, action, customer_id, billing_period, stripe_endpoint, "
      "request_body, unknown_cycles, stripe_account "
      "FROM billguard.claim_due_records($1::int, $2::interval, $3::interval, $4)",
      {std::to_string(max_rows), Seconds(lease_seconds), Seconds(settings::idempotency_window_s),
       std::string(settings::stripe_endpoint)});
  std::vector<ClaimedRecord> claimed;
  claimed.reserve(rows.size());
  for (auto& row : rows) {
    ClaimedRecord c;
    c.idempotency_key = row[0].value_or("");
    c.attempt = std::stoi(row[1].value_or("0"));
    c.search_first = row[2].value_or("") == "search";
    c.customer_id = row[3].value_or("");
    c.billing_period = row[4].value_or("");
    c.endpoint = row[5].value_or("");
    c.body = row[6].value_or("");
    c.unknown_cycles = std::stoi(row[7].value_or("0"));
    c.stripe_account = row[8].value_or("");  // NULL: the platform's own account
    claimed.push_back(std::move(c));
  }
  return claimed;
}

namespace {

// An empty field is SQL NULL, as for the text parameters above.
nlohmann::json TextOrNull(const std::string& text) {
  return text.empty() ? nlohmann::json() : nlohmann::json(text);
}

// One answer as billguard.record_answers reads it. Every string is printable
// ASCII (common/stripe_response.cpp), so the JSON text is plain ASCII too.
nlohmann::json AnswerJson(const JudgedAnswer& judged) {
  const ClaimedRecord& claimed = *judged.claimed;
  nlohmann::json answer = {{"key", claimed.idempotency_key},
                           {"attempt", claimed.attempt},
                           {"search", judged.search},
                           {"outcome", OutcomeName(judged.outcome)}};
  if (judged.search) {
    const SearchAnswer& found = judged.found;
    answer["http_status"] = found.http_status;
    answer["charge_id"] = TextOrNull(found.found_id);
    answer["request_id"] = TextOrNull(found.request_id);
    answer["message"] = TextOrNull(found.message);
    // What record_answers compares with the record before it takes one.
    nlohmann::json charges = nlohmann::json::array();
    for (const FoundCharge& charge : found.found) {
      charges.push_back(
          {{"id", charge.id},
           {"amount", charge.amount ? nlohmann::json(*charge.amount) : nlohmann::json()},
           {"currency", TextOrNull(charge.currency)},
           {"customer", TextOrNull(charge.customer)}});
    }
    answer["found"] = std::move(charges);
    return answer;
  }
  const ChargeAnswer& charge = judged.charge;
  answer["http_status"] = charge.http_status;
  answer["charge_id"] = TextOrNull(charge.object_id);
  answer["replayed"] = charge.replayed;
  answer["request_id"] = TextOrNull(charge.request_id);
  answer["error_type"] = TextOrNull(charge.error_type);
  answer["error_code"] = TextOrNull(charge.error_code);
  answer["decline_code"] = TextOrNull(charge.decline_code);
  answer["message"] = TextOrNull(charge.message);
  answer["body_excerpt"] = TextOrNull(charge.body_excerpt);
  return answer;
}

Recorded RecordedFrom(const SqlRow& row) {
  const std::string recorded = row.empty() || !row[0] ? "" : *row[0];
  if (recorded == "stale") return Recorded::kStale;
  if (recorded == "locked") return Recorded::kLocked;
  return Recorded::kRecorded;
}

}  // namespace

std::vector<Recorded> RecordAnswers(const std::vector<JudgedAnswer>& answers) {
  nlohmann::json batch = nlohmann::json::array();
  for (const JudgedAnswer& judged : answers) batch.push_back(AnswerJson(judged));
  const auto rows =
      ExecuteInTransaction("SELECT recorded FROM billguard.record_answers($1::jsonb, $2::interval)",
                           {batch.dump(), Seconds(settings::search_settle_delay_s)});
  if (rows.size() != answers.size()) {
    throw std::runtime_error("billguard.record_answers returned " + std::to_string(rows.size()) +
                             " results for " + std::to_string(answers.size()) + " answers");
  }
  std::vector<Recorded> recorded;
  recorded.reserve(rows.size());
  for (const SqlRow& row : rows) recorded.push_back(RecordedFrom(row));
  return recorded;
}

void ReleaseClaim(const ClaimedRecord& claimed) {
  ExecuteInTransaction("SELECT billguard.release_claim($1, $2::int, $3::boolean)",
                       {claimed.idempotency_key, std::to_string(claimed.attempt),
                        claimed.search_first ? "true" : "false"});
}

}  // namespace billguard
