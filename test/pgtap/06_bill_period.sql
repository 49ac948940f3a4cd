-- 06_bill_period.sql: bill_period bills every active account once per period.
--
-- Proves: the counts (initiated, already_completed, in_progress, failed,
-- cancelled) of a first run, a rerun, a rerun after records were marked
-- completed / failed / blocked (blocked counts as failed), after a new
-- account appears and after an account is deactivated (its never-sent record
-- counts as cancelled); inactive accounts are not billed; exactly one
-- BillingInitiated event per new record; the billing-scheduler entity gets
-- exactly one BillingTickIssued per period, however often bill_period runs;
-- period_status returns the nine statuses in order with correct counts and
-- amount sums, per currency (a period with USD and EUR records gets a row
-- for each, never a sum across them; a status without records one row with
-- currency NULL); bad periods are 22023 and write nothing.
BEGIN;
SELECT plan(45);

-- Only this file's accounts are active while it runs (rolled back at the end).
UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't06\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, active)
SELECT 't06_a' || i, 'cus_t06a' || i, 100 * i, 'usd', true FROM generate_series(1, 7) i;
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, active)
VALUES ('t06_off', 'cus_t06off', 999, 'usd', false);

CREATE TEMP TABLE t06_scheduler_before AS
  SELECT billguard.highest_seq_nr('billing-scheduler') AS seq_nr;

-- First run.
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-01')$$,
                  $$VALUES ('2032-01'::text, 7::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  'first run: 7 initiated');
SELECT bag_eq($$SELECT customer_id, idempotency_key, status, amount_cents, currency, stripe_customer
                  FROM billguard.billing_records WHERE billing_period = '2032-01' AND customer_id LIKE 't06\_%'$$,
              $$SELECT 't06_a' || i AS customer_id, billguard.idempotency_key('t06_a' || i, '2032-01') AS idempotency_key,
                       'pending' AS status, 100 * i::bigint AS amount_cents, 'usd' AS currency,
                       'cus_t06a' || i AS stripe_customer
                  FROM generate_series(1, 7) i$$,
              'one pending record per active account, with its content-hash key and amount');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't06_off'), 0::bigint,
          'the inactive account is not billed');
SELECT bag_eq($$SELECT persistence_id, seq_nr, event_type, event ->> 'idempotency_key' AS key
                  FROM billguard.journal WHERE persistence_id LIKE 'billing-t06\_%-2032-01'$$,
              $$SELECT 'billing-' || r.customer_id || '-2032-01' AS persistence_id, 1::bigint AS seq_nr,
                       'BillingInitiated' AS event_type, r.idempotency_key AS key
                  FROM billguard.billing_records r WHERE r.billing_period = '2032-01' AND r.customer_id LIKE 't06\_%'$$,
              'exactly one BillingInitiated event (seq_nr 1, same key) per new record');
SELECT is((SELECT count(*) FROM billguard.journal j JOIN billguard.billing_records r
             ON j.persistence_id = 'billing-' || r.customer_id || '-' || r.billing_period
            WHERE r.billing_period = '2032-01' AND r.customer_id LIKE 't06\_%'
              AND (j.event ->> 'amount_cents')::bigint = r.amount_cents
              AND j.event ->> 'currency' = r.currency
              AND j.event ->> 'customer_id' = r.customer_id
              AND j.event ->> 'billing_period' = r.billing_period
              AND (j.event ->> 'initiated_at')::timestamptz = r.created_at),
          7::bigint, 'each event carries the record''s customer, period, amount, currency and created_at');
SELECT is((SELECT count(*) FROM billguard.journal
            WHERE persistence_id = 'billing-scheduler' AND event_type = 'BillingTickIssued'
              AND event ->> 'billing_period' = '2032-01'),
          1::bigint, 'billing-scheduler got one BillingTickIssued for 2032-01');
SELECT is(billguard.highest_seq_nr('billing-scheduler'), (SELECT seq_nr + 1 FROM t06_scheduler_before),
          'the tick is the scheduler''s next seq_nr');

-- Rerun: nothing new.
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-01')$$,
                  $$VALUES ('2032-01'::text, 0::bigint, 0::bigint, 7::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  'rerun: 0 initiated, 7 in progress');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2032-01'), 7::bigint,
          'rerun: still 7 records');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t06\_%-2032-01'), 7::bigint,
          'rerun: still 7 billing events');
SELECT is((SELECT count(*) FROM billguard.journal
            WHERE persistence_id = 'billing-scheduler' AND event ->> 'billing_period' = '2032-01'),
          1::bigint, 'rerun: still one tick for 2032-01');

-- Mark records as the dispatcher would.
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'ch_t06_a1', completed_at = now()
 WHERE customer_id = 't06_a1' AND billing_period = '2032-01';
