-- 14_cancel_record.sql: a billing that was never sent can be withdrawn; one
-- that may have been sent cannot.
--
-- Proves: cancel_record of a pending record never claimed answers
-- 'cancelled', journals BillingCancelled (who, previous status, reason),
-- folds to status cancelled, and bill_customer then answers 'cancelled'
-- with the same key and no second record; cancelling again changes
-- nothing; a record that may have been sent (claimed once and pending for a
-- retry, dispatching, unknown, completed, failed, blocked, needs_review) is
-- refused with 22023 saying why and what to do, and nothing changes; an
-- unknown record is P0002; deactivating an account cancels exactly its
-- never-sent records, once, journaled, and re-activating brings none back;
-- bill_period's counts equal period_status's for the period; the
-- operator grant of docs/privileges.md is enough to call cancel_record.
BEGIN;
SELECT plan(35);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't14\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
SELECT 't14_' || s, 'cus_t14' || s, 1000
  FROM unnest(ARRAY['fresh', 'retrying', 'dispatching', 'unknown', 'completed', 'failed', 'blocked',
                    'needs_review']) AS s;
SELECT results_eq($$SELECT initiated FROM billguard.bill_period('2036-01')$$, ARRAY[8::bigint],
                  'eight records claimed for 2036-01');
-- Every state a record can reach once a dispatcher has claimed it.
UPDATE billguard.billing_records r
   SET status = CASE WHEN r.customer_id = 't14_retrying' THEN 'pending' ELSE substr(r.customer_id, 5) END,
       first_dispatched_at = now() - interval '1 minute', attempts = 1,
       charge_id = CASE WHEN r.customer_id = 't14_completed' THEN 'pi_t14' END
 WHERE r.billing_period = '2036-01' AND r.customer_id <> 't14_fresh';
CREATE FUNCTION pg_temp.t14_state() RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(customer_id || '=' || status, ' ' ORDER BY customer_id)
         || format(' events=%s', (SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t14\_%'))
    FROM billguard.billing_records WHERE customer_id LIKE 't14\_%'
$$;

------------------------------------------------------------------------------
-- A never-sent record.
SELECT is(billguard.cancel_record('t14_fresh', '2036-01'), 'cancelled', 'cancel_record answers cancelled');
SELECT is((SELECT status FROM billguard.billing_records WHERE customer_id = 't14_fresh'), 'cancelled',
          'the record is cancelled');
SELECT results_eq($$SELECT seq_nr, event_type, event ->> 'previous_status', event ->> 'reason', event ->> 'by'
                      FROM billguard.journal WHERE persistence_id = 'billing-t14_fresh-2036-01' ORDER BY seq_nr$$,
                  $$VALUES (1::bigint, 'BillingInitiated'::text, NULL::text, NULL::text, NULL::text),
                           (2, 'BillingCancelled', 'pending', 'cancel_record', session_user::text COLLATE "default")$$,
                  'BillingCancelled is journaled with the previous status, the reason and who');
SELECT is(billguard.entity_state('billing-t14_fresh-2036-01') ->> 'status', 'cancelled',
          'the entity folds to cancelled');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t14_fresh', '2036-01')$$,
                  $$SELECT 'cancelled'::text, billguard.idempotency_key('t14_fresh', '2036-01'), NULL::text$$,
                  'bill_customer answers cancelled, with the record''s key');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't14_fresh'), 1::bigint,
          'and creates no second record');
SELECT pg_temp.t14_state() AS before \gset
SELECT is(billguard.cancel_record('t14_fresh', '2036-01'), 'cancelled', 'cancelling again answers cancelled');
SELECT is(pg_temp.t14_state(), :'before', 'and changes nothing (no second event)');

------------------------------------------------------------------------------
-- Records that may have been sent.
SELECT throws_ok($$SELECT billguard.cancel_record('t14_retrying', '2036-01')$$, '22023',
                 format('billing record t14_retrying/2036-01 cannot be cancelled: it is pending and was first sent to Stripe at %s, so it may already have charged the customer',
                        now() - interval '1 minute'),
                 'a pending record that was sent before (waiting for a retry) is refused, saying why');
SELECT throws_ok(format('SELECT billguard.cancel_record(%L, ''2036-01'')', 't14_' || s), '22023',
                 format('billing record t14_%s/2036-01 cannot be cancelled: it is %s and was first sent to Stripe at %s, so it may already have charged the customer',
                        s, s, now() - interval '1 minute'),
                 'a ' || s || ' record is refused')
  FROM unnest(ARRAY['dispatching', 'unknown', 'completed', 'failed', 'blocked', 'needs_review']) AS s;
