// The dispatcher's loop (see dispatcher.hpp).
//
// Crash-only: any database error ends the worker, and the launcher starts
// another after 2 s (launcher.cpp; dispatchers are registered with
// BGW_NEVER_RESTART, so the postmaster never restarts one, and after a crash
// of any process it restarts only the launcher, which starts them again).
// Rows it left 'dispatching' are re-sent with their stored key. Nothing
// here ever computes a key.
#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "common/http_client.hpp"
#include "common/rate_pacer.hpp"
#include "common/stripe_request.hpp"
#include "common/stripe_response.hpp"

#include "workers/billing_database.hpp"
#include "workers/dispatch_queue.hpp"
#include "workers/dispatch_records.hpp"
#include "workers/dispatcher.hpp"
#include "settings/dispatcher_settings.hpp"
#include "workers/lock_waits.hpp"
#include "settings/settings.hpp"
#include "postgres/pg_boundary.hpp"
#include "workers/scheduler.hpp"
#include "postgres/shared_state.hpp"
#include "workers/vault_credentials.hpp"
#include "postgres/wait_events.hpp"

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
}

namespace billguard {

namespace {

constexpr const char* kUserAgent = "billguard/" EXTVERSION " (+libcurl)";

void Log(const std::string& message) {
  CallPostgres([&] { ereport(LOG, (errmsg("billguard dispatcher: %s", message.c_str()))); });
}

// How long a step that gave up waiting for a lock waits before it is
// tried again, on top of the lock_timeout it waited already.
constexpr auto kLockRetry = std::chrono::seconds(2);

class Dispatcher {
 public:
  Dispatcher()
      : http_(settings::request_timeout_ms),
        pacer_(settings::max_requests_per_second),
        vault_keys_(kUserAgent) {}

  void Run() {
    try {
      LoadSettings();
      WaitForExtension();
      RequeueAbandonedOnce();
      CheckBillingDatabase();
      Log("started");
      CallPostgres([] { ClearDispatcherFailure(); });
      while (!ShutdownRequestPending) {
        if (ConfigReloadPending) Reload();
        if (Clock::now() >= next_identity_check_) CheckBillingDatabase();
        if (halt_reason_.empty()) TickScheduler();
        TakeFinished(http_.Poll(Transferring() ? PollMilliseconds() : 0));
        // Freed slots are refilled (from the records claimed ahead, then
        // from a claim) before anything is recorded, so that no slot idles
        // while a transaction runs.
        SendReady();
        const auto now = Clock::now();
        if (!paused_ && halt_reason_.empty() && now >= unreachable_until_ &&
            now >= claims_wait_until_ && (maybe_due_ || now >= next_poll_)) {
          bool claimed = false;
          if (UnlessLockWait("claiming due records", claims_wait_until_,
                             [&] { claimed = ClaimIntoReadyQueue(now); }) &&
              claimed) {
            // The answers that came in during the claim free slots too.
            TakeFinished(http_.Poll(0));
          }
        }
        SendReady();
        if (RecordingDue(Clock::now())) RecordAnswered(records_.TakeAnswered());
        PublishStatus();
        Wait();
      }
    } catch (const PostgresError&) {
      // SIGTERM cancelled a statement or a wait (see worker_signals.hpp).
      if (!ShutdownRequestPending) throw;
    }
    QueryCancelPending = false;  // nothing is left to cancel, and the line below must not be
    const std::size_t unrecorded = records_.answered() + records_.deferred();
    Log("stopping with " + std::to_string(records_.in_flight()) + " requests in flight" +
        (unrecorded > 0 ? " and " + std::to_string(unrecorded) + " answers not yet recorded" : "") +
        "; they are re-sent with the same key at the next start");
    http_.AbortAll();
  }

 private:
  using Clock = std::chrono::steady_clock;

  // Answers are recorded a batch at a time, a quarter of max_inflight or
  // what came in over kRecordEvery, whichever is first, so that each
  // transaction's fixed cost is shared; at once when nothing else is in
  // flight. Until then they wait in memory: one lost in a crash is re-sent
  // with its key, and Stripe replays it.
  static constexpr Clock::duration kRecordEvery = std::chrono::milliseconds(10);

