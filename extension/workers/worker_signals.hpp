// The signal handlers of billguard's background workers, installed in one
// place: each worker's entry point calls InstallWorkerSignals first, before
// it unblocks signals and connects.
#pragma once

namespace billguard {

enum class OnSigterm {
  // The launcher: SIGTERM ends the loop at its next pass.
  kShutdown,
  // The dispatcher (and the scheduler that runs in it): SIGTERM ends the
  // loop at its next pass, and cancels what it waits in (a lock, a slow
  // statement) as a query cancel would, so that the pass comes at once.
  // The transaction it cancels was going to be lost anyway; what it would
  // have recorded is re-sent with the same keys. Its caller catches the
  // PostgresError that the cancel raises when ShutdownRequestPending is set.
  kShutdownCancellingWaits,
  // A history probe: it holds nothing worth finishing, so PostgreSQL's
  // default for background workers ends it at once (FATAL).
  kExitAtOnce,
};

// SIGHUP sets ConfigReloadPending (but for kExitAtOnce); then signals are
// unblocked.
void InstallWorkerSignals(OnSigterm on_sigterm);

}  // namespace billguard
