// The guard that keeps any statement from dropping billguard's billing
// history while it is not archived (history_guard.cpp).
#pragma once

namespace billguard {

// Installs the object access hook in this process; idempotent. From
// _PG_init when preloaded, else from the event trigger before every DROP.
void InstallHistoryGuard();

// The command about to run (its tag), which a refusal names.
void NameCurrentCommand(const char* tag);

}  // namespace billguard