  // Any reload resumes a pause when the key file (through the proxy: the
  // issuer token file) holds a usable secret: a key still refused pauses
  // again at its first 401.
  void LoadSettings() {
    http_.set_timeout_ms(settings::request_timeout_ms);
    pacer_.set_rate(settings::max_requests_per_second);
    const std::string error = vault_keys_.Load();
    if (!error.empty()) {
      Pause(error);
    } else if (paused_) {
      paused_ = false;
      pause_reason_.clear();
      maybe_due_ = true;
      Log("resumed after reloading settings");
    }
  }

  void Reload() {
    ConfigReloadPending = false;
    CallPostgres([] { ProcessConfigFile(PGC_SIGHUP); });
    RetakeDispatcherSettings();
    LoadSettings();
    unreachable_until_ = {};    // a new api_base, say: try at once
    next_identity_check_ = {};  // billguard.key_namespace may have changed
    // A fence raised with a reload stops the dispatcher before its next
    // write fails; the next one waits for the fence to be lifted. What is
    // in flight is re-sent with the same key then.
    const std::string fence = ReadOnlyFence();
    if (!fence.empty()) {
      Log(fence + "; stopping, the next dispatcher waits");
      ShutdownRequestPending = true;
    }
  }

  void PublishStatus() {
    DispatcherStatus status;
    status.paused = paused_ || !halt_reason_.empty();
    strlcpy(status.pause_reason, (halt_reason_.empty() ? pause_reason_ : halt_reason_).c_str(),
            sizeof(status.pause_reason));
    status.in_flight = static_cast<int>(records_.in_flight());
    status.requests_sent = sent_;
    const std::string& scheduler_waits = SchedulerWaitingFor();
    const std::string waiting = waiting_for_ +
                                (!waiting_for_.empty() && !scheduler_waits.empty() ? "; " : "") +
                                scheduler_waits;
    strlcpy(status.waiting_for, waiting.c_str(), sizeof(status.waiting_for));
    strlcpy(status.scheduler_pause_reason,
            (halt_reason_.empty() ? scheduler_waits : halt_reason_).c_str(),
            sizeof(status.scheduler_pause_reason));
    CallPostgres([&] { PublishDispatcherStatus(status); });
  }

  void PublishPaused(const std::string& reason) {
    DispatcherStatus status;
    status.paused = true;
    strlcpy(status.pause_reason, reason.c_str(), sizeof(status.pause_reason));
    CallPostgres([&] { PublishDispatcherStatus(status); });
  }

  // Whether this database bills its history (not a copy or a restore
  // waiting to be adopted) with a namespace no other database of the
  // cluster that has customers bills with; checked at start, every
  // poll_interval and after a reload. While it does not, it sends nothing
  // and its scheduler bills nothing: halt_reason_ says why.
  void CheckBillingDatabase() {
    next_identity_check_ = Clock::now() + std::chrono::milliseconds(settings::poll_interval_ms);
    std::string reason = BillingDatabaseProblem();
    // A database with no account and no record (the proxy's ledger, say)
    // takes no namespace. Records are never deleted: once it has customers
    // it keeps them, and is not asked again. While the accounts are locked
    // it keeps its answer.
    Clock::time_point ignored{};
    if (!has_customers_)
      UnlessLockWait("looking for accounts", ignored, [&] { has_customers_ = HasCustomers(); });
    const std::string conflict = KeyNamespaceConflict(reason.empty() && has_customers_);
    if (reason.empty()) reason = conflict;
    if (reason == halt_reason_) return;
    if (reason.empty()) {
      Log("this database bills again");
      maybe_due_ = true;
    } else {
      Log(reason);
      ReleaseReady();
    }
    halt_reason_ = reason;
    PublishStatus();
  }

  // Runs `step`; when it gave up waiting for a lock, says what it waited
  // for (dispatch_status, the log) and holds the step off until `retry_at`
  // rather than ending the worker. False when it did.
  template <typename Step>
  bool UnlessLockWait(const char* what, Clock::time_point& retry_at, Step&& step) {
    try {
      step();
    } catch (const PostgresError& error) {
      if (ShutdownRequestPending || !IsLockTimeout(error)) throw;
      const std::string waiting =
          std::string(what) + " gave up waiting " + std::to_string(kLockTimeoutMs) +
          " ms for a lock: " + DescribeLockHolders() + "; trying again every " +
          std::to_string(std::chrono::seconds(kLockRetry).count()) + " s";
      if (waiting_step_ != what) Log(waiting);
      waiting_step_ = what;
      waiting_for_ = waiting;
      retry_at = Clock::now() + kLockRetry;
      return false;
    }
    if (waiting_step_ == what) {
      Log(std::string(what) + ": the lock it waited for is free");
      waiting_step_.clear();
      waiting_for_.clear();
    }
    return true;
  }

