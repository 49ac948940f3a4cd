// What happens to a reserved key over time. A reservation stays reserved
// while any attempt of its key may have charged: forwarded and not
// answered (a proxy killed mid-request), or answered without a definite
// outcome (a 5xx, a timeout, a dropped connection). Stripe remembers a key
// for 24 hours, so within the proxy's idempotency window the same key is
// simply forwarded again and Stripe's answer settles it. Two things end a
// doubt without the key coming back, or once its window is past:
//   - at a request: a key still reserved past the window is never
//     forwarded blind. The proxy looks it up at Stripe first
//     (stripe_lookup.hpp): a charge found settles the reservation and is
//     replayed; proof that nothing was charged releases it and the request
//     goes on as a new one, counted again under the cap; anything
//     uncertain is answered 409 reservation_reconciling (retry later, with
//     the same key) and nothing is forwarded;
//   - in the background: every reservation whose attempts are in doubt and
//     whose last attempt is older than --reconcile-after is looked up the
//     same way, at start and then every few seconds, so an answer lost
//     with the proxy (kill -9) or a settle that found no room is learnt
//     again from Stripe, and a budget's room held by an unknown outcome
//     comes back. What stays uncertain is looked up again, less often.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "ledger.hpp"
#include "upstream.hpp"

namespace billguard::proxy {

// For an authorization whose decision is reconcile: the authorization the
// request goes on with (replayed, reserved, a refusal), or the 409.
Authorization ReconcileBeforeForwarding(Ledger& ledger, const Upstream& upstream,
                                        const ForwardedRequest& request,
                                        const Authorization& reconcile);

class Reconciler {
 public:
  // Starts the background passes.
  Reconciler(Ledger& ledger, const Upstream& upstream);
  ~Reconciler();
  Reconciler(const Reconciler&) = delete;
  Reconciler& operator=(const Reconciler&) = delete;

 private:
  void Run();
  void Pass();

  Ledger& ledger_;
  const Upstream& upstream_;
  // Reservations that stayed uncertain: when to look again, and how long
  // the next wait is.
  struct Backoff {
    double next_at = 0;
    double wait_s = 0;
  };
  std::map<std::string, Backoff> uncertain_;
  std::mutex mutex_;
  std::condition_variable stop_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace billguard::proxy
