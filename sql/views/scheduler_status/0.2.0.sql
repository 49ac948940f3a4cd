CREATE OR REPLACE VIEW billguard.scheduler_status AS
SELECT s.enabled, s.bill_day, s.bill_hour_utc, s.next_bill_at, s.last_period_issued,
       s.last_period_issued_at, s.missed_periods, s.pause_reason, s.issued_early
  FROM billguard.scheduler_state() s;
COMMENT ON VIEW billguard.scheduler_status IS
  'The scheduler of this database: enabled, when it bills next, the last period issued, older due periods never issued, why it bills nothing now, periods issued early.';
