// billguard's named wait events (see wait_events.hpp).
#include "postgres/wait_events.hpp"

#include "postgres/pg_compat.hpp"

namespace billguard {

namespace {

// Shown by pg_stat_activity.wait_event; documented in docs/operations.md.
constexpr const char* kNames[] = {
    "BillguardLauncherIdle",   "BillguardDispatcherIdle", "BillguardReadOnlyServer",
    "BillguardTerminalCommit", "BillguardDispatcherExit", "BillguardProbeSlot",
};
constexpr int kWaits = sizeof(kNames) / sizeof(kNames[0]);

// Registered once per process: the registration takes a lock.
uint32 registered[kWaits];
bool known[kWaits];

}  // namespace

uint32 WaitEventOf(WaitFor wait) {
  const int i = static_cast<int>(wait);
  if (!known[i]) {
    registered[i] = compat::WaitEventNamed(kNames[i]);
    known[i] = true;
  }
  return registered[i];
}

}  // namespace billguard
