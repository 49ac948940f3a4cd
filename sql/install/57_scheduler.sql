-- The scheduler: with billguard.auto_bill = monthly, each database's
-- dispatcher bills the previous calendar month once the UTC calendar passes
-- bill_day at bill_hour_utc (extension/scheduler.cpp calls scheduler_tick()).
-- Which period is due follows from the calendar alone, never from when a
-- worker started. The guard is the period's BillingTickIssued on
-- billing-scheduler; billing_records stays the authority when the journal
-- or a snapshot is wrong.

\ir ../udfs/scheduler_settings/latest.sql
\ir ../udfs/bill_instant/latest.sql
\ir ../udfs/scheduler_calendar/latest.sql
\ir ../udfs/current_schedule/latest.sql
\ir ../udfs/issued_after/latest.sql
\ir ../udfs/scheduler_tick/latest.sql
\ir ../udfs/never_issued/latest.sql
\ir ../udfs/issued_early/latest.sql
\ir ../udfs/due_periods/latest.sql
\ir ../udfs/scheduler_state/latest.sql
\ir ../views/scheduler_status/latest.sql
