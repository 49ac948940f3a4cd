// The dispatcher's side of the dispatch queue: each call is one short
// transaction running one of the SQL functions of sql/install/70_dispatch_queue.sql.
#pragma once

#include <string>
#include <vector>

#include "common/stripe_response.hpp"

namespace billguard {

// A claimed record and the request it sends: the endpoint, body and
// connected account stored with it by its first claim.
struct ClaimedRecord {
  std::string idempotency_key;
  std::string customer_id;
  std::string billing_period;
  std::string endpoint;
  std::string body;
  // The connected account (acct_...) its charge is made on, frozen at its
  // first claim; empty for the platform's own account.
  std::string stripe_account;
  int attempt = 0;
  bool search_first = false;  // reconcile before (re-)sending
  int unknown_cycles = 0;     // indeterminate answers so far (see JudgeSearch)
};

// Whether an answer was recorded: kStale when the record has moved on (the
// attempt's lease was taken over, an operator requeued it), kLocked when
// another session holds its row (the dispatcher never waits for one).
enum class Recorded { kRecorded, kStale, kLocked };

// The version of billguard created in this database, empty when none is.
std::string InstalledExtensionVersion();
long RequeueAbandoned();
std::vector<ClaimedRecord> ClaimDueRecords(int max_rows);
// One judged answer: to a charge (search == false) or to a search.
struct JudgedAnswer {
  const ClaimedRecord* claimed;
  bool search = false;
  Outcome outcome;
  ChargeAnswer charge;
  SearchAnswer found;
};

// Records the answers in one transaction, in order; one result each. An
// answer never raises (its fields are typed), and a locked record does not
// hold up the others.
std::vector<Recorded> RecordAnswers(const std::vector<JudgedAnswer>& answers);
// Gives back a claimed record that was never sent.
void ReleaseClaim(const ClaimedRecord& claimed);

}  // namespace billguard
