// The dispatcher background worker: claims due billing records in short
// transactions, sends them to Stripe concurrently with no transaction open,
// and records every answer in a transaction of its own.
#pragma once

namespace billguard {

// Registers the worker; called from _PG_init while preloading.
void RegisterDispatcher();

// The worker's loop, until SIGTERM (dispatcher.cpp). Called by the entry
// point (dispatcher_main.cpp) once connected, inside GuardedCall.
void RunDispatcher();

}  // namespace billguard