  // At start: rows a previous dispatcher left 'dispatching' are due now.
  void RequeueAbandonedOnce() {
    Clock::time_point retry_at{};
    while (!ShutdownRequestPending) {
      long requeued = 0;
      if (UnlessLockWait("requeueing the records left dispatching", retry_at,
                         [&] { requeued = RequeueAbandoned(); })) {
        if (requeued > 0)
          Log("re-sending " + std::to_string(requeued) + " records left dispatching");
        return;
      }
      PublishStatus();
      WaitLatchFor(std::chrono::duration_cast<std::chrono::milliseconds>(kLockRetry).count());
      if (ConfigReloadPending) Reload();
    }
  }

  // Claimed records that are not sent go back to the queue; one whose row
  // is locked waits for its lease to run out instead.
  void ReleaseReady() {
    for (const ClaimedRecord& claimed : records_.Released()) {
      Clock::time_point ignored{};
      UnlessLockWait("returning a claimed record to the queue", ignored,
                     [&] { ReleaseClaim(claimed); });
    }
  }

  void Pause(const std::string& reason) {
    if (paused_ && reason == pause_reason_) return;
    paused_ = true;
    pause_reason_ = reason;
    // Claimed but unsent records go back to the queue at once, rather than
    // waiting in 'dispatching' for their lease to expire.
    ReleaseReady();
    Log("paused: " + reason + "; fix it and reload the configuration (SIGHUP)");
  }

  // The worker runs the SQL functions of its own version: after a new
  // library is installed it waits for ALTER EXTENSION billguard UPDATE,
  // rather than call functions that differ.
  void WaitForExtension() {
    std::string waiting_for;
    while (!ShutdownRequestPending) {
      const std::string installed = InstalledExtensionVersion();
      if (installed == EXTVERSION) break;
      // The next dispatcher finds no extension and leaves the database.
      if (installed.empty()) throw std::runtime_error("billguard was dropped from this database");
      const std::string reason = "waiting for ALTER EXTENSION billguard UPDATE: the database has " +
                                 installed + ", the library is " EXTVERSION;
      if (reason != waiting_for) Log(reason);
      waiting_for = reason;
      PublishPaused(reason);
      WaitLatchFor(settings::poll_interval_ms);
      if (ConfigReloadPending) Reload();
    }
    PublishStatus();
  }

  // Claims due records ahead of the free slots, in batches: up to half of
  // max_inflight beyond them, claimed once a quarter has gone, so a slot that
  // frees never waits for a claim and claims come a quarter of max_inflight
  // at a time; and no more than a fifth of a second's worth at the
  // configured rate, so a lease is never held long before its request
  // leaves. True when it ran a claim.
  bool ClaimIntoReadyQueue(Clock::time_point now) {
    const int claimed_unsent = static_cast<int>(records_.ready().size());
    const int ahead = std::max(1, settings::max_inflight / 2);
    const int per_fifth = std::max(1, static_cast<int>(pacer_.Rate(now) / 5));
    const int wanted = std::min(
        settings::max_inflight + ahead - static_cast<int>(records_.in_flight()) - claimed_unsent,
        per_fifth - claimed_unsent);
    if (wanted <= 0 || (wanted < std::min(ahead / 2, per_fifth) && claimed_unsent > 0)) {
      return false;
    }
    std::vector<ClaimedRecord> claimed = ClaimDueRecords(wanted);
    maybe_due_ = static_cast<int>(claimed.size()) == wanted;
    if (!maybe_due_) next_poll_ = now + std::chrono::milliseconds(settings::poll_interval_ms);
    for (auto& c : claimed) records_.Claimed(std::move(c));
    return true;
  }

