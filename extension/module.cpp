// Module initialisation (_PG_init): settings and, when preloaded, shared
// memory, the hooks and the launcher, which starts the dispatchers.
#include "functions/history_guard.hpp"
#include "functions/terminal_wakeups.hpp"
#include "postgres/pg_compat.hpp"
#include "postgres/shared_state.hpp"
#include "settings/settings.hpp"
#include "workers/dispatcher_wakeup.hpp"
#include "workers/launcher.hpp"

extern "C" {
#include "postgres.h"
#include "fmgr.h"
#include "miscadmin.h"

BILLGUARD_MODULE_MAGIC;
void _PG_init(void);
}

extern "C" void _PG_init(void) {
  if (IsBinaryUpgrade) return;
  billguard::DefineSettings();
  if (!process_shared_preload_libraries_in_progress) {
    // Loaded by a session: no dispatcher runs, so its settings do nothing.
    if (billguard::settings::api_key_file[0] != '\0') {
      ereport(WARNING,
              (errmsg("billguard dispatcher settings have no effect"),
               errdetail("billguard is not in shared_preload_libraries, so no dispatcher runs."),
               errhint("Add billguard to shared_preload_libraries and restart the server.")));
    }
    return;
  }
  billguard::InstallSharedState();
  billguard::InstallHistoryGuard();
  billguard::InstallTerminalWakeups();
  billguard::InstallCreateExtensionHook();
  billguard::RegisterLauncher();
}
