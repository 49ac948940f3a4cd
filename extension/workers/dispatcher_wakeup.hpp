// Wake-ups sent when a transaction commits, never for one that rolls back:
//   billguard.wake_dispatcher()  bill_period / bill_customer wake the
//                                dispatcher of their own database, so it
//                                never wakes to rows it cannot see yet;
//   CREATE EXTENSION billguard   wakes the launcher to serve the database,
//                                without a restart (any version's script,
//                                and pg_restore's, run through it);
//   ALTER, CREATE, DROP DATABASE wake the launcher to look again: a database
//   and ALTER DATABASE ... RENAME that no longer allows connections or became
//                                a template is left at once, a copy of one
//                                with the extension is served at once.
// Without preloading neither happens, and no dispatcher runs at all.
#pragma once

namespace billguard {

// Installs the hook that sees CREATE EXTENSION and ALTER DATABASE; from _PG_init.
void InstallCreateExtensionHook();

}  // namespace billguard
