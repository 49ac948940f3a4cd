// Commit-time wake-ups of await_billing() callers (see terminal_wakeups.hpp).
#include "postgres/pg_boundary.hpp"
#include "postgres/pg_compat.hpp"
#include "functions/terminal_wakeups.hpp"
#include "postgres/wait_events.hpp"
#include "postgres/sql_function.hpp"

extern "C" {
#include "access/htup_details.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"
}

namespace billguard {

namespace {

// One bit per slot in a transaction's set of slots to announce.
constexpr int kTerminalSlots = 64;

struct Slot {
  pg_atomic_uint64 commits;
  ConditionVariable committed;
};

Slot* slots = nullptr;
uint64 slots_to_announce = 0;  // of the current transaction
bool callback_registered = false;
shmem_request_hook_type previous_shmem_request_hook = nullptr;
shmem_startup_hook_type previous_shmem_startup_hook = nullptr;

constexpr const char* kShmemName = "billguard terminal wakeups";

void RequestSlots() {
  if (previous_shmem_request_hook) previous_shmem_request_hook();
  RequestAddinShmemSpace(sizeof(Slot) * kTerminalSlots);
}

void AttachSlots() {
  if (previous_shmem_startup_hook) previous_shmem_startup_hook();
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  bool found = false;
  slots = static_cast<Slot*>(ShmemInitStruct(kShmemName, sizeof(Slot) * kTerminalSlots, &found));
  if (!found) {
    for (int i = 0; i < kTerminalSlots; ++i) {
      pg_atomic_init_u64(&slots[i].commits, 0);
      ConditionVariableInit(&slots[i].committed);
    }
  }
  LWLockRelease(AddinShmemInitLock);
}

int SlotOf(std::string_view customer_id, std::string_view billing_period) {
  const uint32 customer = hash_bytes(reinterpret_cast<const unsigned char*>(customer_id.data()),
                                     static_cast<int>(customer_id.size()));
  const uint32 period = hash_bytes(reinterpret_cast<const unsigned char*>(billing_period.data()),
                                   static_cast<int>(billing_period.size()));
  return static_cast<int>(hash_combine(customer, period) % kTerminalSlots);
}

// Runs at the end of every transaction of a session that announced once.
// At COMMIT the new statuses are already visible to other sessions.
void OnTransactionEnd(XactEvent event, void* /*arg*/) {
  switch (event) {
    case XACT_EVENT_COMMIT:
      for (int i = 0; i < kTerminalSlots; ++i) {
        if ((slots_to_announce & (UINT64CONST(1) << i)) == 0) continue;
        pg_atomic_fetch_add_u64(&slots[i].commits, 1);
        ConditionVariableBroadcast(&slots[i].committed);
      }
      slots_to_announce = 0;
      break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
    case XACT_EVENT_PARALLEL_COMMIT:
    case XACT_EVENT_PARALLEL_ABORT:
      slots_to_announce = 0;
      break;
    default:
      break;
  }
}

std::string_view TextView(Datum value) {
  text* t = DatumGetTextPP(value);
  return std::string_view(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

// Plain PostgreSQL code (it may ereport), run inside CallPostgres.
void RememberSlotOfNewRow(FunctionCallInfo fcinfo) {
  if (!CALLED_AS_TRIGGER(fcinfo)) {
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("announce_terminal_status() must be called as a trigger")));
  }
  const TriggerData* trigger = reinterpret_cast<TriggerData*>(fcinfo->context);
  if (!TRIGGER_FIRED_BY_UPDATE(trigger->tg_event) || !TRIGGER_FIRED_FOR_ROW(trigger->tg_event) ||
      !TRIGGER_FIRED_BEFORE(trigger->tg_event)) {
    ereport(ERROR, (errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
                    errmsg("announce_terminal_status() must fire before the update of each row")));
  }
  if (slots == nullptr) return;
  const TupleDesc columns = RelationGetDescr(trigger->tg_relation);
  bool customer_null = false;
  bool period_null = false;
  const Datum customer = heap_getattr(trigger->tg_newtuple, SPI_fnumber(columns, "customer_id"),
                                      columns, &customer_null);
  const Datum period = heap_getattr(trigger->tg_newtuple, SPI_fnumber(columns, "billing_period"),
                                    columns, &period_null);
  if (customer_null || period_null) return;
  if (!callback_registered) {
    RegisterXactCallback(OnTransactionEnd, nullptr);
    callback_registered = true;
  }
  slots_to_announce |= UINT64CONST(1) << SlotOf(TextView(customer), TextView(period));
}

}  // namespace

void InstallTerminalWakeups() {
  previous_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = RequestSlots;
  previous_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = AttachSlots;
}

std::optional<uint64> TerminalCommits(std::string_view customer_id,
                                      std::string_view billing_period) {
  if (slots == nullptr) return std::nullopt;
  return pg_atomic_read_u64(&slots[SlotOf(customer_id, billing_period)].commits);
}

bool AwaitTerminalCommit(std::string_view customer_id, std::string_view billing_period, uint64 seen,
                         TimestampTz deadline) {
  Slot& slot = slots[SlotOf(customer_id, billing_period)];
  // On the wait list before the count is read again: a broadcast after
  // this point sets our latch.
  ConditionVariablePrepareToSleep(&slot.committed);
  bool announced = false;
  for (;;) {
    if (pg_atomic_read_u64(&slot.commits) != seen) {
      announced = true;
      break;
    }
    const long remaining_ms = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);
    if (remaining_ms <= 0) break;
    // Checks for interrupts: a cancel or statement_timeout raises here, and
    // the abort takes us off the wait list.
    ConditionVariableTimedSleep(&slot.committed, remaining_ms,
                                WaitEventOf(WaitFor::kTerminalCommit));
  }
  ConditionVariableCancelSleep();
  return announced;
}

}  // namespace billguard

// BEFORE UPDATE OF status trigger billing_records_terminal_wakeup, fired
// (its WHEN clause says) only when a record moves to a terminal status.
BILLGUARD_SQL_FUNCTION(announce_terminal_status) {
  billguard::CallPostgres([&] { billguard::RememberSlotOfNewRow(fcinfo); });
  return PointerGetDatum(reinterpret_cast<TriggerData*>(fcinfo->context)->tg_newtuple);
}
