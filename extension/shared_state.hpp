// billguard's shared memory: one small struct, allocated when the library is
// in shared_preload_libraries. Without preloading there is none, and every
// user of it degrades to a no-op.
#pragma once

extern "C" {
#include "postgres.h"
#include "storage/latch.h"
#include "storage/spin.h"
#include "utils/timestamp.h"
}

namespace billguard {

constexpr int kPauseReasonSize = 256;

struct SharedState {
  slock_t mutex;
  Latch* dispatcher_latch;  // the running dispatcher's latch, or null
  // What the dispatcher reports about itself (billguard.dispatch_status).
  int dispatcher_pid;  // 0 when it is not running
  TimestampTz dispatcher_started_at;
  bool paused;
  char pause_reason[kPauseReasonSize];
  int in_flight;
  int64 requests_sent;
};

// Requests and initialises the shared struct; called from _PG_init.
void InstallSharedState();

// The shared struct, or nullptr when billguard was not preloaded.
SharedState* Shared();

}  // namespace billguard
