-- 25_scheduler.sql: the scheduler's calendar, its tick, due_periods() and
-- scheduler_status, in SQL (the dispatcher that ticks is test/t/160..163).
--
-- Proves: the calendar bills the previous month from bill_hour_utc on
-- bill_day, exactly at the instant and not a microsecond before, across a
-- year's end, on day 28 of February, whatever the session's TimeZone, and
-- refuses impossible days and hours (22023); billguard.scheduler_now holds
-- the scheduler's now, refuses values that are not a fixed instant (22023)
-- and is refused to non-superusers (42501); scheduler_tick bills the most
-- recent due period once (one BillingTickIssued), then answers
-- already_issued however often it runs, keeps what bill_customer claimed
-- earlier, and never bills a period whose records all exist when a stale
-- snapshot lost its tick (already_billed, nothing claimed), nor goes back to
-- a period older than one issued after its month ended (issued_after(): a
-- period billed in advance does not count); due_periods()
-- lists the due periods never issued, oldest first, from the first issued
-- one, and a deliberate bill_period takes one off the list;
-- scheduler_status shows the last period issued, and no next instant while
-- auto_bill is off; a tick more than billguard.idempotency_window after the
-- period became due marks each record it claims to be searched for first
-- (search_first_reason, the reason), and claim_due_records searches for
-- them on every claim, also after a lease ran out; one exactly at the
-- window, and bill_period, do not.
BEGIN;
SELECT plan(54);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't25\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
SELECT 't25_' || i, 'cus_t25' || i, 1000 + i, 'usd' FROM generate_series(1, 3) i;

------------------------------------------------------------------------------
-- The calendar.
SELECT results_eq($$SELECT * FROM billguard.scheduler_calendar('2026-09-01 00:00:00+00', 1, 0)$$,
                  $$VALUES ('2026-08'::text, '2026-09-01 00:00:00+00'::timestamptz,
                            '2026-10-01 00:00:00+00'::timestamptz)$$,
                  'calendar: at the instant of day 1, 00:00 UTC, the previous month is due');
SELECT results_eq($$SELECT * FROM billguard.scheduler_calendar('2026-08-31 23:59:59.999999+00', 1, 0)$$,
                  $$VALUES ('2026-07'::text, '2026-08-01 00:00:00+00'::timestamptz,
                            '2026-09-01 00:00:00+00'::timestamptz)$$,
                  'calendar: a microsecond before it, the month before that');
SELECT results_eq($$SELECT * FROM billguard.scheduler_calendar('2027-01-01 00:00:00+00', 1, 0)$$,
                  $$VALUES ('2026-12'::text, '2027-01-01 00:00:00+00'::timestamptz,
                            '2027-02-01 00:00:00+00'::timestamptz)$$,
                  'calendar: December is billed in the new year');
SELECT results_eq($$SELECT * FROM billguard.scheduler_calendar('2027-01-15 09:59:59+00', 15, 10)$$,
                  $$VALUES ('2026-11'::text, '2026-12-15 10:00:00+00'::timestamptz,
                            '2027-01-15 10:00:00+00'::timestamptz)$$,
                  'calendar: day 15 at 10:00, just before it in January: November');
SELECT results_eq($$SELECT * FROM billguard.scheduler_calendar('2026-02-28 23:00:00+00', 28, 23)$$,
                  $$VALUES ('2026-01'::text, '2026-02-28 23:00:00+00'::timestamptz,
                            '2026-03-28 23:00:00+00'::timestamptz)$$,
                  'calendar: day 28 at 23:00 exists in February');
SELECT results_eq($$SELECT * FROM billguard.scheduler_calendar('2026-09-01 01:30:00+02', 1, 0)$$,
                  $$VALUES ('2026-07'::text, '2026-08-01 00:00:00+00'::timestamptz,
                            '2026-09-01 00:00:00+00'::timestamptz)$$,
                  'calendar: 01:30 at +02 is still August in UTC');
SET LOCAL TimeZone = 'Pacific/Kiritimati';
SELECT results_eq($$SELECT due_period, due_at FROM billguard.scheduler_calendar('2026-09-01 00:00:00+00', 1, 0)$$,
                  $$VALUES ('2026-08'::text, '2026-09-01 00:00:00+00'::timestamptz)$$,
                  'calendar: the session''s TimeZone (+14) changes nothing');
