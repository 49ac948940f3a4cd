// The launcher (see launcher.hpp). It connects to no database: it reads
// pg_database, starts one dispatcher per database and watches them. A
// dispatcher started in a database without the extension leaves at once
// (the brief probe); one that finds the extension claims the database's
// entry in shared memory, so that no two ever serve one database, even when
// a restarted launcher starts one while its predecessor's still runs.
//
// Dispatchers are registered with BGW_NEVER_RESTART: the postmaster forgets
// them after a crash, so only the launcher ever starts them again, and a
// crash-restart never leaves two.
#include <algorithm>
#include <csignal>
#include <map>
#include <string>
#include <vector>

#include "postgres/pg_boundary.hpp"
#include "workers/dispatcher_main.hpp"
#include "workers/launcher.hpp"
#include "settings/settings.hpp"
#include "workers/served_databases.hpp"
#include "postgres/shared_state.hpp"
#include "postgres/wait_events.hpp"
#include "workers/worker_signals.hpp"

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

PGDLLEXPORT void billguard_launcher_main(Datum arg);
}

namespace billguard {

namespace {

// pg_database is read again this often, for databases made from a template
// that has the extension (no CREATE EXTENSION tells) and dropped ones.
constexpr long kRescanIntervalMs = 10 * 1000;
// A dispatcher that exited is started again after this, as the postmaster's
// bgw_restart_time did when it supervised the one dispatcher.
constexpr long kRestartDelayMs = 2 * 1000;
// While no background worker slot is free, a start is tried again this often.
constexpr long kSlotRetryMs = 1000;

void Log(int level, const std::string& message) {
  CallPostgres([&] { ereport(level, (errmsg("billguard launcher: %s", message.c_str()))); });
}

// A served database, as this launcher sees it (extension/workers/README.md
// draws the transitions). Whether a dispatcher of another launcher serves
// it, or a statement holds it, is read from shared memory at each pass.
enum class DatabaseState {
  kNotStarted,      // no dispatcher started here yet: the next one probes it
  kRunning,         // a dispatcher this launcher started runs (handle)
  kWaitingForSlot,  // a start found no free worker slot: tried again every kSlotRetryMs
  kRestartPending,  // its dispatcher served and stopped: started again at restart_at
  kNoExtension,     // its dispatcher found no extension: started again when an entry appears
};

// The transitions are the methods below; nothing else changes `state`.
struct Watched {
  std::string name;
  DatabaseState state = DatabaseState::kNotStarted;
  BackgroundWorkerHandle* handle = nullptr;  // kRunning
  // No start before this: set when a dispatcher that served stopped.
  TimestampTz restart_at = 0;

  // Started: any state but kRunning -> kRunning.
  void Started(BackgroundWorkerHandle* started) {
    state = DatabaseState::kRunning;
    handle = started;
  }
  // NoSlot: kNotStarted, kRestartPending, kNoExtension -> kWaitingForSlot.
  // False when it waited already (the log said so once).
  bool NoSlot() {
    const bool first = state != DatabaseState::kWaitingForSlot;
    state = DatabaseState::kWaitingForSlot;
    return first;
  }
  // Stopped: kRunning -> kRestartPending when the database has an entry
  // (its dispatcher found the extension), else kNoExtension. The handle is
  // freed.
  void Stopped(bool left_entry, TimestampTz now) {
    CallPostgres([this] { pfree(handle); });
    handle = nullptr;
    if (left_entry) {
      state = DatabaseState::kRestartPending;
      restart_at = TimestampTzPlusMilliseconds(now, kRestartDelayMs);
    } else {
      state = DatabaseState::kNoExtension;
    }
  }
  // Whether a dispatcher may be started now, given whether the database
  // has an entry (the extension, as far as shared memory knows): with one,
  // from restart_at on; without, only to probe it (kNotStarted, or waiting
  // for a slot to: an entry goes only while a dispatcher runs).
  bool MayStart(bool has_entry, TimestampTz now) const {
    if (state == DatabaseState::kRunning) return false;
    if (has_entry) return now >= restart_at;
    return state == DatabaseState::kNotStarted || state == DatabaseState::kWaitingForSlot;
  }
};

class Launcher {
 public:
  void Run() {
    Log(LOG, "started");
    while (!ShutdownRequestPending) {
      const TimestampTz now = GetCurrentTimestamp();
      if (ConfigReloadPending) {
        ConfigReloadPending = false;
        CallPostgres([] { ProcessConfigFile(PGC_SIGHUP); });
        next_rescan_ = now;  // billguard.database may have changed
      }
      const uint64 requests = CallPostgres([] { return ServiceRequests(); });
      if (now >= next_rescan_ || requests != requests_seen_ || dispatcher_stopped_) Rescan(now);
      StopUnserved();
      StartMissing(now);
      Wait(now);
    }
  }

