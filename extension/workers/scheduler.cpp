// The scheduler (see scheduler.hpp). A tick that fails ends the dispatcher,
// crash-only like the rest of it; the next one ticks again at its start.
#include <string>

#include "settings/dispatcher_settings.hpp"
#include "workers/lock_waits.hpp"
#include "settings/settings.hpp"
#include "postgres/pg_boundary.hpp"
#include "workers/scheduler.hpp"
#include "postgres/spi_transaction.hpp"

extern "C" {
#include "datatype/timestamp.h"
#include "utils/timestamp.h"
}

namespace billguard {

namespace {

constexpr const char* kTickSql = R"(
SELECT t.billing_period, t.outcome, t.initiated, t.existing,
       to_char(t.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
       to_char(t.next_due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
       ceil(extract(epoch FROM t.next_due_at - clock_timestamp()) * 1000)::bigint,
       t.search_first_reason
  FROM billguard.scheduler_tick() t)";

// While a session bills the due period itself, the tick is tried again
// after this rather than waiting for that session's lock.
constexpr long kBusyRetryMs = 1000;
// A tick that gave up waiting for a lock (a session holding
// billguard.accounts locked, say) is tried again after this.
constexpr long kLockRetryMs = 5000;

void Log(int level, const std::string& message) {
  CallPostgres([&] { ereport(level, (errmsg("billguard scheduler: %s", message.c_str()))); });
}

// The settings a tick was computed with; a reload that changes any of them
// asks again at once.
struct SchedulerSettings {
  int auto_bill = settings::kAutoBillOff;
  int bill_day = 0;
  int bill_hour_utc = 0;
  std::string now;  // billguard.scheduler_now, "" for the clock

  // Compared with the live settings on every pass, without a copy.
  bool AreCurrent() const {
    return auto_bill == settings::auto_bill && bill_day == settings::bill_day &&
           bill_hour_utc == settings::bill_hour_utc && now == settings::scheduler_now;
  }
  static SchedulerSettings Current() {
    return {settings::auto_bill, settings::bill_day, settings::bill_hour_utc,
            settings::scheduler_now};
  }
};

class Scheduler {
 public:
  void Tick() {
    if (!started_ || !settings_.AreCurrent()) {
      const bool was_enabled = started_ && Enabled();
      settings_ = SchedulerSettings::Current();
      started_ = true;
      next_tick_ = 0;
      waiting_for_.clear();
      Announce(was_enabled);
    }
    if (!Enabled() || GetCurrentTimestamp() < next_tick_) return;
    Run();
  }

  const std::string& WaitingFor() const { return waiting_for_; }

 private:
  bool Enabled() const { return settings_.auto_bill == settings::kAutoBillMonthly; }

  void Announce(bool was_enabled) const {
    if (!Enabled()) {
      if (was_enabled) Log(LOG, "off (billguard.auto_bill)");
      return;
    }
    char when[64];
    snprintf(when, sizeof(when), "on day %d at %02d:00 UTC", settings_.bill_day,
             settings_.bill_hour_utc);
    Log(LOG, std::string("bills the previous month ") + when +
                 (settings_.now.empty() ? ""
                                        : "; billguard.scheduler_now holds now at " +
                                              settings_.now + " (for tests only)"));
  }

  void Run() {
    std::vector<SqlRow> rows;
    try {
      rows = ExecuteInTransaction(kTickSql, {});
    } catch (const PostgresError& error) {
      if (!IsLockTimeout(error)) throw;
      const std::string waiting =
          "the scheduler's tick gave up waiting " + std::to_string(kLockTimeoutMs) +
          " ms for a lock: " + DescribeLockHolders() + "; trying again every " +
          std::to_string(kLockRetryMs / 1000) + " s";
      if (waiting_for_.empty()) Log(WARNING, waiting);
      waiting_for_ = waiting;
      next_tick_ = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kLockRetryMs);
      return;
    }
    if (!waiting_for_.empty()) Log(LOG, "the lock the tick waited for is free");
    waiting_for_.clear();
    const SqlRow& row = rows.at(0);
    const std::string period = row[0].value_or("");
    const std::string outcome = row[1].value_or("");
    const std::string initiated = row[2].value_or("0");
    const std::string existing = row[3].value_or("0");
    const std::string due = period + " (due " + row[4].value_or("") + ")";
    const std::string next = "; next bill at " + row[5].value_or("");
    if (outcome == "busy") {
      if (!busy_) {
        Log(LOG, "a session is billing " + due +
                     " now, or billed a period in a transaction still open; trying again every "
                     "second");
      }
      busy_ = true;
      next_tick_ = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kBusyRetryMs);
      return;
    }
    busy_ = false;
    if (outcome == "not_billing_database") {
      // The dispatcher found it too, or will at its next look, and halts.
      Log(LOG, "bills nothing: this database is not the billing database of its history");
      next_tick_ = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), kBusyRetryMs);
      return;
    }
    if (outcome == "billed") {
      // Claimed late: each record is searched for at Stripe before it is sent.
      const std::string search_first =
          row[7] ? "; each is searched for at Stripe before any charge is sent: " + *row[7] : "";
      Log(LOG, "billed " + due + ": " + initiated + " records claimed, " + existing +
                   " existed already" + search_first + next);
    } else if (outcome == "already_issued") {
      Log(LOG, due + " was issued already" + next);
    } else if (outcome == "passed") {
      // bill_day or bill_hour_utc moved later, or the clock stepped back,
      // took the calendar back a month.
      Log(WARNING, due +
                       " is not billed: a later period was issued already, and the scheduler never "
                       "goes back to a period it passed (bill_day or bill_hour_utc moved later, or "
                       "the clock went back; billguard.due_periods() lists it if it was missed; "
                       "bill_period bills it deliberately)" +
                       next);
    } else {
      Log(WARNING, "billing-scheduler's state does not list " + due +
                       " as issued, yet billing_records held all " + existing +
                       " of its records: nothing was claimed (billing_records decides; a stale "
                       "or older snapshot of billing-scheduler, or bill_customer for every "
                       "account, explains it)" +
                       next);
    }
    // A clock held still by billguard.scheduler_now never reaches the next
    // instant: only a change of the settings brings another tick.
    next_tick_ = settings_.now.empty() ? TimestampTzPlusMilliseconds(
                                             GetCurrentTimestamp(), std::stol(row[6].value_or("0")))
                                       : DT_NOEND;
  }

  bool started_ = false;
  bool busy_ = false;        // the last tick found the period's lock taken
  std::string waiting_for_;  // the lock the last tick gave up waiting for
  SchedulerSettings settings_;
  TimestampTz next_tick_ = 0;  // the clock's instant of the next tick
};

Scheduler scheduler;

}  // namespace

void TickScheduler() {
  scheduler.Tick();
}

const std::string& SchedulerWaitingFor() {
  return scheduler.WaitingFor();
}

}  // namespace billguard
