// Commit-time wake-up of the dispatcher (see dispatcher_wakeup.hpp).
#include "dispatcher_wakeup.hpp"

#include "pg_boundary.hpp"
#include "shared_state.hpp"

extern "C" {
#include "access/xact.h"
#include "miscadmin.h"

PG_FUNCTION_INFO_V1(billguard_wake_dispatcher);
}

namespace billguard {

namespace {

bool wake_at_commit = false;
bool callback_registered = false;

void WakeDispatcherNow() {
  SharedState* shared = Shared();
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  Latch* latch = shared->dispatcher_latch;
  SpinLockRelease(&shared->mutex);
  // A stale latch (dispatcher just exited) only causes one spurious wake-up.
  if (latch != nullptr) SetLatch(latch);
}

void OnTransactionEnd(XactEvent event, void* /*arg*/) {
  switch (event) {
    case XACT_EVENT_COMMIT:
      if (wake_at_commit) WakeDispatcherNow();
      wake_at_commit = false;
      break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
      wake_at_commit = false;
      break;
    default:
      break;
  }
}

}  // namespace

void PublishDispatcherLatch() {
  SharedState* shared = Shared();
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  shared->dispatcher_latch = MyLatch;
  SpinLockRelease(&shared->mutex);
}

void WithdrawDispatcherLatch() {
  SharedState* shared = Shared();
  if (shared == nullptr) return;
  SpinLockAcquire(&shared->mutex);
  if (shared->dispatcher_latch == MyLatch) shared->dispatcher_latch = nullptr;
  SpinLockRelease(&shared->mutex);
}

}  // namespace billguard

// billguard.wake_dispatcher(): ask for a wake-up when this transaction commits.
extern "C" Datum billguard_wake_dispatcher(PG_FUNCTION_ARGS) {
  return billguard::GuardedCall("wake_dispatcher", [&]() -> Datum {
    if (!billguard::callback_registered) {
      billguard::CallPostgres([] { RegisterXactCallback(billguard::OnTransactionEnd, nullptr); });
      billguard::callback_registered = true;
    }
    billguard::wake_at_commit = true;
    PG_RETURN_VOID();
  });
}