 private:
  void Rescan(TimestampTz now) {
    requests_seen_ = CallPostgres([] { return ServiceRequests(); });
    std::map<Oid, Watched> served;
    for (const DatabaseFacts& database : ListDatabases()) {
      if (!NotServedReason(database).empty()) continue;
      auto known = databases_.find(database.oid);
      served[database.oid] = known != databases_.end() ? known->second : Watched{database.name};
      served[database.oid].name = database.name;  // ALTER DATABASE ... RENAME TO
      if (known != databases_.end()) databases_.erase(known);
    }
    // What is left was dropped or is no longer served: StopUnserved stops its dispatcher.
    for (const auto& gone : databases_) {
      if (BackgroundWorkerHandle* handle = gone.second.handle)
        CallPostgres([handle] { pfree(handle); });
    }
    databases_ = std::move(served);
    const bool nothing_to_serve = settings::database[0] != '\0' && databases_.empty();
    if (nothing_to_serve && !warned_restriction_) {
      Log(WARNING, "billguard.database is \"" + std::string(settings::database) +
                       "\", but no database of that name can be served (it does not exist, is a "
                       "template or does not allow connections)");
    }
    warned_restriction_ = nothing_to_serve;
    next_rescan_ = TimestampTzPlusMilliseconds(now, kRescanIntervalMs);
    dispatcher_stopped_ = false;
  }

  std::map<Oid, int> Entries() const {
    std::vector<EntrySummary> entries(EntryCapacity());
    const int n = CallPostgres(
        [&] { return ServedDatabases(entries.data(), static_cast<int>(entries.size())); });
    std::map<Oid, int> pids;
    for (int i = 0; i < n; ++i) pids[entries[i].database] = entries[i].pid;
    return pids;
  }

  // Entries of databases that are no longer served (dropped, turned into a
  // template, billguard.database): their dispatcher is asked to leave, and
  // the entry freed once it has.
  void StopUnserved() {
    for (const auto& [database, pid] : Entries()) {
      if (databases_.count(database) != 0) continue;
      if (pid == 0) {
        CallPostgres([database = database] { FreeEntry(database); });
      } else {
        Log(LOG, "stopping the dispatcher (pid " + std::to_string(pid) +
                     ") of a database that is no longer served");
        kill(pid, SIGTERM);
      }
    }
  }

  void StartMissing(TimestampTz now) {
    const std::map<Oid, int> entries = Entries();
    bool waiting = false;
    next_start_ = 0;
    for (auto& item : databases_) {
      const Oid database = item.first;
      Watched& watched = item.second;
      if (watched.state == DatabaseState::kRunning) {
        BackgroundWorkerHandle* handle = watched.handle;
        pid_t pid = 0;
        const BgwHandleStatus status =
            CallPostgres([handle, &pid] { return GetBackgroundWorkerPid(handle, &pid); });
        if (status != BGWH_STOPPED && status != BGWH_POSTMASTER_DIED) continue;
        // One that served is started again after a delay, so that a
        // dispatcher failing at once does not spin; its database may be
        // gone (DROP DATABASE ... WITH (FORCE)): look before starting another.
        const bool left_entry = entries.count(database) != 0;
        watched.Stopped(left_entry, now);
        if (left_entry) dispatcher_stopped_ = true;
      }
      const auto entry = entries.find(database);
      if (entry != entries.end() && entry->second != 0) continue;  // served
      // A statement that needs it without connections runs (DROP DATABASE,
      // RENAME, a TEMPLATE copy): neither a dispatcher nor a probe now.
      if (CallPostgres([database] { return IsHeld(database); })) continue;
      const bool has_entry = entry != entries.end();
      if (!watched.MayStart(has_entry, now)) {
        if (has_entry) NextStartNoLaterThan(watched.restart_at);
        continue;
      }
      if (!Start(database, watched)) {
        waiting = true;
        NextStartNoLaterThan(TimestampTzPlusMilliseconds(now, kSlotRetryMs));
      }
    }
    CallPostgres([waiting] { SetOutOfWorkerSlots(waiting); });
  }

