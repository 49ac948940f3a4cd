// billguard's shared memory (see shared_state.hpp).
#include "postgres/shared_state.hpp"

#include <cerrno>
#include <csignal>

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"
}

namespace billguard {

namespace {

// A database held by a backend (see HoldDatabase).
struct Hold {
  Oid database;
  int holder_pid;
  HistoryProbe probe;
};

struct SharedState {
  LWLock* lock;
  int launcher_pid;  // 0 while the launcher is not running
  Latch* launcher_latch;
  bool out_of_worker_slots;
  uint64 service_requests;
  Hold holds[kMaxHolds];
  int capacity;  // entries that follow this struct
};

SharedState* shared = nullptr;
ServedDatabase* entries = nullptr;
shmem_request_hook_type previous_shmem_request_hook = nullptr;
shmem_startup_hook_type previous_shmem_startup_hook = nullptr;

constexpr const char* kName = "billguard";

// Every served database needs a worker slot; the launcher takes one of them.
int Capacity() {
  return max_worker_processes;
}

Size SharedSize() {
  return add_size(MAXALIGN(sizeof(SharedState)), mul_size(Capacity(), sizeof(ServedDatabase)));
}

void RequestSharedState() {
  if (previous_shmem_request_hook) previous_shmem_request_hook();
  RequestAddinShmemSpace(SharedSize());
  RequestNamedLWLockTranche(kName, 1);
}

void AttachSharedState() {
  if (previous_shmem_startup_hook) previous_shmem_startup_hook();
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  bool found = false;
  shared = static_cast<SharedState*>(ShmemInitStruct(kName, SharedSize(), &found));
  entries = reinterpret_cast<ServedDatabase*>(reinterpret_cast<char*>(shared) +
                                              MAXALIGN(sizeof(SharedState)));
  if (!found) {
    memset(static_cast<void*>(shared), 0, SharedSize());
    shared->lock = &(GetNamedLWLockTranche(kName))->lock;
    shared->capacity = Capacity();
  }
  LWLockRelease(AddinShmemInitLock);
}

ServedDatabase* Find(Oid database) {
  for (int i = 0; i < shared->capacity; ++i) {
    if (entries[i].database == database) return &entries[i];
  }
  return nullptr;
}

ServedDatabase* FindOrAdd(Oid database) {
  ServedDatabase* entry = Find(database);
  if (entry == nullptr) entry = Find(InvalidOid);
  if (entry != nullptr && entry->database == InvalidOid) {
    *entry = ServedDatabase();
    entry->database = database;
  }
  return entry;
}

void WakeLauncherLocked() {
  if (shared->launcher_latch != nullptr) SetLatch(shared->launcher_latch);
}

// The lock is taken briefly and nothing under it can raise an error.
class Locked {
 public:
  explicit Locked(LWLockMode mode) { LWLockAcquire(shared->lock, mode); }
  ~Locked() { LWLockRelease(shared->lock); }
  Locked(const Locked&) = delete;
  Locked& operator=(const Locked&) = delete;
};

}  // namespace

void InstallSharedState() {
  previous_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = RequestSharedState;
  previous_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = AttachSharedState;
}

Claim ClaimDatabase(int* other_pid) {
  if (shared == nullptr) return Claim::kClaimed;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = FindOrAdd(MyDatabaseId);
  if (entry == nullptr) return Claim::kNoRoom;
  if (entry->pid != 0) {
    *other_pid = entry->pid;
    return Claim::kServedByAnother;
  }
  entry->pid = MyProcPid;
  entry->latch = MyLatch;
  entry->started_at = GetCurrentTimestamp();
  entry->status = DispatcherStatus();
  return Claim::kClaimed;
}

void ReleaseDatabase() {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(MyDatabaseId);
  if (entry == nullptr || entry->pid != MyProcPid) return;
  entry->pid = 0;
  entry->latch = nullptr;
  entry->started_at = 0;
  entry->status = DispatcherStatus();
  WakeLauncherLocked();
}

void PublishDispatcherStatus(const DispatcherStatus& status) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(MyDatabaseId);
  if (entry == nullptr || entry->pid != MyProcPid) return;
  entry->status = status;
}

void PublishDispatcherFailure(const char* message) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(MyDatabaseId);
  if (entry == nullptr || (entry->pid != MyProcPid && entry->pid != 0)) return;
  strlcpy(entry->last_failure, message, sizeof(entry->last_failure));
  entry->last_failure_at = GetCurrentTimestamp();
  ++entry->failures;
}

void ClearDispatcherFailure() {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(MyDatabaseId);
  if (entry == nullptr || entry->pid != MyProcPid) return;
  entry->last_failure[0] = '\0';
  entry->last_failure_at = 0;
  entry->failures = 0;
}

