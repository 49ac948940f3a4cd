-- 05_bill_customer.sql: bill_customer claims one (customer, period) once and
-- always answers from the pre-flight record afterwards.
--
-- Proves: the first call answers 'initiated' with the content-hash key and
-- writes exactly one pending record (amount, currency, payee frozen from
-- accounts, request_id kept for tracing) and one BillingInitiated event at
-- seq_nr 1 of billing-<customer>-<period>; later calls answer from the record
-- (in_progress / already_completed + charge id / failed / blocked) and write
-- nothing; unknown customer -> 23503, inactive customer -> 22023, both
-- writing nothing; a record that may have been sent outlives its account's
-- deactivation; a record's identifying columns cannot change (23000) and
-- records cannot be deleted.
BEGIN;
SELECT plan(61);

INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method, active) VALUES
  ('t05_alice', 'cus_t05alice', 1999, 'eur', 'pm_t05alice', true),
  ('t05_bob', 'cus_t05bob', 500, 'usd', NULL, true),
  ('t05_inactive', 'cus_t05inactive', 700, 'usd', NULL, false);

CREATE TEMP TABLE t05_before AS
  SELECT (SELECT count(*) FROM billguard.billing_records) AS records,
         (SELECT count(*) FROM billguard.journal) AS events;

-- The first call claims.
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-05', 'req-1')$$,
                  $$SELECT 'initiated'::text, billguard.idempotency_key('t05_alice', '2031-05'), NULL::text$$,
                  'first call: initiated, the content-hash key, no charge id');
SELECT is(billguard.idempotency_key('t05_alice', '2031-05'),
          billguard.idempotency_key('t05_alice', '2031-05', 'akka-billing'),
          '(the key is the akka-billing namespace key)');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't05_alice'), 1::bigint,
          'exactly one record');
SELECT results_eq($$SELECT customer_id, billing_period, idempotency_key, status, charge_id, amount_cents,
                           currency, stripe_customer, payment_method, request_id, attempts
                      FROM billguard.billing_records WHERE customer_id = 't05_alice'$$,
                  $$VALUES ('t05_alice', '2031-05', billguard.idempotency_key('t05_alice', '2031-05'), 'pending',
                            NULL::text, 1999::bigint, 'eur', 'cus_t05alice', 'pm_t05alice', 'req-1', 0)$$,
                  'the record: pending, amount/currency/payee copied from accounts, request_id stored');
SELECT ok((SELECT created_at = now() FROM billguard.billing_records WHERE customer_id = 't05_alice'),
          'the record was created now()');
SELECT results_eq($$SELECT persistence_id, seq_nr, customer_id, event_type
                      FROM billguard.journal WHERE persistence_id LIKE 'billing-t05\_alice-%'$$,
                  $$VALUES ('billing-t05_alice-2031-05', 1::bigint, 't05_alice', 'BillingInitiated')$$,
                  'exactly one event: BillingInitiated at seq_nr 1 of billing-t05_alice-2031-05');
SELECT is((SELECT event ->> 'customer_id' FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'),
          't05_alice', 'event field customer_id');
SELECT is((SELECT event ->> 'billing_period' FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'),
          '2031-05', 'event field billing_period');
SELECT is((SELECT event ->> 'idempotency_key' FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'),
          billguard.idempotency_key('t05_alice', '2031-05'), 'event field idempotency_key');
SELECT is((SELECT event -> 'amount_cents' FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'),
          '1999'::jsonb, 'event field amount_cents (a JSON number)');
SELECT is((SELECT event ->> 'currency' FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'),
          'eur', 'event field currency');
SELECT is((SELECT (j.event ->> 'initiated_at')::timestamptz FROM billguard.journal j
            WHERE j.persistence_id = 'billing-t05_alice-2031-05'),
          (SELECT created_at FROM billguard.billing_records WHERE customer_id = 't05_alice'),
          'event field initiated_at = the record''s created_at');
SELECT ok((SELECT event ?& ARRAY['customer_id', 'billing_period', 'idempotency_key', 'amount_cents',
                                 'currency', 'initiated_at']
             FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'),
          'the event has all six documented fields');
SELECT is(billguard.entity_state('billing-t05_alice-2031-05') ->> 'status', 'in_progress',
          'the entity folds to in_progress');

-- The second call answers from the record and writes nothing.
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-05', 'req-2')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_alice', '2031-05'), NULL::text$$,
                  'second call: in_progress with the same key');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-05')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_alice', '2031-05'), NULL::text$$,
                  'a call without request_id: in_progress with the same key');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't05_alice'), 1::bigint,
          'still exactly one record');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-t05_alice-2031-05'), 1::bigint,
          'still exactly one event');
