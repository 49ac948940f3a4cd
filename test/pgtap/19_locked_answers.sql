-- 19_locked_answers.sql: the dispatcher never waits for a row lock.
--
-- Proves: with a record's row locked by another session (dblink), recording
-- an answer to it returns 'locked' at once (no wait: statement_timeout
-- would fire) and changes nothing, and a search result likewise; once the
-- lock is gone the same answer is recorded. The row is committed for this
-- check only and removed again (its table refuses DELETE; replica mode
-- skips that trigger).
BEGIN;
SELECT plan(9);

CREATE EXTENSION IF NOT EXISTS dblink;
SELECT is(dblink_connect('t19_locker', format('host=%s port=%s dbname=%s user=%s',
            coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), '127.0.0.1'),
            current_setting('port'), current_database(), current_user)),
          'OK', 'a second session connects (dblink)');
SELECT is(dblink_exec('t19_locker', $$SET session_replication_role = replica$$), 'SET', '(replica mode for the clean-up)');
SELECT dblink_exec('t19_locker', $$DELETE FROM billguard.billing_records WHERE customer_id = 't19_locked'$$);
SELECT is(dblink_exec('t19_locker', $$INSERT INTO billguard.billing_records
            (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer, status, attempts,
             next_attempt_at, lease_expires_at)
            VALUES ('t19_locked', '2031-10', billguard.idempotency_key('t19_locked', '2031-10'), 100, 'usd',
                    'cus_t19', 'dispatching', 1, now() + interval '1 minute', now() + interval '1 minute')$$),
          'INSERT 0 1', 'a dispatching record, attempt 1, is committed');
SELECT is(dblink_exec('t19_locker', 'BEGIN'), 'BEGIN', 'the second session begins');
SELECT is((SELECT c FROM dblink('t19_locker', $$SELECT customer_id FROM billguard.billing_records
                                               WHERE customer_id = 't19_locked' FOR UPDATE$$) AS t(c text)),
          't19_locked', 'the second session holds the row lock');

SET LOCAL statement_timeout = '5s';
SELECT is(billguard.record_charge_response(billguard.idempotency_key('t19_locked', '2031-10'), 1, 'completed', 200,
            'pi_t19', false, 'req_t19', NULL, NULL, NULL, NULL, NULL, '2 minutes')
          || '/' || billguard.record_search_result(billguard.idempotency_key('t19_locked', '2031-10'), 1, 'retry', 500,
            NULL, 'req_t19', 'search failed with HTTP 500'),
          'locked/locked', 'an answer and a search result for the locked record: locked, at once');
RESET statement_timeout;
SELECT results_eq($$SELECT status, attempts, charge_id FROM billguard.billing_records WHERE customer_id = 't19_locked'$$,
                  $$VALUES ('dispatching', 1, NULL::text)$$, 'the locked record is unchanged');

SELECT is(dblink_exec('t19_locker', 'ROLLBACK'), 'ROLLBACK', 'the second session lets go');
SAVEPOINT t19_recorded;
SELECT is(billguard.record_charge_response(billguard.idempotency_key('t19_locked', '2031-10'), 1, 'completed', 200,
            'pi_t19', false, 'req_t19', NULL, NULL, NULL, NULL, NULL, '2 minutes'),
          'recorded', 'once the lock is gone the same answer is recorded');
ROLLBACK TO SAVEPOINT t19_recorded;
SELECT dblink_exec('t19_locker', $$DELETE FROM billguard.billing_records WHERE customer_id = 't19_locked'$$);
SELECT dblink_disconnect('t19_locker');

SELECT * FROM finish();
ROLLBACK;