UPDATE billguard.billing_records SET status = 'failed', last_error = 'card_declined'
 WHERE customer_id = 't06_a2' AND billing_period = '2032-01';
UPDATE billguard.billing_records SET status = 'blocked' WHERE customer_id = 't06_a3' AND billing_period = '2032-01';
UPDATE billguard.billing_records SET status = 'dispatching' WHERE customer_id = 't06_a4' AND billing_period = '2032-01';
UPDATE billguard.billing_records SET status = 'unknown' WHERE customer_id = 't06_a5' AND billing_period = '2032-01';
UPDATE billguard.billing_records SET status = 'needs_review' WHERE customer_id = 't06_a6' AND billing_period = '2032-01';
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-01')$$,
                  $$VALUES ('2032-01'::text, 0::bigint, 1::bigint, 4::bigint, 2::bigint, 0::bigint, 0::bigint)$$,
                  'after marking: 1 already completed, 4 in progress, 2 failed (failed + blocked)');
SELECT results_eq($$SELECT status, count, amount_cents FROM billguard.period_status('2032-01')$$,
                  $$VALUES ('pending'::text, 1::bigint, 700::numeric), ('dispatching', 1, 400), ('unknown', 1, 500),
                           ('needs_review', 1, 600), ('completed', 1, 100), ('failed', 1, 200), ('blocked', 1, 300),
                           ('cancelled', 0, 0), ('below_minimum', 0, 0)$$,
                  'period_status: nine rows in order, one record each (none cancelled), with their amounts');

-- A new account joins: only it is initiated.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
VALUES ('t06_a8', 'cus_t06a8', 800, 'usd');
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-01')$$,
                  $$VALUES ('2032-01'::text, 1::bigint, 1::bigint, 4::bigint, 2::bigint, 0::bigint, 0::bigint)$$,
                  'a new account: 1 initiated, the others unchanged');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-t06_a8-2032-01'), 1::bigint,
          'the new account got exactly one BillingInitiated');
SELECT results_eq($$SELECT status, count, amount_cents FROM billguard.period_status('2032-01')$$,
                  $$VALUES ('pending'::text, 2::bigint, 1500::numeric), ('dispatching', 1, 400), ('unknown', 1, 500),
                           ('needs_review', 1, 600), ('completed', 1, 100), ('failed', 1, 200), ('blocked', 1, 300),
                           ('cancelled', 0, 0), ('below_minimum', 0, 0)$$,
                  'period_status: two pending now (700 + 800)');
SELECT is((SELECT count(*) FROM billguard.journal
            WHERE persistence_id = 'billing-scheduler' AND event ->> 'billing_period' = '2032-01'),
          1::bigint, 'after four runs: still one tick for 2032-01');

-- Deactivating an account: its record stays, cancelled as it was never sent.
UPDATE billguard.accounts SET active = false WHERE customer_id = 't06_a7';
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-01')$$,
                  $$VALUES ('2032-01'::text, 0::bigint, 1::bigint, 4::bigint, 2::bigint, 1::bigint, 0::bigint)$$,
                  'a deactivated account''s never-sent record counts as cancelled (a8 is in progress now)');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't06_a7'), 1::bigint,
          'the deactivated account keeps its record');

-- A different period.
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-02')$$,
                  $$VALUES ('2032-02'::text, 7::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  'a different period: the 7 active accounts are initiated');
SELECT bag_eq($$SELECT customer_id FROM billguard.billing_records WHERE billing_period = '2032-02'$$,
              ARRAY['t06_a1', 't06_a2', 't06_a3', 't06_a4', 't06_a5', 't06_a6', 't06_a8'],
              'the 2032-02 records are exactly the active accounts');
SELECT is((SELECT count(*) FROM billguard.billing_records r1 JOIN billguard.billing_records r2
             ON r1.customer_id = r2.customer_id AND r1.idempotency_key = r2.idempotency_key
            WHERE r1.billing_period = '2032-01' AND r2.billing_period = '2032-02'),
          0::bigint, 'no key is shared between the two periods');
SELECT is((SELECT count(*) FROM billguard.journal
            WHERE persistence_id = 'billing-scheduler' AND event ->> 'billing_period' = '2032-02'),
          1::bigint, 'billing-scheduler got one BillingTickIssued for 2032-02');