SELECT is((SELECT request_id FROM billguard.billing_records WHERE customer_id = 't05_alice'), 'req-1',
          'the record keeps the first request_id');

-- Amounts are frozen at claim time.
UPDATE billguard.accounts SET amount_cents = 2999 WHERE customer_id = 't05_alice';
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-05')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_alice', '2031-05'), NULL::text$$,
                  'after an account amount change: same answer');
SELECT is((SELECT amount_cents FROM billguard.billing_records WHERE customer_id = 't05_alice'), 1999::bigint,
          'the record keeps the amount frozen at claim time');
UPDATE billguard.accounts SET amount_cents = 1999 WHERE customer_id = 't05_alice';

-- Completed.
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'ch_t05_alice'
 WHERE customer_id = 't05_alice' AND billing_period = '2031-05';
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-05', 'req-3')$$,
                  $$SELECT 'already_completed'::text, billguard.idempotency_key('t05_alice', '2031-05'), 'ch_t05_alice'::text$$,
                  'completed record: already_completed with the charge id');

-- Every other record status.
SELECT is((SELECT status FROM billguard.bill_customer('t05_alice', p)), 'initiated', 'claim ' || p)
  FROM unnest(ARRAY['2031-06', '2031-07', '2031-08', '2031-09', '2031-10']) p;
UPDATE billguard.billing_records SET status = 'failed', last_error = 'card_declined'
 WHERE customer_id = 't05_alice' AND billing_period = '2031-06';
UPDATE billguard.billing_records SET status = 'blocked' WHERE customer_id = 't05_alice' AND billing_period = '2031-07';
UPDATE billguard.billing_records SET status = 'unknown' WHERE customer_id = 't05_alice' AND billing_period = '2031-08';
UPDATE billguard.billing_records SET status = 'dispatching' WHERE customer_id = 't05_alice' AND billing_period = '2031-09';
UPDATE billguard.billing_records SET status = 'needs_review' WHERE customer_id = 't05_alice' AND billing_period = '2031-10';
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-06')$$,
                  $$SELECT 'failed'::text, billguard.idempotency_key('t05_alice', '2031-06'), NULL::text$$,
                  'failed record: failed');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-07')$$,
                  $$SELECT 'blocked'::text, billguard.idempotency_key('t05_alice', '2031-07'), NULL::text$$,
                  'blocked record: blocked');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-08')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_alice', '2031-08'), NULL::text$$,
                  'unknown record: in_progress');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-09')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_alice', '2031-09'), NULL::text$$,
                  'dispatching record: in_progress');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_alice', '2031-10')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_alice', '2031-10'), NULL::text$$,
                  'needs_review record: in_progress');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't05_alice'), 6::bigint,
          'six periods, six records');
SELECT is((SELECT count(*) FROM billguard.journal WHERE customer_id = 't05_alice'), 6::bigint,
          'six periods, six BillingInitiated events');
SELECT is((SELECT count(DISTINCT idempotency_key) FROM billguard.billing_records WHERE customer_id = 't05_alice'),
          6::bigint, 'six periods, six distinct keys');

-- Unknown customer: 23503, nothing written.
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t05_nobody', '2031-05')$$, '23503',
                 'customer ''t05_nobody'' is not in billguard.accounts', 'unknown customer is refused with 23503');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't05_nobody'), 0::bigint,
          'unknown customer: no record');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t05\_nobody-%'), 0::bigint,
          'unknown customer: no event');

-- Inactive customer: 22023, nothing written.
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t05_inactive', '2031-05')$$, '22023',
                 'customer ''t05_inactive'' is not active', 'inactive customer is refused with 22023');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't05_inactive'), 0::bigint,
          'inactive customer: no record');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t05\_inactive-%'), 0::bigint,
          'inactive customer: no event');

-- Bad arguments: 22023.
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t05_bob', '2031-13')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2031-13''',
                 'bad period is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t05_bob', '2031-05', repeat('r', 256))$$, '22023',
                 'request_id must be at most 255 bytes', 'a 256-byte request_id is refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer(NULL, '2031-05')$$, '22023',
                 'customer_id must not be NULL', 'NULL customer is refused');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't05_bob'), 0::bigint,
          'bad arguments: no record for t05_bob');

-- A record that may have been sent outlives its account's deactivation
-- (one never sent is cancelled: 14_cancel_record.sql).
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_bob', '2031-05')$$,
                  $$SELECT 'initiated'::text, billguard.idempotency_key('t05_bob', '2031-05'), NULL::text$$,
                  't05_bob claimed while active');
