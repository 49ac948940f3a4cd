-- 28_await_billing.sql: await_billing answers a caller with the outcome of a
-- billing, or says why it cannot.
--
-- Proves: a record in each terminal status (completed, failed, blocked,
-- needs_review, cancelled) is answered at once with its status and charge
-- id, whatever the timeout; a record still open is ('in_progress', NULL)
-- with timeout 0; waiting on a record this transaction wrote is refused
-- (25000) instead of sleeping until the timeout; bad input is 22023 and an
-- unknown (customer, period) P0002, changing nothing; the wake-up count of a
-- record does not move when it becomes terminal inside a transaction that
-- has not committed (only a COMMIT announces); the trigger fires only on a
-- move to a terminal status; is_terminal_status says which statuses are.
-- The waits themselves (woken by another session's commit, timeout, cancel,
-- REPEATABLE READ, 50 racing callers) are in test/t/180_await_billing.pl.
BEGIN;
SELECT plan(25);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't28\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
SELECT 't28_' || s, 'cus_t28' || s, 1000
  FROM unnest(ARRAY['completed', 'failed', 'blocked', 'needs_review', 'cancelled', 'pending']) AS s;
SELECT results_eq($$SELECT initiated FROM billguard.bill_period('2037-01')$$, ARRAY[6::bigint],
                  'six records claimed for 2037-01');
CREATE TEMPORARY TABLE t28_commits_before AS
  SELECT billguard.terminal_commits('t28_completed', '2037-01') AS n;
UPDATE billguard.billing_records r
   SET status = substr(r.customer_id, 5),
       charge_id = CASE WHEN r.customer_id = 't28_completed' THEN 'pi_t28completed' END,
       last_error = CASE WHEN r.customer_id = 't28_failed' THEN '402 card_error/card_declined' END
 WHERE r.billing_period = '2037-01' AND r.customer_id <> 't28_pending';
CREATE FUNCTION pg_temp.t28_state() RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(customer_id || '=' || status, ' ' ORDER BY customer_id)
         || format(' events=%s', (SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t28\_%'))
    FROM billguard.billing_records WHERE customer_id LIKE 't28\_%'
$$;
CREATE TEMPORARY TABLE t28_before AS SELECT pg_temp.t28_state() AS state;

------------------------------------------------------------------------------
-- Terminal records: answered at once, a long timeout notwithstanding.
SELECT results_eq($$SELECT * FROM billguard.await_billing('t28_completed', '2037-01', '1 hour')$$,
                  $$VALUES ('completed'::text, 'pi_t28completed'::text)$$,
                  'completed: answered with its charge id');
SELECT results_eq(format($$SELECT * FROM billguard.await_billing('t28_%s', '2037-01', '1 hour')$$, s),
                  format($$VALUES (%L::text, NULL::text)$$, s),
                  s || ': answered at once')
  FROM unnest(ARRAY['failed', 'blocked', 'needs_review', 'cancelled']) AS s;
SELECT results_eq($$SELECT * FROM billguard.await_billing('t28_completed', '2037-01')$$,
                  $$VALUES ('completed'::text, 'pi_t28completed'::text)$$,
                  'the timeout defaults (30 s) and a terminal record is still answered at once');

------------------------------------------------------------------------------
-- An open record.
SELECT results_eq($$SELECT * FROM billguard.await_billing('t28_pending', '2037-01', '0')$$,
                  $$VALUES ('in_progress'::text, NULL::text)$$,
                  'pending, timeout 0: in_progress without waiting');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_pending', '2037-01', '1 hour')$$, '25000',
                 'await_billing cannot wait: this transaction wrote the billing record of ''t28_pending'' in 2037-01 and has not committed',
                 'pending and written by this transaction: refused instead of sleeping an hour for nothing');

------------------------------------------------------------------------------
-- Bad input: 22023, and P0002 for a billing nobody claimed.
SELECT throws_ok($$SELECT * FROM billguard.await_billing(NULL, '2037-01')$$, '22023',
                 'customer_id must not be NULL', 'a NULL customer_id is refused');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_pending', '2037-13')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2037-13''',
                 'a bad period is refused');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_pending', NULL)$$, '22023', NULL,
                 'a NULL period is refused');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_pending', '2037-01', '-1 s')$$, '22023',
                 'timeout must be an interval of zero or more, got -00:00:01',
                 'a negative timeout is refused');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_pending', '2037-01', NULL)$$, '22023',
                 'timeout must be an interval of zero or more, got NULL', 'a NULL timeout is refused');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_nobody', '2037-01', '0')$$, 'P0002',
                 'no billing record for ''t28_nobody'' in 2037-01',
                 'an unknown (customer, period) is P0002, even with timeout 0');
SELECT throws_ok($$SELECT * FROM billguard.await_billing('t28_completed', '2037-02', '1 hour')$$, 'P0002',
                 'no billing record for ''t28_completed'' in 2037-02',
                 'a known customer in a period never billed is P0002');
SELECT is(pg_temp.t28_state(), (SELECT state FROM t28_before), 'await_billing changed nothing');

------------------------------------------------------------------------------
-- Only a COMMIT announces: the count has not moved inside this transaction.
SELECT isnt((SELECT n FROM t28_commits_before), NULL, 'billguard is preloaded: there is a wake-up count');
SELECT is(billguard.terminal_commits('t28_completed', '2037-01'), (SELECT n FROM t28_commits_before),
          'a record made terminal by an open transaction announces nothing yet');

-- The trigger and the statuses it announces.
SELECT trigger_is('billguard', 'billing_records', 'billing_records_terminal_wakeup',
                  'billguard', 'announce_terminal_status',
                  'billing_records_terminal_wakeup calls announce_terminal_status()');
SELECT matches((SELECT pg_get_triggerdef(t.oid) FROM pg_trigger t
                 WHERE t.tgrelid = 'billguard.billing_records'::regclass
                   AND t.tgname = 'billing_records_terminal_wakeup'),
               'BEFORE UPDATE OF status .* FOR EACH ROW WHEN \(\(\(old.status IS DISTINCT FROM new.status\) AND \(new.status = ANY \(ARRAY\[''completed''::text, ''failed''::text, ''blocked''::text, ''needs_review''::text, ''cancelled''::text, ''below_minimum''::text\]\)\)\)\)',
               'it fires on an update of status, per row, only on a move to a terminal status: those is_terminal_status() names');
SELECT is(array_agg(s ORDER BY s) FILTER (WHERE billguard.is_terminal_status(s)),
          ARRAY['blocked', 'cancelled', 'completed', 'failed', 'needs_review'],
          'terminal: completed, failed, blocked, needs_review, cancelled')
  FROM unnest(ARRAY['pending', 'dispatching', 'unknown', 'completed', 'failed', 'blocked',
                    'needs_review', 'cancelled']) AS s;
SELECT is(billguard.is_terminal_status(s), false, s || ' is not terminal')
  FROM unnest(ARRAY['pending', 'dispatching', 'unknown']) AS s;

SELECT * FROM finish();
ROLLBACK;
