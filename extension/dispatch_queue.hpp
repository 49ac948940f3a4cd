// The dispatcher's side of the dispatch queue: each call is one short
// transaction running one of the SQL functions of sql/install/70_dispatch_queue.sql.
#pragma once

#include <string>
#include <vector>

namespace billguard {

// A claimed record and the request it sends: the endpoint and body stored
// with it by its first claim.
struct ClaimedRecord {
  std::string idempotency_key;
  std::string customer_id;
  std::string billing_period;
  std::string endpoint;
  std::string body;
  int attempt = 0;
  bool search_first = false;  // reconcile before (re-)sending
};

// Outcome of recording an answer: "completed", "retry", "failed",
// "unknown", "needs_review", "paused", "charge" (search found nothing: send
// now) or "stale" (the attempt's lease was taken over).
using Outcome = std::string;

// The version of billguard created in this database, empty when none is.
std::string InstalledExtensionVersion();
long RequeueAbandoned();
std::vector<ClaimedRecord> ClaimDueRecords(int max_rows);
Outcome RecordChargeResponse(const ClaimedRecord& claimed, long http_status,
                             const std::string& body, const std::string& should_retry,
                             bool replayed);
Outcome RecordTransportError(const ClaimedRecord& claimed, const std::string& message);
Outcome RecordSearchResult(const ClaimedRecord& claimed, long http_status, const std::string& body);
// Gives back a claimed record that was never sent.
void ReleaseClaim(const ClaimedRecord& claimed);

}  // namespace billguard
