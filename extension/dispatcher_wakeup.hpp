// Waking the dispatcher after COMMIT. bill_period / bill_customer call
// billguard.wake_dispatcher(); the wake-up is sent only when the transaction
// commits, so the dispatcher never wakes to rows it cannot see yet, and a
// rolled-back billing wakes nobody. Without preloading it is a no-op: the
// dispatcher's periodic poll still finds the rows.
#pragma once

namespace billguard {

// The dispatcher publishes its latch at start and withdraws it at exit.
void PublishDispatcherLatch();
void WithdrawDispatcherLatch();

}  // namespace billguard