  // Sends the ready records, paced, up to max_inflight. A record whose
  // period's vault key is being obtained stays ready and holds back no
  // other: it is sent on a pass after the key has come.
  void SendReady() {
    bool sent = false;
    sendable_ = false;
    const auto& ready = records_.ready();
    for (std::size_t next = 0; next < ready.size() && !paused_;) {
      const auto now = Clock::now();
      if (now < unreachable_until_) break;
      if (static_cast<int>(records_.in_flight()) >= settings::max_inflight || !pacer_.Ready(now)) {
        sendable_ =
            !vault_keys_.Asking() ||
            std::any_of(ready.begin() + static_cast<std::ptrdiff_t>(next), ready.end(),
                        [&](const HeldRecord& record) {
                          return !vault_keys_.AskingFor(record.claimed.billing_period,
                                                        ChargeCurrency(record.claimed.body));
                        });
        break;
      }
      const ClaimedRecord& claimed = ready[next].claimed;
      const VaultCredential* key =
          vault_keys_.KeyFor(claimed.billing_period, ChargeCurrency(claimed.body), http_);
      if (key == nullptr) {
        ++next;
        continue;
      }
      pacer_.Take(now);
      Send(next, *key);
      sent = true;
    }
    // Out now, not after the transactions that follow in this pass.
    if (sent) http_.Start();
  }

  // Whether anything is on the HTTP client: requests, or a POST /keys.
  bool Transferring() const { return records_.in_flight() > 0 || vault_keys_.Asking(); }

  // Sends the index-th ready record: a search first when it must reconcile.
  void Send(std::size_t index, const VaultCredential& key) {
    const StripeAccount account{settings::api_base, key.vault_key, settings::stripe_version,
                                kUserAgent};
    const std::uint64_t tag = next_tag_++;
    const bool search = records_.ready()[index].claimed.search_first;
    const ClaimedRecord& claimed = records_.Sent(index, tag, search, key.key_id).claimed;
    http_.Submit(search ? SearchRequest(account, claimed.endpoint, claimed.idempotency_key,
                                        claimed.stripe_account, tag)
                        : ChargeRequest(account, claimed.endpoint, claimed.body,
                                        claimed.idempotency_key, claimed.stripe_account, tag));
    ++sent_;
  }

  // The records whose requests finished are answered, and so are the
  // deferred ones now due: they wait to be recorded.
  void TakeFinished(std::vector<HttpResponse> responses) {
    const auto now = Clock::now();
    for (HttpResponse& response : responses) {
      if (VaultKeys::IsKeyAnswer(response)) {
        TakeKeyAnswer(response);
      } else {
        records_.Answered(std::move(response), now);
      }
    }
    records_.DeferralsDue(now);
  }

  void TakeKeyAnswer(const HttpResponse& response) {
    const VaultKeyAnswer answer = vault_keys_.TakeAnswer(response, http_);
    if (answer.next == VaultKeyAnswer::Next::kPause) {
      Pause(answer.why);
    } else if (answer.next == VaultKeyAnswer::Next::kHoldOff) {
      HoldOffUnreachable(answer.why);
    }
  }

  bool RecordingDue(Clock::time_point now) const {
    if (records_.answered() == 0) return false;
    const std::size_t batch = static_cast<std::size_t>(std::max(1, settings::max_inflight / 4));
    return records_.answered() >= batch || records_.in_flight() == 0 || paused_ ||
           now - records_.oldest_answer() >= kRecordEvery;
  }

  // Records a batch of answers in one transaction: one commit per batch,
  // never one open while a request is in flight.
  void RecordAnswered(std::vector<HeldRecord> batch) {
    if (batch.empty()) return;

    std::vector<JudgedAnswer> judged;
    judged.reserve(batch.size());
    for (const HeldRecord& answered : batch) {
      judged.push_back(Judge(answered));
      if (judged.back().outcome == Outcome::kBlocked) NameTheCap(judged.back());
    }
    std::vector<Recorded> recorded;
    Clock::time_point retry_at{};
    if (!UnlessLockWait("recording answers", retry_at, [&] { recorded = RecordAnswers(judged); })) {
      // Kept, and recorded once the lock is free; had the lease run out
      // first, the record would be re-sent with its key and Stripe would
      // replay the answer.
      for (HeldRecord& answered : batch) records_.RowLocked(std::move(answered), retry_at);
      return;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      AfterRecording(std::move(batch[i]), judged[i], recorded[i]);
    }
  }