RESET TimeZone;
SELECT is(billguard.bill_instant('2026-12', 1, 0), '2027-01-01 00:00:00+00'::timestamptz,
          'bill_instant: 2026-12 is due on 2027-01-01 at 00:00 UTC');
SELECT throws_ok($$SELECT * FROM billguard.scheduler_calendar(now(), 29, 0)$$, '22023',
                 'bill_day must be 1..28 and bill_hour_utc 0..23, got 29 and 0',
                 'calendar: day 29 refused');
SELECT throws_ok($$SELECT * FROM billguard.scheduler_calendar(now(), 1, 24)$$, '22023',
                 'bill_day must be 1..28 and bill_hour_utc 0..23, got 1 and 24',
                 'calendar: hour 24 refused');

------------------------------------------------------------------------------
-- The settings and the scheduler's now.
SELECT results_eq($$SELECT auto_bill, bill_day, bill_hour_utc, now = pg_catalog.now()
                      FROM billguard.scheduler_settings()$$,
                  $$VALUES ('off'::text, 1, 0, true)$$,
                  'settings: off, day 1, 00:00 UTC, and the clock (the transaction''s now) by default');
SET LOCAL billguard.scheduler_now = '2035-02-01 00:00:00+00';
SELECT is((SELECT now FROM billguard.scheduler_settings()), '2035-02-01 00:00:00+00'::timestamptz,
          'settings: billguard.scheduler_now holds now');
SELECT throws_ok(format('SET LOCAL billguard.scheduler_now = %L', v), '22023',
                 'invalid value for parameter "billguard.scheduler_now": "' || v || '"',
                 'scheduler_now: ' || v || ' refused')
  FROM unnest(ARRAY['now', 'today', 'epoch', '2035-02-30 00:00:00+00', 'next tuesday']) AS v;
CREATE ROLE t25_operator NOLOGIN;
GRANT USAGE ON SCHEMA billguard TO t25_operator;
SET LOCAL ROLE t25_operator;
SELECT throws_ok($$SET billguard.scheduler_now = '2035-03-01 00:00:00+00'$$, '42501',
                 'permission denied to set parameter "billguard.scheduler_now"',
                 'scheduler_now: a role that is not a superuser cannot hold the clock');
RESET ROLE;
SELECT is((SELECT now FROM billguard.scheduler_settings()), '2035-02-01 00:00:00+00'::timestamptz,
          'scheduler_now: unchanged by the refusals');

------------------------------------------------------------------------------
-- The tick.
SELECT results_eq($$SELECT billing_period, outcome, initiated, existing, due_at, next_due_at
                      FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-01'::text, 'billed'::text, 3::bigint, 0::bigint,
                            '2035-02-01 00:00:00+00'::timestamptz, '2035-03-01 00:00:00+00'::timestamptz)$$,
                  'tick: 2035-01 billed, three records claimed');
SELECT results_eq($$SELECT billing_period, outcome, initiated, existing FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-01'::text, 'already_issued'::text, 0::bigint, 0::bigint)$$,
                  'tick again: already_issued, nothing claimed');
SET LOCAL billguard.scheduler_now = '2035-02-27 12:00:00+00';
SELECT results_eq($$SELECT billing_period, outcome FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-01'::text, 'already_issued'::text)$$,
                  'tick later in the month: still 2035-01, already_issued');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler'
             AND event_type = 'BillingTickIssued' AND event ->> 'billing_period' = '2035-01'), 1::bigint,
          'one BillingTickIssued for 2035-01');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2035-01'), 3::bigint,
          'one record per account for 2035-01');

-- bill_customer during February; the tick of March 1 bills the others.
SELECT is((SELECT status FROM billguard.bill_customer('t25_1', '2035-02')), 'initiated',
          'bill_customer claims t25_1 for 2035-02 before its bill instant');
SET LOCAL billguard.scheduler_now = '2035-03-01 00:00:00+00';
SELECT results_eq($$SELECT billing_period, outcome, initiated, existing FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-02'::text, 'billed'::text, 2::bigint, 1::bigint)$$,
                  'tick at 2035-03-01: 2035-02 billed for the two others; t25_1''s record kept');