UPDATE billguard.billing_records SET status = 'dispatching', first_dispatched_at = now()
 WHERE customer_id = 't05_bob' AND billing_period = '2031-05';
UPDATE billguard.accounts SET active = false WHERE customer_id = 't05_bob';
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_bob', '2031-05')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t05_bob', '2031-05'), NULL::text$$,
                  'the record of a now-inactive customer still answers');
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'ch_t05_bob'
 WHERE customer_id = 't05_bob' AND billing_period = '2031-05';
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t05_bob', '2031-05')$$,
                  $$SELECT 'already_completed'::text, billguard.idempotency_key('t05_bob', '2031-05'), 'ch_t05_bob'::text$$,
                  'a completed record of a now-inactive customer answers already_completed');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t05_bob', '2031-06')$$, '22023',
                 'customer ''t05_bob'' is not active', 'but a new period for the inactive customer is refused');

-- Identity of a record is frozen; records are never removed.
SELECT throws_ok($$UPDATE billguard.billing_records SET idempotency_key = 'ffffffffffffffffffffffffffffffff'
                    WHERE customer_id = 't05_alice' AND billing_period = '2031-05'$$, '23000',
                 'billing record t05_alice/2031-05 : customer, period, key, amount and payee never change',
                 'changing idempotency_key is refused (23000)');
SELECT throws_ok($$UPDATE billguard.billing_records SET amount_cents = 1
                    WHERE customer_id = 't05_alice' AND billing_period = '2031-05'$$, '23000',
                 'billing record t05_alice/2031-05 : customer, period, key, amount and payee never change',
                 'changing amount_cents is refused (23000)');
SELECT throws_ok($$UPDATE billguard.billing_records SET customer_id = 't05_bob'
                    WHERE customer_id = 't05_alice' AND billing_period = '2031-06'$$, '23000',
                 'billing record t05_alice/2031-06 : customer, period, key, amount and payee never change',
                 'changing customer_id is refused (23000)');
SELECT throws_ok($$UPDATE billguard.billing_records SET billing_period = '2031-11'
                    WHERE customer_id = 't05_alice' AND billing_period = '2031-06'$$, '23000',
                 'billing record t05_alice/2031-06 : customer, period, key, amount and payee never change',
                 'changing billing_period is refused (23000)');
SELECT throws_ok($$UPDATE billguard.billing_records SET currency = 'usd'
                    WHERE customer_id = 't05_alice' AND billing_period = '2031-06'$$, '23000',
                 'billing record t05_alice/2031-06 : customer, period, key, amount and payee never change',
                 'changing currency is refused (23000)');
SELECT throws_ok($$UPDATE billguard.billing_records SET stripe_customer = 'cus_attacker'
                    WHERE customer_id = 't05_alice' AND billing_period = '2031-06'$$, '23000',
                 'billing record t05_alice/2031-06 : customer, period, key, amount and payee never change',
                 'changing stripe_customer is refused (23000)');
SELECT throws_ok($$DELETE FROM billguard.billing_records WHERE customer_id = 't05_alice' AND billing_period = '2031-05'$$,
                 '23000', 'billguard.billing_records rows are never removed: DELETE refused',
                 'deleting a record is refused (23000)');
SELECT throws_ok($$TRUNCATE billguard.billing_records$$,
                 '23000', 'billguard.billing_records rows are never removed: TRUNCATE refused',
                 'truncating the records is refused (23000)');
SELECT results_eq($$SELECT customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer
                      FROM billguard.billing_records WHERE customer_id = 't05_alice' AND billing_period IN ('2031-05', '2031-06')
                     ORDER BY billing_period$$,
                  $$VALUES ('t05_alice', '2031-05', billguard.idempotency_key('t05_alice', '2031-05'), 1999::bigint, 'eur', 'cus_t05alice'),
                           ('t05_alice', '2031-06', billguard.idempotency_key('t05_alice', '2031-06'), 1999::bigint, 'eur', 'cus_t05alice')$$,
                  'the refused changes left the records as claimed');
SELECT lives_ok($$UPDATE billguard.billing_records SET attempts = attempts + 1, last_error = 'timeout'
                   WHERE customer_id = 't05_alice' AND billing_period = '2031-08'$$,
                'dispatch bookkeeping columns can still be updated');

-- In total: 7 records, 7 events written by this file.
SELECT is((SELECT count(*) FROM billguard.billing_records) - (SELECT records FROM t05_before), 7::bigint,
          'this file wrote 7 records (6 for t05_alice, 1 for t05_bob)');
SELECT is((SELECT count(*) FROM billguard.journal) - (SELECT events FROM t05_before), 7::bigint,
          'this file wrote 7 events');

SELECT * FROM finish();
ROLLBACK;
