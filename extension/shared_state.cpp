// billguard's shared memory (see shared_state.hpp).
#include "shared_state.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"
}

namespace billguard {

namespace {

struct SharedState {
  LWLock* lock;
  int launcher_pid;  // 0 while the launcher is not running
  Latch* launcher_latch;
  bool out_of_worker_slots;
  uint64 service_requests;
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
    memset(shared, 0, SharedSize());
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

void PublishDispatcherStatus(bool paused, const char* reason, int in_flight, int64 sent) {
  if (shared == nullptr) return;
  Locked locked(LW_EXCLUSIVE);
  ServedDatabase* entry = Find(MyDatabaseId);
  if (entry == nullptr || entry->pid != MyProcPid) return;
  entry->status.paused = paused;
  strlcpy(entry->status.pause_reason, reason, sizeof(entry->status.pause_reason));
  entry->status.in_flight = in_flight;
  entry->status.requests_sent = sent;
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
