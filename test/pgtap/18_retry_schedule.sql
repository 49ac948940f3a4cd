-- 18_retry_schedule.sql: how long billguard keeps trying, and the bulk requeue.
--
-- Proves: retry_delay doubles from 0.5 s to a 15-minute cap with jitter in
-- [0.5, 1); with the default 20 attempts an indeterminate outcome is
-- retried for more than an hour (at most about two and a half); a throttled
-- answer (429, 409) backs off a minute at most; record_charge_response
-- schedules 'retry' and 'throttled' by it. retry_period requeues every
-- failed (or needs_review) record of a period and nothing else, journaled
-- like retry_record, returns the count, and refuses other statuses and bad
-- periods (22023) without changing anything.
BEGIN;
SELECT plan(17);

SELECT is(current_setting('billguard.max_attempts'), '20', 'max_attempts defaults to 20');
CREATE TEMP TABLE t18_delays AS
  SELECT a, extract(epoch FROM billguard.retry_delay(a)) AS d, least(0.5 * 2 ^ (a - 1), 900)::numeric AS base
    FROM generate_series(1, 40) a, generate_series(1, 50) sample;
SELECT is((SELECT count(*) FROM t18_delays WHERE d < base * 0.5 OR d >= base), 0::bigint,
          'retry_delay(a) lies in [0.5, 1) x min(0.5 s x 2^(a-1), 15 min), for attempts 1..40');
SELECT is((SELECT round(max(d)) FROM t18_delays WHERE a = 1), 0::numeric, 'the first retry comes within half a second');
SELECT cmp_ok((SELECT max(d) FROM t18_delays WHERE a >= 12), '<=', 900::numeric, 'no delay exceeds 15 minutes');
SELECT cmp_ok((SELECT min(d) FROM t18_delays WHERE a >= 12), '>=', 450::numeric, 'from attempt 12 every delay is 7.5..15 minutes');
SELECT cmp_ok((SELECT sum(base) * 0.5 FROM (SELECT DISTINCT a, base FROM t18_delays WHERE a < 20) s), '>', 3600::numeric,
              'the 19 delays of 20 attempts add up to more than an hour at the least');
SELECT cmp_ok((SELECT sum(base) FROM (SELECT DISTINCT a, base FROM t18_delays WHERE a < 20) s), '<', 9000::numeric,
              '... and to less than two and a half hours at the most');
SELECT cmp_ok((SELECT max(extract(epoch FROM billguard.retry_delay(30, 60))) FROM generate_series(1, 50)), '<=', 60::numeric,
              'a throttled answer backs off a minute at most');

-- record_charge_response schedules retry and throttled answers by it.
UPDATE billguard.billing_records SET next_attempt_at = 'infinity'
 WHERE customer_id NOT LIKE 't18\_%' AND status IN ('pending', 'dispatching', 'unknown');
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
SELECT 't18_' || n, 'cus_t18_' || n, 1500 FROM unnest(ARRAY['a', 'b', 'c', 'd', 'e', 'f']) n;
SELECT count(*) FROM billguard.accounts a, billguard.bill_customer(a.customer_id, '2031-08') b
 WHERE a.customer_id LIKE 't18\_%';
UPDATE billguard.billing_records SET status = 'dispatching', attempts = 15 WHERE customer_id IN ('t18_a', 't18_b');
SELECT billguard.record_charge_response(billguard.idempotency_key(c, '2031-08'), 15, o, s, NULL, false, NULL, 'api_error',
                                        NULL, NULL, 'x', NULL, '2 minutes')
  FROM (VALUES ('t18_a', 'retry', 503), ('t18_b', 'throttled', 429)) v(c, o, s);
SELECT results_eq($$SELECT customer_id, status, next_attempt_at BETWEEN now() + interval '450 seconds' AND now() + interval '900 seconds',
                           next_attempt_at <= now() + interval '60 seconds'
                      FROM billguard.billing_records WHERE customer_id IN ('t18_a', 't18_b') ORDER BY 1$$,
                  $$VALUES ('t18_a', 'pending', true, false), ('t18_b', 'pending', false, true)$$,
                  'attempt 15: a 503 waits 7.5..15 minutes, a 429 a minute at most');

-- retry_period
UPDATE billguard.billing_records SET status = 'failed', attempts = 20, last_error = 'network: timeout'
 WHERE customer_id IN ('t18_a', 't18_b', 't18_c');
UPDATE billguard.billing_records SET status = 'needs_review', attempts = 20 WHERE customer_id = 't18_d';
UPDATE billguard.billing_records SET status = 'completed', charge_id = 'pi_t18e' WHERE customer_id = 't18_e';
SELECT is(billguard.retry_period('2031-08', 'failed'), 3::bigint, 'retry_period(failed): three records requeued');
SELECT results_eq($$SELECT customer_id, status, attempts, next_attempt_at FROM billguard.billing_records
                     WHERE customer_id LIKE 't18\_%' ORDER BY 1$$,
                  $$VALUES ('t18_a', 'pending', 0, now()), ('t18_b', 'pending', 0, now()), ('t18_c', 'pending', 0, now()),
                           ('t18_d', 'needs_review', 20, (SELECT next_attempt_at FROM billguard.billing_records WHERE customer_id = 't18_d')),
                           ('t18_e', 'completed', 0, (SELECT next_attempt_at FROM billguard.billing_records WHERE customer_id = 't18_e')),
                           ('t18_f', 'pending', 0, (SELECT created_at FROM billguard.billing_records WHERE customer_id = 't18_f'))$$,
                  'the failed records are pending, attempts 0, due now; the others untouched');
SELECT is((SELECT count(*) FROM billguard.journal WHERE event_type = 'RecordRequeued' AND customer_id LIKE 't18\_%'
            AND event ->> 'previous_status' = 'failed' AND event ->> 'last_error' = 'network: timeout'
            AND event ->> 'by' = session_user), 3::bigint,
          'one RecordRequeued per record, as retry_record writes it');
SELECT is(billguard.retry_period('2031-08', 'needs_review'), 1::bigint, 'retry_period(needs_review): one record');
SELECT is(billguard.retry_period('2031-08', 'failed'), 0::bigint, 'nothing failed left: 0');
SELECT throws_ok($$SELECT billguard.retry_period('2031-08', 'completed')$$, '22023',
                 'retry_period requeues failed or needs_review records, not ''completed''',
                 'retry_period refuses completed: 22023');
SELECT throws_ok($$SELECT billguard.retry_period('2031-08', NULL)$$, '22023',
                 'retry_period requeues failed or needs_review records, not NULL', 'retry_period refuses NULL: 22023');
SELECT throws_ok($$SELECT billguard.retry_period('2031-13', 'failed')$$, '22023', NULL, 'a bad period: 22023');

SELECT * FROM finish();
ROLLBACK;