Oid ClaimKeyNamespace(bool bills, const char* key_namespace) {
  if (shared == nullptr) return InvalidOid;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(MyDatabaseId);
  if (entry == nullptr || entry->pid != MyProcPid) return InvalidOid;
  entry->bills = bills;
  strlcpy(entry->key_namespace, key_namespace, sizeof(entry->key_namespace));
  if (!bills) return InvalidOid;
  Oid first = InvalidOid;
  for (int i = 0; i < shared->capacity; ++i) {
    const ServedDatabase& other = entries[i];
    if (other.database == InvalidOid || other.database == MyDatabaseId || !other.bills) continue;
    if (strcmp(other.key_namespace, entry->key_namespace) != 0) continue;
    if (other.database < MyDatabaseId && (first == InvalidOid || other.database < first))
      first = other.database;
  }
  return first;
}

uint64 ServiceRequests() {
  if (shared == nullptr) return 0;
  Locked locked(LW_SHARED);
  return shared->service_requests;
}

void ForgetDatabase(Oid database, uint64 requests_seen) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(database);
  if (entry != nullptr && entry->pid == 0 && shared->service_requests == requests_seen)
    *entry = ServedDatabase();
}

void WakeDispatcherOf(Oid database) {
  if (shared == nullptr) return;
  // Under the lock the latch's owner cannot withdraw it: it is set while
  // it still belongs to that dispatcher.
  Locked locked(LW_SHARED);
  ServedDatabase* entry = Find(database);
  if (entry != nullptr && entry->latch != nullptr) SetLatch(entry->latch);
}

void RequestService(Oid database) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ++shared->service_requests;
  FindOrAdd(database);  // no room: the launcher's rescan still finds it
  WakeLauncherLocked();
}

void RequestRescan() {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ++shared->service_requests;
  WakeLauncherLocked();
}

void PublishLauncher() {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  shared->launcher_pid = MyProcPid;
  shared->launcher_latch = MyLatch;
}

void WithdrawLauncher() {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  if (shared->launcher_pid != MyProcPid) return;
  shared->launcher_pid = 0;
  shared->launcher_latch = nullptr;
  shared->out_of_worker_slots = false;
}

int ServedDatabases(EntrySummary* out, int capacity) {
  if (shared == nullptr) return 0;
  Locked locked(LW_SHARED);
  int n = 0;
  for (int i = 0; i < shared->capacity && n < capacity; ++i) {
    if (entries[i].database != InvalidOid) out[n++] = {entries[i].database, entries[i].pid};
  }
  return n;
}

int EntryCapacity() {
  return shared == nullptr ? 0 : shared->capacity;
}

void FreeEntry(Oid database) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(database);
  if (entry != nullptr && entry->pid == 0) *entry = ServedDatabase();
}

void SetOutOfWorkerSlots(bool out) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  shared->out_of_worker_slots = out;
}

bool HoldDatabase(Oid database) {
  if (shared == nullptr) return true;
  Locked locked(LW_EXCLUSIVE);
  for (Hold& hold : shared->holds) {
    if (hold.holder_pid == 0) {
      hold = {database, MyProcPid, HistoryProbe()};
      return true;
    }
  }
  return false;
}

void ReleaseHolds() {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  bool released = false;
  for (Hold& hold : shared->holds) {
    if (hold.holder_pid != MyProcPid) continue;
    hold = {InvalidOid, 0, HistoryProbe()};
    released = true;
  }
  if (!released) return;
  // A renamed or copied database is served again; a dropped one forgotten.
  ++shared->service_requests;
  WakeLauncherLocked();
}

void PublishHistoryProbe(Oid database, int holder_pid, const HistoryProbe& probe) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  for (Hold& hold : shared->holds) {
    if (hold.holder_pid == holder_pid && hold.database == database) hold.probe = probe;
  }
}

HistoryProbe TakeHistoryProbe(Oid database) {
  if (shared == nullptr) return HistoryProbe();
  Locked locked(LW_SHARED);
  for (const Hold& hold : shared->holds) {
    if (hold.holder_pid == MyProcPid && hold.database == database) return hold.probe;
  }
  return HistoryProbe();
}

bool IsHeld(Oid database) {
  if (shared == nullptr) return false;
  Locked locked(LW_EXCLUSIVE);
  bool held = false;
  for (Hold& hold : shared->holds) {
    if (hold.holder_pid == 0 || hold.database != database) continue;
    // A backend that ended without releasing (a crash restart frees the
    // whole table) holds nothing.
    if (kill(hold.holder_pid, 0) != 0 && errno == ESRCH) {
      hold = {InvalidOid, 0, HistoryProbe()};
      continue;
    }
    held = true;
  }
  return held;
}

int DispatcherPidOf(Oid database) {
  if (shared == nullptr) return 0;
  Locked locked(LW_SHARED);
  const ServedDatabase* entry = Find(database);
  return entry != nullptr ? entry->pid : 0;
}

ServiceReport ReportService(Oid database) {
  ServiceReport report;
  if (shared == nullptr) return report;
  report.preloaded = true;
  Locked locked(LW_SHARED);
  report.launcher_running = shared->launcher_pid != 0;
  report.out_of_worker_slots = shared->out_of_worker_slots;
  report.no_free_entry = Find(InvalidOid) == nullptr;
  if (const ServedDatabase* entry = Find(database)) {
    report.has_entry = true;
    report.entry = *entry;
  }
  return report;
}

}  // namespace billguard
