// The dispatcher's loop (see dispatcher.hpp).
//
// Crash-only: any database error ends the worker and the postmaster starts
// it again after bgw_restart_time; rows it left 'dispatching' are re-sent
// with their stored key. Nothing here ever computes a key.
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/api_key.hpp"
#include "common/http_client.hpp"
#include "common/issuer_token.hpp"
#include "common/rate_pacer.hpp"
#include "common/stripe_request.hpp"
#include "common/stripe_response.hpp"
#include "common/vault_key_request.hpp"

#include "workers/billing_database.hpp"
#include "workers/dispatch_queue.hpp"
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

// SIGTERM: stop at the next pass of the loop, and cancel whatever the worker
// may be waiting in (a lock, a slow statement) as a query cancel would, so
// that the pass comes at once. The transaction it cancels was going to be
// lost anyway; what it would have recorded is re-sent with the same keys.
void HandleSigterm(SIGNAL_ARGS) {
  const int saved_errno = errno;
  ShutdownRequestPending = true;
  QueryCancelPending = true;
  InterruptPending = true;
  SetLatch(MyLatch);
  errno = saved_errno;
}

class Dispatcher {
 public:
  Dispatcher() : http_(settings::request_timeout_ms), pacer_(settings::max_requests_per_second) {}

  void Run() {
    pqsignal(SIGTERM, HandleSigterm);
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
        TakeFinished(http_.Poll(in_flight_.empty() ? 0 : PollMilliseconds()));
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
        if (RecordingDue(Clock::now())) RecordFinished(std::exchange(unrecorded_, {}));
        PublishStatus();
        Wait();
      }
    } catch (const PostgresError&) {
      // SIGTERM cancelled a statement or a wait (see HandleSigterm).
      if (!ShutdownRequestPending) throw;
    }
    QueryCancelPending = false;  // nothing is left to cancel, and the line below must not be
    const std::size_t unrecorded = unrecorded_.size() + deferred_.size();
    Log("stopping with " + std::to_string(in_flight_.size()) + " requests in flight" +
        (unrecorded > 0 ? " and " + std::to_string(unrecorded) + " answers not yet recorded" : "") +
        "; they are re-sent with the same key at the next start");
    http_.AbortAll();
  }

 private:
  using Clock = std::chrono::steady_clock;

  struct InFlight {
    ClaimedRecord claimed;
    bool searching = false;
    bool deferred = false;     // its row was locked when its answer came
    std::string vault_key_id;  // through the proxy: the key it was sent with
  };
  // A request that finished, its answer waiting to be recorded.
  struct Finished {
    InFlight done;
    HttpResponse response;
    Clock::time_point retry_at{};  // when deferred: the next try
    Clock::time_point taken_at{};
  };

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
    // Through the proxy, each period's vault key is obtained with the
    // issuer token; otherwise the one key of api_key_file bills everything.
    through_proxy_ = settings::vault_issuer_token_file[0] != '\0';
    vault_keys_.clear();
    std::string error;
    if (through_proxy_) {
      const IssuerTokenResult loaded = LoadIssuerToken(settings::vault_issuer_token_file);
      issuer_token_ = loaded.token;
      direct_key_ = {};
      error = loaded.error;
    } else {
      const ApiKeyResult loaded = LoadApiKey(settings::api_key_file);
      direct_key_ = VaultCredential{"", loaded.key, 0};
      issuer_token_.clear();
      error = loaded.error;
    }
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
    status.in_flight = static_cast<int>(in_flight_.size());
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
      for (const ClaimedRecord& claimed : ready_) ReleaseClaimIfFree(claimed);
      ready_.clear();
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

  // A claimed record that is not sent goes back to the queue; when its row
  // is locked it waits for its lease to run out instead.
  void ReleaseClaimIfFree(const ClaimedRecord& claimed) {
    Clock::time_point ignored{};
    UnlessLockWait("returning a claimed record to the queue", ignored,
                   [&] { ReleaseClaim(claimed); });
  }

  void Pause(const std::string& reason) {
    if (paused_ && reason == pause_reason_) return;
    paused_ = true;
    pause_reason_ = reason;
    // Claimed but unsent records go back to the queue at once, rather than
    // waiting in 'dispatching' for their lease to expire.
    for (const ClaimedRecord& claimed : ready_) ReleaseClaimIfFree(claimed);
    ready_.clear();
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
    const int claimed_unsent = static_cast<int>(ready_.size());
    const int ahead = std::max(1, settings::max_inflight / 2);
    const int per_fifth = std::max(1, static_cast<int>(pacer_.Rate(now) / 5));
    const int wanted = std::min(
        settings::max_inflight + ahead - static_cast<int>(in_flight_.size()) - claimed_unsent,
        per_fifth - claimed_unsent);
    if (wanted <= 0 || (wanted < std::min(ahead / 2, per_fifth) && claimed_unsent > 0)) {
      return false;
    }
    std::vector<ClaimedRecord> claimed = ClaimDueRecords(wanted);
    maybe_due_ = static_cast<int>(claimed.size()) == wanted;
    if (!maybe_due_) next_poll_ = now + std::chrono::milliseconds(settings::poll_interval_ms);
    for (auto& c : claimed) ready_.push_back(std::move(c));
    return true;
  }

  void SendReady() {
    bool sent = false;
    while (!ready_.empty() && !paused_ &&
           static_cast<int>(in_flight_.size()) < settings::max_inflight) {
      const auto now = Clock::now();
      if (!pacer_.Ready(now) || now < unreachable_until_) break;
      // A copy: obtaining a key may give the ready records back.
      const std::string period = ready_.front().billing_period;
      const VaultCredential* key = KeyFor(period);
      if (key == nullptr) break;  // paused or holding off: see ObtainVaultKey
      pacer_.Take(now);
      ClaimedRecord claimed = std::move(ready_.front());
      ready_.pop_front();
      const bool search = claimed.search_first;
      Send(std::move(claimed), search, *key);
      sent = true;
    }
    // Out now, not after the transactions that follow in this pass.
    if (sent) http_.Start();
  }

  void Send(ClaimedRecord claimed, bool search, const VaultCredential& key) {
    const StripeAccount account{settings::api_base, key.vault_key, settings::stripe_version,
                                kUserAgent};
    const std::uint64_t tag = next_tag_++;
    HttpRequest request =
        search
            ? SearchRequest(account, claimed.endpoint, claimed.idempotency_key, tag)
            : ChargeRequest(account, claimed.endpoint, claimed.body, claimed.idempotency_key, tag);
    in_flight_.emplace(tag, InFlight{std::move(claimed), search, false, key.key_id});
    http_.Submit(std::move(request));
    ++sent_;
  }

  // The key a request of `period` is sent with: api_key_file's, or through
  // the proxy the period's vault key, kept in memory, else in
  // billguard.vault_credentials, else obtained now. nullptr when there is
  // none to send with (the dispatcher paused or holds off).
  const VaultCredential* KeyFor(const std::string& period) {
    if (!through_proxy_) return &direct_key_;
    auto found = vault_keys_.find(period);
    if (found == vault_keys_.end()) {
      std::optional<VaultCredential> kept =
          LookupVaultCredential(settings::api_base, period, kVaultCurrency);
      if (!kept) kept = ObtainVaultKey(period);
      if (!kept) return nullptr;
      found = vault_keys_.emplace(period, std::move(*kept)).first;
    }
    return &found->second;
  }

  // POST /keys to the proxy before the period's first request: the cap is
  // the period's claimed total times vault_cap_headroom, computed in SQL.
  // A key lost (a restored database, a crash before it was stored) is
  // simply issued again: the proxy joins it to the period's budget. When
  // the budget exists with another cap (more records claimed since the
  // first key), the proxy answers 409 with that cap, and the key is asked
  // for again at it: billing goes on, and what the cap has no room for is
  // blocked. The HTTP request is made with no transaction open.
  std::optional<VaultCredential> ObtainVaultKey(const std::string& period) {
    VaultKeyAsk ask =
        VaultKeyRequestBody(period, settings::stripe_endpoint, settings::vault_cap_headroom, {});
    IssuedVaultKey issued = AskProxyForKey(ask);
    if (issued.existing_cap_cents) {
      Log("the proxy already has a budget for " + period + " with a cap of " +
          Usd(*issued.existing_cap_cents) + " USD, not the " + Usd(ask.cap_cents) +
          " USD asked (records were claimed after its first key was issued): billing joins it " +
          "at its cap, and charges past it are blocked until an admin raises the cap");
      ask = VaultKeyRequestBody(period, settings::stripe_endpoint, settings::vault_cap_headroom,
                                issued.existing_cap_cents);
      issued = AskProxyForKey(ask);
    }
    if (issued.vault_key.empty()) {
      const std::string why = "the proxy issued no vault key for " + period + " (HTTP " +
                              std::to_string(issued.http_status) + ": " + issued.message + ")";
      // A refused token or request (api_base not a proxy, say) waits for a
      // person; an unreachable or failing proxy is tried again.
      if (issued.http_status >= 400 && issued.http_status < 500) {
        Pause(why);
      } else {
        HoldOffUnreachable(why);
      }
      return std::nullopt;
    }
    VaultCredential credential{issued.key_id, issued.vault_key, ask.cap_cents};
    StoreVaultCredential(settings::api_base, period, kVaultCurrency, credential);
    Log("obtained vault key " + credential.key_id + " for " + period + ", cap " +
        Usd(credential.cap_cents) + " USD");
    return credential;
  }

  IssuedVaultKey AskProxyForKey(const VaultKeyAsk& ask) {
    HttpClient client(settings::request_timeout_ms);
    client.Submit(VaultKeyRequest(settings::api_base, issuer_token_, ask.json_body, kUserAgent));
    std::vector<HttpResponse> answers;
    while (answers.empty() && !ShutdownRequestPending) answers = client.Poll(100);
    if (answers.empty()) {
      client.AbortAll();
      return IssuedVaultKey{0, "", "", std::nullopt, "stopping"};
    }
    return ReadIssuedVaultKey(answers.front());
  }

  static std::string Usd(long long cents) {
    const long long fraction = cents % 100;
    return std::to_string(cents / 100) + (fraction < 10 ? ".0" : ".") + std::to_string(fraction);
  }

  // Moves the requests whose transfers finished out of in_flight_, and the
  // deferred answers now due, to the answers waiting to be recorded.
  void TakeFinished(std::vector<HttpResponse> responses) {
    const auto now = Clock::now();
    for (HttpResponse& response : responses) {
      auto found = in_flight_.find(response.tag);
      if (found == in_flight_.end()) continue;
      unrecorded_.push_back({std::move(found->second), std::move(response), {}, now});
      in_flight_.erase(found);
    }
    for (auto it = deferred_.begin(); it != deferred_.end();) {
      if (it->retry_at > now) {
        ++it;
        continue;
      }
      it->taken_at = now;
      unrecorded_.push_back(std::move(*it));
      it = deferred_.erase(it);
    }
  }

  bool RecordingDue(Clock::time_point now) const {
    if (unrecorded_.empty()) return false;
    const std::size_t batch = static_cast<std::size_t>(std::max(1, settings::max_inflight / 4));
    return unrecorded_.size() >= batch || in_flight_.empty() || paused_ ||
           now - unrecorded_.front().taken_at >= kRecordEvery;
  }

  // Records a batch of answers in one transaction: one commit per batch,
  // never one open while a request is in flight.
  void RecordFinished(std::vector<Finished> batch) {
    if (batch.empty()) return;

    std::vector<JudgedAnswer> judged;
    judged.reserve(batch.size());
    for (const Finished& finished : batch) {
      judged.push_back(Judge(finished));
      if (judged.back().outcome == Outcome::kBlocked) NameTheCap(judged.back());
    }
    std::vector<Recorded> recorded;
    Clock::time_point retry_at{};
    if (!UnlessLockWait("recording answers", retry_at, [&] { recorded = RecordAnswers(judged); })) {
      // Kept, and recorded once the lock is free; had the lease run out
      // first, the record would be re-sent with its key and Stripe would
      // replay the answer.
      for (Finished& finished : batch) {
        finished.retry_at = retry_at;
        deferred_.push_back(std::move(finished));
      }
      return;
    }
    for (std::size_t i = 0; i < batch.size(); ++i) {
      AfterRecording(std::move(batch[i]), judged[i], recorded[i]);
    }
  }

  static JudgedAnswer Judge(const Finished& finished) {
    JudgedAnswer judged;
    judged.claimed = &finished.done.claimed;
    judged.search = finished.done.searching;
    if (judged.search) {
      judged.found = ReadSearchAnswer(finished.response, finished.done.claimed.idempotency_key);
      judged.outcome = JudgeSearch(judged.found, finished.done.claimed.unknown_cycles,
                                   settings::max_unknown_cycles);
    } else {
      judged.charge = ReadChargeAnswer(finished.response);
      judged.outcome =
          JudgeCharge(judged.charge, finished.done.claimed.attempt, settings::max_attempts);
    }
    return judged;
  }

  // A record refused by the proxy's spend cap says which cap refused it, in
  // its last_error, its BillingBlocked event and the log.
  void NameTheCap(JudgedAnswer& judged) const {
    const ClaimedRecord& claimed = *judged.claimed;
    const auto found = vault_keys_.find(claimed.billing_period);
    std::string cap = "the period's vault cap";
    if (found != vault_keys_.end()) {
      cap +=
          " is " + Usd(found->second.cap_cents) + " USD (vault key " + found->second.key_id + ")";
    }
    judged.charge.message = PrintableExcerpt(judged.charge.message + "; " + cap, 500);
    Log(claimed.customer_id + "/" + claimed.billing_period +
        " is blocked: " + judged.charge.message);
  }

  // What follows from a recorded answer. One whose row another session
  // holds locked waits in deferred_ and is recorded on a later pass.
  void AfterRecording(Finished finished, const JudgedAnswer& judged, Recorded recorded) {
    const Outcome outcome = judged.outcome;
    const HttpResponse& response = finished.response;
    if (response.status == 0 && !response.request_sent) {
      HoldOffUnreachable(response.transport_error);
    } else if (response.status != 0) {
      unreachable_streak_ = 0;
    }
    ClaimedRecord& claimed = finished.done.claimed;
    const std::string who = claimed.customer_id + "/" + claimed.billing_period;
    if (recorded == Recorded::kStale) return;
    if (recorded == Recorded::kLocked) {
      if (!finished.done.deferred) {
        Log(who + ": another session holds its row lock; its answer is recorded once it is free");
      }
      finished.done.deferred = true;
      finished.retry_at = Clock::now() + std::chrono::seconds(1);
      deferred_.push_back(std::move(finished));
      return;
    }
    if (outcome == Outcome::kAbsent) {
      // Not found: send the charge next, same key, paced like any request.
      claimed.search_first = false;
      ready_.push_front(std::move(claimed));
      return;
    }
    // The proxy's cap is no rate limit: only Stripe's 429 slows the pace.
    if (response.status == 429 && outcome != Outcome::kBlocked &&
        (judged.search || judged.charge.error_code != kSpendCapPending)) {
      pacer_.SlowDown(Clock::now());
    }
    if (judged.search && outcome == Outcome::kNeedsReview) {
      Log(who + " is needs_review: " + judged.found.message);
    } else if (outcome == Outcome::kPaused && through_proxy_ && !judged.search &&
               judged.charge.error_code == "vault_key_expired") {
      // Recorded as not counted and due now: the next send obtains a new
      // key for the period, which joins its budget. Only the key it was
      // sent with is forgotten: answers to other requests sent with it may
      // come after a new key was obtained.
      const auto found = vault_keys_.find(claimed.billing_period);
      if (found != vault_keys_.end() && found->second.key_id == finished.done.vault_key_id) {
        Log("the vault key " + found->second.key_id + " of " + claimed.billing_period +
            " expired; obtaining a new one");
        ForgetVaultCredential(settings::api_base, claimed.billing_period, kVaultCurrency,
                              found->second.key_id);
        vault_keys_.erase(found);
      }
    } else if (outcome == Outcome::kPaused) {
      Pause(through_proxy_
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
    for (const ClaimedRecord& claimed : ready_) ReleaseClaimIfFree(claimed);
    ready_.clear();
    Log("Stripe is unreachable (" + PrintableExcerpt(why, 200) + "), nothing was sent; trying " +
        "again in " + std::to_string(seconds) + " s");
  }

  int PollMilliseconds() const {
    const auto until =
        std::chrono::duration_cast<std::chrono::milliseconds>(pacer_.UntilNext(Clock::now()));
    const bool may_send = static_cast<int>(in_flight_.size()) < settings::max_inflight;
    if (!ready_.empty() && may_send) return static_cast<int>(std::clamp<long>(until.count(), 0, 5));
    return 5;
  }

  // Sleeps until there may be work: a wake-up after a commit, the next
  // paced send, the poll interval. With requests in flight the HTTP poll
  // above was the wait, so this only collects a pending wake-up.
  void Wait() {
    long timeout_ms = 0;
    if (in_flight_.empty()) {
      const auto now = Clock::now();
      if (paused_) {
        timeout_ms = settings::poll_interval_ms;
      } else if (now < unreachable_until_) {
        timeout_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(unreachable_until_ - now).count();
      } else if (!ready_.empty()) {
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
    const bool going_idle = in_flight_.empty() && ready_.empty() && timeout_ms != 0;
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

  // The proxy's budgets are in USD (POST /keys names no currency); a record
  // in another currency is refused by it (403 currency_not_allowed) and
  // ends blocked.
  static constexpr const char* kVaultCurrency = "usd";

  HttpClient http_;
  RatePacer pacer_;
  VaultCredential direct_key_;  // api_key_file's key, when not through the proxy
  bool through_proxy_ = false;  // billguard.vault_issuer_token_file is set
  std::string issuer_token_;
  std::unordered_map<std::string, VaultCredential> vault_keys_;  // by billing period
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
  std::deque<ClaimedRecord> ready_;  // claimed, waiting for their paced start
  std::unordered_map<std::uint64_t, InFlight> in_flight_;
  std::vector<Finished> unrecorded_;  // answers waiting for RecordingDue
  std::vector<Finished> deferred_;    // answers whose row was locked
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
