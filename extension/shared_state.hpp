// billguard's shared memory: one small struct, allocated when the library is
// in shared_preload_libraries. Without preloading there is none, and every
// user of it degrades to a no-op.
#pragma once

extern "C" {
#include "postgres.h"
#include "storage/latch.h"
#include "storage/spin.h"
}

namespace billguard {

struct SharedState {
  slock_t mutex;
  Latch* dispatcher_latch;  // the running dispatcher's latch, or null
};

// Requests and initialises the shared struct; called from _PG_init.
void InstallSharedState();

// The shared struct, or nullptr when billguard was not preloaded.
SharedState* Shared();

}  // namespace billguard
