// Reservations in doubt, looked up at Stripe (see reconciler.hpp).
#include "reconciler.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <set>

#include "stripe_errors.hpp"
#include "stripe_lookup.hpp"
#include "stripe_response.hpp"

namespace billguard::proxy {

namespace {

// A pass looks up this many reservations at most, paced below Stripe's 20
// searches a second, among the oldest kListed in doubt (those waiting for
// their next look must not keep newer ones from theirs).
constexpr int kPerPass = 50;
constexpr int kListed = 2000;
constexpr auto kBetweenLookups = std::chrono::milliseconds(100);
constexpr double kLongestWaitSeconds = 3600;

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Records a finding and counts its outcome; logs what changed.
std::string Record(Ledger& ledger, const ReservationInDoubt& r, const Finding& finding) {
  const std::string outcome = ledger.Reconcile(r, finding);
  LedgerCounters& counters = ledger.counters();
  if (outcome == "settled") ++counters.reconciled_settled;
  if (outcome == "released") ++counters.reconciled_released;
  if (outcome == "unknown") ++counters.reconciled_unknown;
  if (outcome == "stale") ++counters.reconciled_stale;
  if (outcome == "settled" || outcome == "released") {
    std::fprintf(stderr, "billguard-proxy: reconciled %s of %s with Stripe: %s (%s)\n",
                 r.idempotency_key.c_str(), r.key_id.c_str(), outcome.c_str(),
                 finding.reason.c_str());
  }
  return outcome;
}

Authorization Reconciling(const std::string& idempotency_key, const std::string& why) {
  Authorization refusal;
  refusal.decision = "refused";
  refusal.http_status = 409;
  refusal.should_retry = true;
  refusal.body = StripeErrorBody(
      "api_error", kReservationReconciling,
      "Idempotency-Key " + idempotency_key +
          " is still reserved past the proxy's idempotency window, and what its attempts did "
          "is not known yet: " +
          why + ". Nothing was sent to Stripe; retry later with the same Idempotency-Key.");
  return refusal;
}

}  // namespace

Authorization ReconcileBeforeForwarding(Ledger& ledger, const Upstream& upstream,
                                        const ForwardedRequest& request,
                                        const Authorization& reconcile) {
  Authorization current = reconcile;
  // Twice at most: a newer attempt of the key (another client) may make a
  // first finding stale.
  for (int round = 0; round < 2 && current.decision == "reconcile"; ++round) {
    const Finding finding =
        LookUp(upstream, current.in_doubt, ledger.policy().reconcile_after_s, Now());
    if (Record(ledger, current.in_doubt, finding) == "unknown") {
      return Reconciling(current.in_doubt.idempotency_key, finding.reason);
    }
    current = ledger.Authorize(request);
  }
  if (current.decision == "reconcile") {
    return Reconciling(current.in_doubt.idempotency_key,
                       "other attempts of the key came meanwhile");
  }
  return current;
}

Reconciler::Reconciler(Ledger& ledger, const Upstream& upstream)
    : ledger_(ledger), upstream_(upstream), thread_([this] { Run(); }) {}

Reconciler::~Reconciler() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_.notify_all();
  thread_.join();
}

void Reconciler::Run() {
  // A quarter of the quiet time between passes, from 1 to 30 seconds: the
  // first pass at start settles what a killed proxy left in doubt.
  const auto between =
      std::chrono::milliseconds(std::clamp(ledger_.policy().reconcile_after_s * 250, 1000, 30000));
  bool failing = false;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    try {
      Pass();
      failing = false;
    } catch (const std::exception& e) {
      // The database away: the next pass tries again; said once.
      const std::string message = e.what();
      if (!failing) {
        std::fprintf(stderr, "billguard-proxy: the reconciler waits for the database: %s\n",
                     message.substr(0, message.find('\n')).c_str());
      }
      failing = true;
    }
    lock.lock();
    stop_.wait_for(lock, between, [&] { return stopping_; });
  }
}

void Reconciler::Pass() {
  const std::vector<ReservationInDoubt> in_doubt = ledger_.ReservationsInDoubt(kListed);
  std::set<std::string> current;
  int looked_up = 0;
  const double first_wait = std::max(4.0, ledger_.policy().reconcile_after_s / 2.0);
  for (const ReservationInDoubt& r : in_doubt) {
    const std::string name = r.key_id + "/" + r.idempotency_key;
    current.insert(name);
    Backoff& backoff = uncertain_[name];
    const double now = Now();
    if (backoff.next_at > now || looked_up == kPerPass) continue;
    ++looked_up;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_.wait_for(lock, kBetweenLookups, [&] { return stopping_; })) return;
    }
    const Finding finding = LookUp(upstream_, r, ledger_.policy().reconcile_after_s, Now());
    if (Record(ledger_, r, finding) != "unknown") {
      uncertain_.erase(name);
      continue;
    }
    if (backoff.wait_s == 0) {
      std::fprintf(stderr, "billguard-proxy: %s of %s stays reserved, outcome unknown: %s\n",
                   r.idempotency_key.c_str(), r.key_id.c_str(), finding.reason.c_str());
    }
    backoff.wait_s =
        std::min(kLongestWaitSeconds, backoff.wait_s == 0 ? first_wait : backoff.wait_s * 2);
    backoff.next_at = Now() + backoff.wait_s;
  }
  // Forget the reservations that left the list (settled meanwhile).
  for (auto it = uncertain_.begin(); it != uncertain_.end();) {
    it = current.count(it->first) != 0 ? std::next(it) : uncertain_.erase(it);
  }
}

}  // namespace billguard::proxy
