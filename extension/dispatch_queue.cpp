// Typed calls of the dispatch-queue SQL functions (see dispatch_queue.hpp).
#include "dispatch_queue.hpp"

#include "module.hpp"
#include "spi_transaction.hpp"

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
      "request_body FROM billguard.claim_due_records($1::int, $2::interval, $3::interval, $4)",
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
    claimed.push_back(std::move(c));
  }
  return claimed;
}

namespace {

SqlValue TextOrNull(const std::string& text) {
  return text.empty() ? SqlValue() : SqlValue(text);
}

Recorded RecordedFrom(const std::vector<SqlRow>& rows) {
  const std::string recorded = SingleText(rows);
  if (recorded == "stale") return Recorded::kStale;
  if (recorded == "locked") return Recorded::kLocked;
  return Recorded::kRecorded;
}

Statement RecordingOf(const JudgedAnswer& judged) {
  const ClaimedRecord& claimed = *judged.claimed;
  if (judged.search) {
    const SearchAnswer& answer = judged.found;
    return {"SELECT billguard.record_search_result($1, $2::int, $3, $4::int, $5, $6, $7)",
            {claimed.idempotency_key, std::to_string(claimed.attempt), OutcomeName(judged.outcome),
             std::to_string(answer.http_status), TextOrNull(answer.found_id),
             TextOrNull(answer.request_id), TextOrNull(answer.message)}};
  }
  const ChargeAnswer& answer = judged.charge;
  return {
      "SELECT billguard.record_charge_response($1, $2::int, $3, $4::int, $5, $6::boolean, $7, "
      "$8, $9, $10, $11, $12, $13::interval)",
      {claimed.idempotency_key, std::to_string(claimed.attempt), OutcomeName(judged.outcome),
       std::to_string(answer.http_status), TextOrNull(answer.object_id),
       answer.replayed ? "true" : "false", TextOrNull(answer.request_id),
       TextOrNull(answer.error_type), TextOrNull(answer.error_code),
       TextOrNull(answer.decline_code), TextOrNull(answer.message), TextOrNull(answer.body_excerpt),
       Seconds(settings::search_settle_delay_s)}};
}

}  // namespace

std::vector<Recorded> RecordAnswers(const std::vector<JudgedAnswer>& answers) {
  std::vector<Statement> statements;
  statements.reserve(answers.size());
  for (const JudgedAnswer& judged : answers) statements.push_back(RecordingOf(judged));
  std::vector<Recorded> recorded;
  recorded.reserve(answers.size());
  for (const auto& rows : ExecuteAllInTransaction(statements))
    recorded.push_back(RecordedFrom(rows));
  return recorded;
}

void ReleaseClaim(const ClaimedRecord& claimed) {
  ExecuteInTransaction("SELECT billguard.release_claim($1, $2::int, $3::boolean)",
                       {claimed.idempotency_key, std::to_string(claimed.attempt),
                        claimed.search_first ? "true" : "false"});
}

}  // namespace billguard