-- A stale snapshot of an older state version that lacks the issued periods.
INSERT INTO billguard.snapshots (persistence_id, seq_nr, state, state_version)
VALUES ('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
        '{"entity": "billing-scheduler"}', 1);
SELECT ok(NOT (billguard.entity_state('billing-scheduler') -> 'issued_periods') ? '2035-02',
          'the stale snapshot hides that 2035-02 was issued');
SELECT results_eq($$SELECT billing_period, outcome, initiated, existing FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-02'::text, 'already_billed'::text, 0::bigint, 3::bigint)$$,
                  'tick: already_billed: billing_records held every record, nothing claimed');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2035-02'), 3::bigint,
          'still one record per account for 2035-02');
SELECT results_eq($$SELECT outcome FROM billguard.scheduler_tick()$$, $$VALUES ('already_issued'::text)$$,
                  'the tick re-issued 2035-02 in the journal: the next one finds it issued');

------------------------------------------------------------------------------
-- scheduler_status.
SELECT results_eq($$SELECT enabled, bill_day, bill_hour_utc, next_bill_at, last_period_issued,
                           last_period_issued_at IS NOT NULL, missed_periods
                      FROM billguard.scheduler_status$$,
                  $$VALUES (false, 1, 0, NULL::timestamptz, '2035-02'::text, true, 0::bigint)$$,
                  'scheduler_status: off (no next instant), last period issued 2035-02 and when');

------------------------------------------------------------------------------
-- due_periods().
SET LOCAL billguard.scheduler_now = '2035-06-01 00:00:00+00';
SELECT results_eq($$SELECT billing_period, due_at, records, scheduled FROM billguard.due_periods()$$,
                  $$VALUES ('2035-03'::text, '2035-04-01 00:00:00+00'::timestamptz, 0::bigint, false),
                           ('2035-04', '2035-05-01 00:00:00+00', 0, false),
                           ('2035-05', '2035-06-01 00:00:00+00', 0, false)$$,
                  'due_periods: March to May never issued (auto_bill off: none scheduled)');
SELECT is((SELECT missed_periods FROM billguard.scheduler_status), 3::bigint,
          'scheduler_status: three missed periods');
SELECT is((SELECT status FROM billguard.bill_customer('t25_2', '2035-04')), 'initiated',
          'bill_customer claims t25_2 for 2035-04');
SELECT results_eq($$SELECT billing_period, records FROM billguard.due_periods() WHERE records > 0$$,
                  $$VALUES ('2035-04'::text, 1::bigint)$$,
                  'due_periods: records counts what bill_customer claimed');
SELECT results_eq($$SELECT billing_period, initiated FROM billguard.bill_period('2035-04')$$,
                  $$VALUES ('2035-04'::text, 2::bigint)$$,
                  'a missed period billed deliberately with bill_period');
SELECT results_eq($$SELECT billing_period FROM billguard.due_periods()$$,
                  $$VALUES ('2035-03'::text), ('2035-05')$$,
                  'due_periods: 2035-04 is off the list');
SELECT results_eq($$SELECT billing_period, outcome FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-05'::text, 'billed'::text)$$,
                  'the tick bills only the most recent due period, 2035-05');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2035-03'), 0::bigint,
          'the tick did not bill the older missed period 2035-03');
SELECT results_eq($$SELECT billing_period FROM billguard.due_periods()$$, $$VALUES ('2035-03'::text)$$,
                  'due_periods: only 2035-03 is left');
SELECT is(billguard.issued_after('2035-03', '{"issued_periods": ["2035-01", "2035-04", "2035-05"]}',
                                 '2035-06-01 00:00:00+00'),
          '2035-05', 'issued_after: 2035-05, whose month has ended, passed 2035-03');
SELECT is(billguard.issued_after('2035-05', '{"issued_periods": ["2035-06", "2036-01"]}', '2035-06-15 00:00:00+00'),
          NULL::text, 'issued_after: a period billed in advance, or a mistyped year, passes nothing');
SELECT is(billguard.issued_after('2035-05', '{"issued_periods": ["2035-04"]}', '2035-06-15 00:00:00+00'), NULL::text,
          'issued_after: an earlier period passes nothing');
