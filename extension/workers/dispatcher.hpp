// The dispatcher background worker: claims due billing records in short
// transactions, sends them to Stripe concurrently with no transaction open,
// and records every answer in a transaction of its own.
#pragma once

namespace billguard {

// The worker's loop, until SIGTERM (dispatcher.cpp). Called by the entry
// point (dispatcher_main.cpp) once it serves its database, inside GuardedCall.
void RunDispatcher();

}  // namespace billguard