CREATE FUNCTION pg_temp.t14_hint(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE hint text;
BEGIN
  EXECUTE sql;
  RETURN NULL;
EXCEPTION WHEN invalid_parameter_value THEN
  GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
  RETURN hint;
END $$;
SELECT is(pg_temp.t14_hint($$SELECT billguard.cancel_record('t14_completed', '2036-01')$$),
          'Only a record that was never sent can be cancelled. Let this one reach its outcome, and refund a completed charge in Stripe.',
          'the refusal says what to do instead');
SELECT is(pg_temp.t14_state(), :'before', 'the refused cancellations changed nothing');
SELECT throws_ok($$SELECT billguard.cancel_record('t14_nobody', '2036-01')$$, 'P0002',
                 'no billing record for ''t14_nobody'' in 2036-01', 'a record that does not exist: P0002');
SELECT throws_ok($$SELECT billguard.cancel_record('t14_fresh', '2036-13')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2036-13''',
                 'a bad period: 22023');

------------------------------------------------------------------------------
-- Deactivation cancels the never-sent records of the account, and only those.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
VALUES ('t14_leaving', 'cus_t14leaving', 1000);
SELECT results_eq(format('SELECT status FROM billguard.bill_customer(''t14_leaving'', %L)', p), ARRAY['initiated'],
                  't14_leaving claimed for ' || p)
  FROM unnest(ARRAY['2036-02', '2036-03', '2036-04', '2036-05']) AS p;
UPDATE billguard.billing_records SET status = 'dispatching', first_dispatched_at = now(), attempts = 1
 WHERE customer_id = 't14_leaving' AND billing_period = '2036-03';
UPDATE billguard.billing_records SET status = 'pending', first_dispatched_at = now(), attempts = 1
 WHERE customer_id = 't14_leaving' AND billing_period = '2036-04';
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'pi_t14leaving', first_dispatched_at = now()
 WHERE customer_id = 't14_leaving' AND billing_period = '2036-05';
UPDATE billguard.accounts SET active = false WHERE customer_id = 't14_leaving';
SELECT results_eq($$SELECT billing_period, status FROM billguard.billing_records
                     WHERE customer_id = 't14_leaving' ORDER BY billing_period$$,
                  $$VALUES ('2036-02'::text, 'cancelled'::text), ('2036-03', 'dispatching'), ('2036-04', 'pending'),
                           ('2036-05', 'completed')$$,
                  'deactivation cancels the never-sent record; the ones that may have been sent go on');
SELECT results_eq($$SELECT persistence_id, event ->> 'reason' FROM billguard.journal
                     WHERE persistence_id LIKE 'billing-t14\_leaving-%' AND event_type = 'BillingCancelled'$$,
                  $$VALUES ('billing-t14_leaving-2036-02'::text, 'account deactivated'::text)$$,
                  'one BillingCancelled event, for the cancelled record, giving the reason');
UPDATE billguard.accounts SET active = false, amount_cents = 1100 WHERE customer_id = 't14_leaving';
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t14\_leaving-%'
             AND event_type = 'BillingCancelled'), 1::bigint,
          'an UPDATE of an account that was already inactive cancels nothing more');
UPDATE billguard.accounts SET active = true WHERE customer_id = 't14_leaving';
SELECT results_eq($$SELECT status FROM billguard.bill_customer('t14_leaving', '2036-02')$$, ARRAY['cancelled'],
                  're-activating brings no cancelled record back');

------------------------------------------------------------------------------
-- bill_period's counts are period_status's.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
VALUES ('t14_new', 'cus_t14new', 1000);
CREATE TEMP TABLE t14_counts AS SELECT * FROM billguard.bill_period('2036-01');
SELECT results_eq($$SELECT initiated, already_completed, in_progress, failed, cancelled FROM t14_counts$$,
                  $$VALUES (2::bigint, 1::bigint, 4::bigint, 2::bigint, 1::bigint)$$,
                  'bill_period 2036-01: t14_new and t14_leaving initiated, every other record counted by status');
SELECT results_eq($$SELECT initiated + in_progress, already_completed, failed, cancelled FROM t14_counts$$,
                  $$SELECT sum(count) FILTER (WHERE status IN ('pending', 'dispatching', 'unknown', 'needs_review'))::bigint,
                           sum(count) FILTER (WHERE status = 'completed')::bigint,
                           sum(count) FILTER (WHERE status IN ('failed', 'blocked'))::bigint,
                           sum(count) FILTER (WHERE status = 'cancelled')::bigint
                      FROM billguard.period_status('2036-01')$$,
                  'bill_period''s counts agree with period_status for the same period');
UPDATE billguard.accounts SET active = false WHERE customer_id = 't14_new';
SELECT results_eq($$SELECT initiated, in_progress, cancelled FROM billguard.bill_period('2036-01')$$,
                  $$VALUES (0::bigint, 5::bigint, 2::bigint)$$,
                  'after t14_new is deactivated its record counts as cancelled (t14_leaving''s is in progress now)');
SELECT results_eq($$SELECT count FROM billguard.period_status('2036-01') WHERE status = 'cancelled'$$,
                  ARRAY[2::bigint], 'period_status: two cancelled');

------------------------------------------------------------------------------
-- The operator grant of docs/privileges.md.
CREATE ROLE t14_operator NOLOGIN;
GRANT USAGE ON SCHEMA billguard TO t14_operator;
GRANT EXECUTE ON FUNCTION billguard.cancel_record(text, text) TO t14_operator;
SET LOCAL ROLE t14_operator;
SELECT is(billguard.cancel_record('t14_leaving', '2036-01'), 'cancelled',
          'an operator with EXECUTE on cancel_record cancels a never-sent record');
SELECT throws_ok($$SELECT * FROM billguard.billing_records$$, '42501', 'permission denied for table billing_records',
                 'without reading billing_records itself');
RESET ROLE;
SELECT is((SELECT event ->> 'by' FROM billguard.journal WHERE persistence_id = 'billing-t14_leaving-2036-01'
             AND event_type = 'BillingCancelled'), session_user::text COLLATE "default",
          'the event names the session that cancelled');

SELECT * FROM finish();
ROLLBACK;