  static JudgedAnswer Judge(const HeldRecord& answered) {
    JudgedAnswer judged;
    judged.claimed = &answered.claimed;
    judged.search = answered.searching;
    const bool on_connected_account = !answered.claimed.stripe_account.empty();
    if (judged.search) {
      judged.found = ReadSearchAnswer(answered.response, answered.claimed.idempotency_key);
      judged.outcome = JudgeSearch(judged.found, answered.claimed.unknown_cycles,
                                   settings::max_unknown_cycles, on_connected_account);
    } else {
      judged.charge = ReadChargeAnswer(answered.response);
      judged.outcome = JudgeCharge(judged.charge, answered.claimed.attempt, settings::max_attempts,
                                   on_connected_account);
    }
    return judged;
  }

  // A record refused by the proxy's spend cap says which cap refused it, in
  // its last_error, its BillingBlocked event and the log.
  void NameTheCap(JudgedAnswer& judged) const {
    const ClaimedRecord& claimed = *judged.claimed;
    const std::string cap =
        vault_keys_.DescribeCap(claimed.billing_period, ChargeCurrency(claimed.body));
    judged.charge.message = PrintableExcerpt(judged.charge.message + "; " + cap, 500);
    Log(claimed.customer_id + "/" + claimed.billing_period +
        " is blocked: " + judged.charge.message);
  }

  // What follows from a recorded answer. One whose row another session
  // holds locked is deferred, and recorded on a later pass.
  void AfterRecording(HeldRecord answered, const JudgedAnswer& judged, Recorded recorded) {
    const Outcome outcome = judged.outcome;
    const HttpResponse& response = answered.response;
    if (response.status == 0 && !response.request_sent) {
      HoldOffUnreachable(response.transport_error);
    } else if (response.status != 0) {
      unreachable_streak_ = 0;
    }
    const ClaimedRecord& claimed = answered.claimed;
    const std::string who = claimed.customer_id + "/" + claimed.billing_period;
    if (recorded == Recorded::kStale) return;
    if (recorded == Recorded::kLocked) {
      if (!answered.row_lock_logged) {
        Log(who + ": another session holds its row lock; its answer is recorded once it is free");
      }
      answered.row_lock_logged = true;
      records_.RowLocked(std::move(answered), Clock::now() + std::chrono::seconds(1));
      return;
    }
    if (outcome == Outcome::kAbsent) {
      // Not found: send the charge next, same key, paced like any request.
      records_.SearchedAbsent(std::move(answered));
      return;
    }
    // The proxy's cap is no rate limit: only Stripe's 429 slows the pace.
    if (response.status == 429 && outcome != Outcome::kBlocked &&
        (judged.search || judged.charge.error_code != kSpendCapPending)) {
      pacer_.SlowDown(Clock::now());
    }
    if (judged.search && outcome == Outcome::kNeedsReview) {
      Log(who + " is needs_review: " + judged.found.message);
    } else if (outcome == Outcome::kPaused && vault_keys_.through_proxy() && !judged.search &&
               judged.charge.error_code == "vault_key_expired") {
      // Recorded as not counted and due now: the next send obtains a new
      // key for the period, which joins its budget. Only the key it was
      // sent with is forgotten: answers to other requests sent with it may
      // come after a new key was obtained.
      vault_keys_.ForgetExpired(claimed.billing_period, ChargeCurrency(claimed.body),
                                answered.vault_key_id);
    } else if (outcome == Outcome::kPaused && vault_keys_.through_proxy() && !judged.search &&
               judged.charge.error_code == "stripe_account_not_allowed" &&
               vault_keys_.ForgetForAccount(claimed.billing_period, ChargeCurrency(claimed.body),
                                            answered.vault_key_id)) {
      // As for an expired key: recorded as not counted and due now, and
      // sent again with a key whose budget names the record's account.
    } else if (outcome == Outcome::kPaused) {
      Pause(vault_keys_.through_proxy()
                ? "the proxy refused the vault key of " + claimed.billing_period + " (HTTP " +
                      std::to_string(response.status) + " " + judged.charge.error_code + ")"
                : "Stripe refused the API key (HTTP " + std::to_string(response.status) + ")");
    } else if (outcome == Outcome::kFailed || outcome == Outcome::kNeedsReview ||
               outcome == Outcome::kUnknown) {
      Log(who + " is " + OutcomeName(outcome) + " after HTTP " + std::to_string(response.status) +
          (response.status == 0 ? " (" + PrintableExcerpt(response.transport_error, 200) + ")"
                                : ""));
    }
  }

