// The launcher: one background worker, registered by _PG_init and restarted
// by the postmaster, that starts a dispatcher for every database billguard
// serves (served_databases.hpp) and starts it again when it exits.
#pragma once

namespace billguard {

// Registers the launcher; called from _PG_init while preloading.
void RegisterLauncher();

}  // namespace billguard
