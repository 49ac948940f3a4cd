// The scheduler: with billguard.auto_bill = monthly, bills the previous
// calendar month once the UTC calendar passes billguard.bill_day at
// billguard.bill_hour_utc. It runs inside each database's dispatcher, so a
// database is billed where it is served, and like the dispatcher never on a
// standby. Which period is due, and whether it was issued, is decided in SQL
// (sql/install/57_scheduler.sql); this only decides when to ask.
#pragma once

#include <string>

namespace billguard {

// One call per pass of the dispatcher's loop. Asks billguard.scheduler_tick()
// at the first pass, once the next bill instant has passed and after the
// scheduler's settings change; in between it costs a clock read.
void TickScheduler();

// What the last tick gave up waiting for ("" when it did not): a lock
// another session holds, tried again every few seconds.
const std::string& SchedulerWaitingFor();

}  // namespace billguard
