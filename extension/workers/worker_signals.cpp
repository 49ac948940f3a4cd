// The workers' signal handlers (see worker_signals.hpp).
#include "workers/worker_signals.hpp"

extern "C" {
#include "postgres.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/latch.h"
}

#include <cerrno>
#include <csignal>

namespace billguard {

namespace {

void HandleSigtermCancellingWaits(SIGNAL_ARGS) {
  const int saved_errno = errno;
  ShutdownRequestPending = true;
  QueryCancelPending = true;
  InterruptPending = true;
  SetLatch(MyLatch);
  errno = saved_errno;
}

}  // namespace

void InstallWorkerSignals(OnSigterm on_sigterm) {
  switch (on_sigterm) {
    case OnSigterm::kShutdown:
      pqsignal(SIGHUP, SignalHandlerForConfigReload);
      pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
      break;
    case OnSigterm::kShutdownCancellingWaits:
      pqsignal(SIGHUP, SignalHandlerForConfigReload);
      pqsignal(SIGTERM, HandleSigtermCancellingWaits);
      break;
    case OnSigterm::kExitAtOnce:
      break;
  }
  BackgroundWorkerUnblockSignals();
}

}  // namespace billguard
