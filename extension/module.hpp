// Module-wide state: the extension's settings (GUCs), defined in module.cpp.
#pragma once

namespace billguard::settings {

// billguard.key_namespace: the third field of every idempotency key.
extern char* key_namespace;
// billguard.snapshot_every: append_event() snapshots every N events.
extern int snapshot_every;

}  // namespace billguard::settings
