// Finding out at Stripe what the attempts of a reserved Idempotency-Key
// did, with the real key. What each source can prove:
//   - Stripe's search (by the request's metadata[billguard_key]) finds a
//     charge, which is then fetched by its id (immediately consistent) to
//     see that it is charged: a fact. Search finding nothing proves
//     nothing: its index lags (about a minute, longer during incidents).
//   - The list of the request's customer's objects is immediately
//     consistent: it finds a charge the search has not indexed yet, and,
//     read back to before the reservation was made (less five minutes for
//     the two clocks) once no attempt has been forwarded for the quiet time
//     (none can still be executing), the absence there of any charge
//     carrying the key proves nothing was charged.
//   - Anything else (no metadata[billguard_key] or customer in the request,
//     an answer that is not a list, more objects than a few pages hold, an
//     attempt too recent) is uncertain.
#pragma once

#include "ledger.hpp"
#include "upstream.hpp"

namespace billguard::proxy {

// `now` and the reservation's times in Unix seconds.
Finding LookUp(const Upstream& upstream, const ReservationInDoubt& reservation, int quiet_s,
               double now);

}  // namespace billguard::proxy
