// A short-lived background worker of billguard's library, started by the
// process that needs it and connected to one database: a dispatcher (by the
// launcher) or a history probe (by a DROP DATABASE). The postmaster never
// restarts it, and the starter's latch is set when it starts and stops.
#pragma once

extern "C" {
#include "postgres.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
}

namespace billguard {

inline BackgroundWorker DatabaseWorker(const char* function, const char* type, const char* name,
                                       Oid database) {
  BackgroundWorker worker;
  memset(&worker, 0, sizeof(worker));
  worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
  worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
  worker.bgw_restart_time = BGW_NEVER_RESTART;
  strlcpy(worker.bgw_library_name, "billguard", BGW_MAXLEN);
  strlcpy(worker.bgw_function_name, function, BGW_MAXLEN);
  snprintf(worker.bgw_name, BGW_MAXLEN, "%s %s", type, name);
  strlcpy(worker.bgw_type, type, BGW_MAXLEN);
  worker.bgw_main_arg = ObjectIdGetDatum(database);
  worker.bgw_notify_pid = MyProcPid;
  return worker;
}

}  // namespace billguard