SELECT is(billguard.issued_after('2035-03', '{"issued_periods": ["2035-04"], "ended_when_issued": ["2035-04"]}',
                                 '2035-04-30 23:00:00+00'),
          '2035-04', 'issued_after: a period issued once its month had ended passes older ones whatever the clock says now');
SELECT is((SELECT string_agg(p, ',' ORDER BY p)
             FROM jsonb_array_elements_text(billguard.entity_state('billing-scheduler') -> 'ended_when_issued') AS e (p)
            WHERE p LIKE '2035-%'),
          '2035-02,2035-04,2035-05',
          'billing-scheduler''s state lists the periods issued once their month had ended (2035-01''s event lies behind the stale snapshot)');
SET LOCAL billguard.scheduler_now = '2035-06-15 00:00:00+00';
SELECT is((SELECT last_period_issued FROM billguard.scheduler_status), '2035-05',
          'scheduler_status: the last period issued is 2035-05');

------------------------------------------------------------------------------
-- A tick that claims more than billguard.idempotency_window (23h here) after
-- the period became due: its records are searched for before any is sent.
SELECT is((SELECT count(*) FROM billguard.billing_records
            WHERE customer_id LIKE 't25\_%' AND search_first_reason IS NOT NULL), 0::bigint,
          'on time: no record the ticks claimed so far is searched for first');
SET LOCAL billguard.scheduler_now = '2035-07-02 00:00:01+00';
SELECT results_eq($$SELECT billing_period, outcome, initiated, search_first_reason FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-06'::text, 'billed'::text, 3::bigint,
                            'the scheduler claimed 2035-06 1 day 00:00:01 after it became due '
                            '(2035-07-01 00:00 UTC), past billguard.idempotency_window (23h): a charge '
                            'made for it before (a restored backup that lost the tick) may have a key '
                            'Stripe has forgotten')$$,
                  'late: 2035-06 billed a day after it became due, with the reason to search first');
SELECT is((SELECT count(*) FROM billguard.billing_records
            WHERE billing_period = '2035-06' AND status = 'pending'
              AND search_first_reason LIKE 'the scheduler claimed 2035-06 %'), 3::bigint,
          'late: each record is pending and carries the reason');
SET LOCAL billguard.scheduler_now = '2035-08-01 23:00:00+00';
SELECT results_eq($$SELECT billing_period, outcome, initiated, search_first_reason FROM billguard.scheduler_tick()$$,
                  $$VALUES ('2035-07'::text, 'billed'::text, 3::bigint, NULL::text)$$,
                  'exactly idempotency_window after 2035-07 became due: billed with plain charges');
SELECT results_eq($$SELECT c.billing_period, c.action, count(*)
                      FROM billguard.claim_due_records(1000, '1 minute', '23 hours', '/v1/payment_intents') c
                     WHERE c.customer_id LIKE 't25\_%' AND c.billing_period IN ('2035-06', '2035-07')
                     GROUP BY 1, 2 ORDER BY 1$$,
                  $$VALUES ('2035-06'::text, 'search'::text, 3::bigint), ('2035-07', 'charge', 3)$$,
                  'claim_due_records: the late records are searched for, the others charged');
UPDATE billguard.billing_records SET lease_expires_at = now() - interval '1 second'
 WHERE billing_period = '2035-06' AND customer_id LIKE 't25\_%';
SELECT results_eq($$SELECT c.billing_period, c.action, count(*)
                      FROM billguard.claim_due_records(1000, '1 minute', '23 hours', '/v1/payment_intents') c
                     WHERE c.customer_id LIKE 't25\_%' GROUP BY 1, 2$$,
                  $$VALUES ('2035-06'::text, 'search'::text, 3::bigint)$$,
                  'claim_due_records: claimed again after the lease ran out (a crash), still searched for first');
SELECT results_eq($$SELECT billing_period, initiated FROM billguard.bill_period('2035-03')$$,
                  $$VALUES ('2035-03'::text, 3::bigint)$$,
                  'bill_period of 2035-03, months after it became due, claims three records');
SELECT is((SELECT count(*) FROM billguard.billing_records
            WHERE billing_period = '2035-03' AND search_first_reason IS NULL), 3::bigint,
          'bill_period, a person''s, however late: plain charges, never marked');

SELECT * FROM finish();
ROLLBACK;
