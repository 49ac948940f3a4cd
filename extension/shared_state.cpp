// Allocation of billguard's shared memory (see shared_state.hpp).
#include "shared_state.hpp"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace billguard {

namespace {

SharedState* shared_state = nullptr;
shmem_request_hook_type previous_shmem_request_hook = nullptr;
shmem_startup_hook_type previous_shmem_startup_hook = nullptr;

void RequestSharedState() {
  if (previous_shmem_request_hook) previous_shmem_request_hook();
  RequestAddinShmemSpace(MAXALIGN(sizeof(SharedState)));
}

void AttachSharedState() {
  if (previous_shmem_startup_hook) previous_shmem_startup_hook();
  LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
  bool found = false;
  shared_state =
      static_cast<SharedState*>(ShmemInitStruct("billguard", sizeof(SharedState), &found));
  if (!found) {
    memset(shared_state, 0, sizeof(SharedState));
    SpinLockInit(&shared_state->mutex);
  }
  LWLockRelease(AddinShmemInitLock);
}

}  // namespace

void InstallSharedState() {
  previous_shmem_request_hook = shmem_request_hook;
  shmem_request_hook = RequestSharedState;
  previous_shmem_startup_hook = shmem_startup_hook;
  shmem_startup_hook = AttachSharedState;
}

SharedState* Shared() {
  return shared_state;
}

}  // namespace billguard
