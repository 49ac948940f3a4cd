-- 32_clock_ahead.sql: a clock that jumps a month ahead.
--
-- Proves: a tick at a clock a month ahead bills the month early, once
-- (nothing can tell the clock is wrong at that moment); once the clock is
-- right again, due_periods() lists the period as issued_early until its
-- month has ended, and scheduler_status counts it; a period issued after
-- its month ended is not early, also when a bill_day moved later puts its
-- instant ahead again; an account added later that month
-- gets no record from the scheduler when the period is due (the period was
-- issued); bill_period bills it then, deliberately, and nothing else.
BEGIN;
SELECT plan(11);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't29\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
SELECT 't29_' || i, 'cus_t29' || i, 1000 + i, 'usd' FROM generate_series(1, 3) i;

-- The clock a month ahead: 2036-10-02 while it is 2036-09-15.
SET LOCAL billguard.scheduler_now = '2036-10-02 00:00:00+00';
SELECT results_eq($$SELECT billing_period, outcome, initiated FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2036-09'::text, 'billed'::text, 3::bigint)$$,
                  'a clock a month ahead: the tick bills 2036-09 early');

-- The clock is right again.
SET LOCAL billguard.scheduler_now = '2036-09-15 00:00:00+00';
SELECT results_eq($$SELECT billing_period, due_at, records, scheduled, issued_early FROM billguard.due_periods()$$,
                  $$VALUES ('2036-09'::text, '2036-10-01 00:00:00+00'::timestamptz, 3::bigint, false, true)$$,
                  'due_periods: 2036-09 was issued before it was due');
SELECT is((SELECT issued_early FROM billguard.scheduler_status), 1::bigint,
          'scheduler_status: one period issued early');
SELECT is(billguard.issued_early('["2036-08", "2036-09"]', '2036-09-15 00:00:00+00'), ARRAY['2036-09'],
          'issued_early: the periods whose month has not ended at the instant given');
SELECT is(billguard.issued_early('["2036-08"]', '2036-09-03 00:00:00+00'), '{}'::text[],
          'issued_early: not 2036-08 on 2036-09-03, billed on day 1 though bill_day is 5 now');

INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
VALUES ('t29_late', 'cus_t29late', 500, 'usd');

-- The period is due.
SET LOCAL billguard.scheduler_now = '2036-10-01 00:00:05+00';
SELECT results_eq($$SELECT billing_period, outcome, initiated FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2036-09'::text, 'already_issued'::text, 0::bigint)$$,
                  'when 2036-09 is due, the tick finds it issued');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't29_late'), 0::bigint,
          'the account added after the early tick has no record of 2036-09');
SELECT is((SELECT count(*) FROM billguard.due_periods() WHERE issued_early), 0::bigint,
          'due_periods: once its month has ended, 2036-09 is no longer early');
SELECT is((SELECT issued_early FROM billguard.scheduler_status), 0::bigint, 'nor does scheduler_status count it');
SELECT results_eq($$SELECT initiated, already_completed + in_progress FROM billguard.bill_period('2036-09')$$,
                  $$VALUES (1::bigint, 3::bigint)$$,
                  'bill_period bills the account added since, and only that one');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler'
            AND event_type = 'BillingTickIssued' AND event ->> 'billing_period' = '2036-09'), 1::bigint,
          '2036-09 was issued once');

SELECT * FROM finish();
ROLLBACK;