SELECT results_eq($$SELECT * FROM billguard.bill_period('2032-02')$$,
                  $$VALUES ('2032-02'::text, 0::bigint, 0::bigint, 7::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  'rerun of 2032-02: 0 initiated');
SELECT results_eq($$SELECT event ->> 'billing_period' FROM billguard.journal
                     WHERE persistence_id = 'billing-scheduler' AND seq_nr > (SELECT seq_nr FROM t06_scheduler_before)
                     ORDER BY seq_nr$$,
                  ARRAY['2032-01', '2032-02'],
                  'the scheduler has exactly two new ticks, 2032-01 then 2032-02, gap-free');
SELECT is(billguard.highest_seq_nr('billing-scheduler'), (SELECT seq_nr + 2 FROM t06_scheduler_before),
          'the scheduler advanced by exactly two events');
SELECT ok((billguard.entity_state('billing-scheduler') -> 'issued_periods') ?& ARRAY['2032-01', '2032-02'],
          'the scheduler state lists both periods as issued');
SELECT is((SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingTickIssued'
             AND persistence_id <> 'billing-scheduler'), 0::bigint,
          'ticks go to the billing-scheduler entity only');

-- period_status of a period without records: eight zero rows.
SELECT results_eq($$SELECT status, count, amount_cents FROM billguard.period_status('2032-12')$$,
                  $$VALUES ('pending'::text, 0::bigint, 0::numeric), ('dispatching', 0, 0), ('unknown', 0, 0),
                           ('needs_review', 0, 0), ('completed', 0, 0), ('failed', 0, 0), ('blocked', 0, 0),
                           ('cancelled', 0, 0), ('below_minimum', 0, 0)$$,
                  'period_status of an unbilled period: nine rows of zeros');
SELECT results_eq($$SELECT status, count, amount_cents FROM billguard.period_status('2032-02')$$,
                  $$VALUES ('pending'::text, 7::bigint, 2900::numeric), ('dispatching', 0, 0), ('unknown', 0, 0),
                           ('needs_review', 0, 0), ('completed', 0, 0), ('failed', 0, 0), ('blocked', 0, 0),
                           ('cancelled', 0, 0), ('below_minimum', 0, 0)$$,
                  'period_status of 2032-02: seven pending worth 2900 (a1..a6 + a8)');

-- Two currencies in one period: a row per (status, currency), never a sum
-- across currencies; a status without records keeps its one row, currency NULL.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, active)
VALUES ('t06_e1', 'cus_t06e1', 250, 'eur', true), ('t06_e2', 'cus_t06e2', 350, 'eur', true);
SELECT results_eq($$SELECT initiated FROM billguard.bill_period('2032-03')$$, ARRAY[9::bigint],
                  '2032-03: seven USD and two EUR accounts initiated');
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'ch_t06_' || customer_id, completed_at = now()
 WHERE customer_id IN ('t06_a1', 't06_e1') AND billing_period = '2032-03';
SELECT results_eq($$SELECT status, count, amount_cents, currency FROM billguard.period_status('2032-03')$$,
                  $$VALUES ('pending'::text, 1::bigint, 350::numeric, 'eur'::text), ('pending', 6, 2800, 'usd'),
                           ('dispatching', 0, 0, NULL), ('unknown', 0, 0, NULL), ('needs_review', 0, 0, NULL),
                           ('completed', 1, 250, 'eur'), ('completed', 1, 100, 'usd'), ('failed', 0, 0, NULL),
                           ('blocked', 0, 0, NULL), ('cancelled', 0, 0, NULL), ('below_minimum', 0, 0, NULL)$$,
                  'period_status of 2032-03: USD and EUR amounts on separate rows, empty statuses with currency NULL');
SELECT is((SELECT sum(count) FROM billguard.period_status('2032-03')), 9::numeric,
          'period_status of 2032-03: every record counted once');

-- Bad periods: 22023, nothing written.
CREATE TEMP TABLE t06_counts AS
  SELECT (SELECT count(*) FROM billguard.billing_records) AS records, (SELECT count(*) FROM billguard.journal) AS events;
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2032-13')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2032-13''',
                 'bill_period(2032-13) is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2032-00')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2032-00''',
                 'bill_period(2032-00) is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2032-1')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2032-1''',
                 'bill_period(2032-1) is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period(' 2032-01')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got '' 2032-01''',
                 'bill_period('' 2032-01'') is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2032-01 ')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2032-01 ''',
                 'bill_period(''2032-01 '') is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period('')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''''',
                 'bill_period('''') is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period(NULL)$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got NULL',
                 'bill_period(NULL) is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2032-01-01')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2032-01-01''',
                 'bill_period(2032-01-01) is refused');
SELECT throws_ok($$SELECT * FROM billguard.period_status('2032-13')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2032-13''',
                 'period_status(2032-13) is refused');
SELECT throws_ok($$SELECT * FROM billguard.period_status(NULL)$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got NULL',
                 'period_status(NULL) is refused');
SELECT is((SELECT count(*) FROM billguard.billing_records), (SELECT records FROM t06_counts),
          'bad periods wrote no record');
SELECT is((SELECT count(*) FROM billguard.journal), (SELECT events FROM t06_counts),
          'bad periods wrote no event (no scheduler tick either)');

SELECT * FROM finish();
ROLLBACK;