  // A request that provably never left (connection refused, name not
  // resolved) means Stripe, or the way to it, is down: hold off claims and
  // sends, 1 s doubling up to 30 s, rather than spin through the queue.
  // Such attempts do not count, so an outage costs no attempt; any HTTP
  // answer or a reload ends it.
  void HoldOffUnreachable(const std::string& why) {
    const auto now = Clock::now();
    if (now < unreachable_until_) return;
    const int seconds = std::min(1 << std::min(unreachable_streak_++, 5), 30);
    unreachable_until_ = now + std::chrono::seconds(seconds);
    ReleaseReady();
    Log("Stripe is unreachable (" + PrintableExcerpt(why, 200) + "), nothing was sent; trying " +
        "again in " + std::to_string(seconds) + " s");
  }

  int PollMilliseconds() const {
    const auto until =
        std::chrono::duration_cast<std::chrono::milliseconds>(pacer_.UntilNext(Clock::now()));
    const bool may_send = static_cast<int>(records_.in_flight()) < settings::max_inflight;
    if (sendable_ && may_send) return static_cast<int>(std::clamp<long>(until.count(), 0, 5));
    return 5;
  }

  // Sleeps until there may be work: a wake-up after a commit, the next
  // paced send, the poll interval. With requests (or a POST /keys) in
  // flight the HTTP poll above was the wait, so this only collects a
  // pending wake-up.
  void Wait() {
    long timeout_ms = 0;
    if (!Transferring()) {
      const auto now = Clock::now();
      if (paused_) {
        timeout_ms = settings::poll_interval_ms;
      } else if (now < unreachable_until_) {
        timeout_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(unreachable_until_ - now).count();
      } else if (!records_.ready().empty()) {
        timeout_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(pacer_.UntilNext(now)).count();
      } else if (!maybe_due_) {
        timeout_ms = std::max<long>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(next_poll_ - now).count());
      }
    }
    // Statistics held back by pgstat_report_stat's rate limit are flushed
    // before a sleep: it measures its interval from the last commit, so an
    // idle worker would hold the end of a burst back until its next
    // transaction, and autovacuum would not see it for weeks. While busy the
    // rate limit holds, and the wait ends when the next flush is allowed.
    const bool going_idle =
        records_.in_flight() == 0 && records_.ready().empty() && timeout_ms != 0;
    const long stats_ms = CallPostgres([going_idle] { return pgstat_report_stat(going_idle); });
    if (stats_ms > 0) timeout_ms = timeout_ms > 0 ? std::min(timeout_ms, stats_ms) : timeout_ms;
    if (WaitLatchFor(timeout_ms)) maybe_due_ = true;
  }

  // True when the latch was set (a billing committed).
  bool WaitLatchFor(long timeout_ms) {
    return CallPostgres([&] {
      int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                         WaitEventOf(WaitFor::kDispatcherIdle));
      bool woken = (rc & WL_LATCH_SET) != 0;
      if (woken) ResetLatch(MyLatch);
      CHECK_FOR_INTERRUPTS();
      return woken;
    });
  }

  HttpClient http_;
  RatePacer pacer_;
  VaultKeys vault_keys_;
  bool paused_ = false;
  std::string pause_reason_;
  std::string halt_reason_;  // see CheckBillingDatabase
  bool has_customers_ = false;
  Clock::time_point next_identity_check_{};
  std::string waiting_for_;   // see UnlessLockWait
  std::string waiting_step_;  // the step that waits, "" when none does
  Clock::time_point claims_wait_until_{};
  bool maybe_due_ = true;
  Clock::time_point next_poll_{};
  DispatchRecords records_;
  bool sendable_ = false;  // a ready record has its key: see SendReady
  std::uint64_t next_tag_ = 1;
  int64 sent_ = 0;
  Clock::time_point unreachable_until_{};  // see HoldOffUnreachable
  int unreachable_streak_ = 0;
};

}  // namespace

void RunDispatcher() {
  Dispatcher().Run();
}

}  // namespace billguard