  bool Start(Oid database, Watched& watched) {
    BackgroundWorkerHandle* handle = nullptr;
    if (!StartDispatcher(database, watched.name.c_str(), &handle)) {
      if (watched.NoSlot()) {
        Log(WARNING, "no background worker slot is free for a dispatcher in database \"" +
                         watched.name +
                         "\": billguard needs one for its launcher and one per database it "
                         "serves; raise max_worker_processes (now " +
                         std::to_string(max_worker_processes) + ") and restart the server");
      }
      return false;
    }
    if (watched.state == DatabaseState::kWaitingForSlot)
      Log(LOG, "a worker slot is free again: starting a dispatcher in \"" + watched.name + "\"");
    watched.Started(handle);
    return true;
  }

  void NextStartNoLaterThan(TimestampTz at) {
    if (next_start_ == 0 || at < next_start_) next_start_ = at;
  }

  // Until a rescan or a start is due; dispatchers that start or stop, and
  // CREATE EXTENSION billguard, set the latch.
  void Wait(TimestampTz now) {
    TimestampTz until = next_rescan_;
    if (next_start_ != 0 && next_start_ < until) until = next_start_;
    const long timeout_ms = std::max<long>(0, TimestampDifferenceMilliseconds(now, until));
    CallPostgres([timeout_ms] {
      const int rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout_ms,
                               WaitEventOf(WaitFor::kLauncherIdle));
      if (rc & WL_LATCH_SET) ResetLatch(MyLatch);
      CHECK_FOR_INTERRUPTS();
    });
  }

  std::map<Oid, Watched> databases_;  // the databases billguard serves
  TimestampTz next_rescan_ = 0;
  TimestampTz next_start_ = 0;
  uint64 requests_seen_ = 0;
  bool warned_restriction_ = false;
  bool dispatcher_stopped_ = false;
};

// Before ProcKill, while MyLatch is the shared latch that was published.
void WithdrawAtExit(int /*code*/, Datum /*arg*/) {
  WithdrawLauncher();
}

}  // namespace

void RegisterLauncher() {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof(worker));
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  // Never on a standby: the postmaster starts it once recovery has finished,
  // at a promotion too, and only then do dispatchers and schedulers run.
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = 2;  // seconds: supervised, restarted after it exits
  strlcpy(worker.bgw_library_name, "billguard", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, "billguard_launcher_main", BGW_MAXLEN);
  strlcpy(worker.bgw_name, "billguard launcher", BGW_MAXLEN);
  strlcpy(worker.bgw_type, "billguard launcher", BGW_MAXLEN);
  RegisterBackgroundWorker(&worker);
}

}  // namespace billguard

extern "C" void billguard_launcher_main(Datum /*arg*/) {
  billguard::InstallWorkerSignals(billguard::OnSigterm::kShutdown);
  // No database: pg_database is a shared catalog.
  BackgroundWorkerInitializeConnection(nullptr, nullptr, 0);
  pgstat_report_appname("billguard launcher");
  MemoryContextSwitchTo(TopMemoryContext);
  billguard::GuardedCall("launcher", [&]() -> Datum {
    billguard::CallPostgres([] {
      before_shmem_exit(billguard::WithdrawAtExit, 0);
      billguard::PublishLauncher();
    });
    billguard::Launcher().Run();
    return 0;
  });
  // Exit code 1: the postmaster starts a launcher that was stopped alone
  // again, and does not during a shutdown. Its dispatchers keep running.
  proc_exit(1);
}
