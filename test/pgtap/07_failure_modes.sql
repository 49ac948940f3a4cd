-- 07_failure_modes.sql: the seed's three double-charge failure modes, at the
-- SQL level.
--
-- (1) Recovery timestamp: the key stored in billing_records and in the
--     BillingInitiated event equals idempotency_key(customer, period) however
--     and whenever it is recomputed (later, other TimeZone, other DateStyle);
--     a later bill_customer returns the stored key, even if the namespace
--     setting has changed since.
-- (2) Retried request envelope: 50 calls with 50 different request_ids give
--     one record, one BillingInitiated event, one key, 1 initiated + 49
--     in_progress.
-- (3) Re-fired scheduler: a second bill_period creates nothing; with the
--     records present but every snapshot deleted and the scheduler's and the
--     billings' events pruned by retention, bill_period and bill_customer
--     still create nothing: the pre-flight table is the authority. The
--     scheduler's seq_nr must not go back either.
--
-- Vector: printf '%s' 't07_recovery:2033-03:akka-billing' | sha256sum | cut -c1-32
--         -> 2561142dee6316f6ab62b92114a60fa8
BEGIN;
SELECT plan(40);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't07\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency) VALUES
  ('t07_recovery', 'cus_t07recovery', 4200, 'usd'),
  ('t07_retry', 'cus_t07retry', 1500, 'gbp'),
  ('t07_sched1', 'cus_t07sched1', 100, 'usd'),
  ('t07_sched2', 'cus_t07sched2', 200, 'usd'),
  ('t07_sched3', 'cus_t07sched3', 300, 'usd');

CREATE TEMP TABLE t07_keys (label text PRIMARY KEY, key text);

------------------------------------------------------------------------------
-- (1) Recovery timestamp.
INSERT INTO t07_keys SELECT 'claimed', idempotency_key FROM billguard.bill_customer('t07_recovery', '2033-03', 'req-first');
SELECT is((SELECT key FROM t07_keys WHERE label = 'claimed'), '2561142dee6316f6ab62b92114a60fa8',
          '(1) the claimed key is the test vector');
SELECT is((SELECT idempotency_key FROM billguard.billing_records WHERE customer_id = 't07_recovery'),
          '2561142dee6316f6ab62b92114a60fa8', '(1) the record stores that key');
SELECT is((SELECT event ->> 'idempotency_key' FROM billguard.journal WHERE persistence_id = 'billing-t07_recovery-2033-03'),
          '2561142dee6316f6ab62b92114a60fa8', '(1) the BillingInitiated event stores that key');

DO $$BEGIN PERFORM pg_sleep(0.01); END$$;
INSERT INTO t07_keys VALUES ('after_sleep', billguard.idempotency_key('t07_recovery', '2033-03'));
SET LOCAL TimeZone = 'Pacific/Kiritimati';
INSERT INTO t07_keys VALUES ('tz_kiritimati', billguard.idempotency_key('t07_recovery', '2033-03'));
SET LOCAL TimeZone = 'America/Los_Angeles';
INSERT INTO t07_keys VALUES ('tz_los_angeles', billguard.idempotency_key('t07_recovery', '2033-03'));
SET LOCAL DateStyle = 'SQL, DMY';
INSERT INTO t07_keys VALUES ('datestyle_sql_dmy', billguard.idempotency_key('t07_recovery', '2033-03'));
SET LOCAL DateStyle = 'German';
SET LOCAL IntervalStyle = 'sql_standard';
INSERT INTO t07_keys VALUES ('datestyle_german', billguard.idempotency_key('t07_recovery', '2033-03'));
SELECT is((SELECT key FROM t07_keys WHERE label = 'after_sleep'), '2561142dee6316f6ab62b92114a60fa8',
          '(1) recomputed after a sleep: same key');
SELECT is((SELECT key FROM t07_keys WHERE label = 'tz_kiritimati'), '2561142dee6316f6ab62b92114a60fa8',
          '(1) recomputed with TimeZone Pacific/Kiritimati: same key');
SELECT is((SELECT key FROM t07_keys WHERE label = 'tz_los_angeles'), '2561142dee6316f6ab62b92114a60fa8',
          '(1) recomputed with TimeZone America/Los_Angeles: same key');
SELECT is((SELECT key FROM t07_keys WHERE label = 'datestyle_sql_dmy'), '2561142dee6316f6ab62b92114a60fa8',
          '(1) recomputed with DateStyle SQL, DMY: same key');
SELECT is((SELECT key FROM t07_keys WHERE label = 'datestyle_german'), '2561142dee6316f6ab62b92114a60fa8',
          '(1) recomputed with DateStyle German: same key');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t07_recovery', '2033-03', 'req-recovery')$$,
                  $$VALUES ('in_progress'::text, '2561142dee6316f6ab62b92114a60fa8'::text, NULL::text)$$,
                  '(1) the resume path (a second bill_customer, other time zone and date style) returns the stored key');
SELECT is(billguard.entity_state('billing-t07_recovery-2033-03') ->> 'idempotency_key',
          '2561142dee6316f6ab62b92114a60fa8', '(1) the folded entity state carries the stored key');
RESET TimeZone;
RESET DateStyle;
RESET IntervalStyle;

-- Even a changed namespace does not change a claimed billing's key: the
-- record answers, nothing is recomputed.
SET LOCAL billguard.key_namespace = 'other-ns';
SELECT is(billguard.idempotency_key('t07_recovery', '2033-03'), '4835de5488de72a41d94bd7715efc8f6',
          '(1) with namespace other-ns a fresh computation would differ');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t07_recovery', '2033-03', 'req-after-ns-change')$$,
                  $$VALUES ('in_progress'::text, '2561142dee6316f6ab62b92114a60fa8'::text, NULL::text)$$,
                  '(1) but bill_customer still returns the stored key');
SELECT results_eq($$SELECT * FROM billguard.bill_period('2033-03')$$,
                  $$VALUES ('2033-03'::text, 4::bigint, 0::bigint, 1::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  '(1) and bill_period does not claim t07_recovery again');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't07_recovery'), 1::bigint,
          '(1) t07_recovery still has exactly one record');
RESET billguard.key_namespace;

------------------------------------------------------------------------------
-- (2) Retried request envelopes: 50 calls, 50 request ids.
CREATE TEMP TABLE t07_answers (n int PRIMARY KEY, request_id text, status text, key text, charge_id text);
DO $$
DECLARE
  i int;
  request text;
  answer record;
BEGIN
  FOR i IN 1..50 LOOP
    -- What a caller's envelope would contain: a reply address, a UUID, receipt time.
    request := format('reply-to=actor://node-%s/temp/$%s;uuid=%s;received=%s',
                      i % 3, i, md5(random()::text || i), clock_timestamp());
    SELECT * INTO answer FROM billguard.bill_customer('t07_retry', '2033-05', request);
    INSERT INTO t07_answers VALUES (i, request, answer.status, answer.idempotency_key, answer.charge_id);
  END LOOP;
END $$;
SELECT is((SELECT count(DISTINCT request_id) FROM t07_answers), 50::bigint, '(2) 50 different request ids were used');
SELECT is((SELECT status FROM t07_answers WHERE n = 1), 'initiated', '(2) the first call initiated');
SELECT is((SELECT count(*) FROM t07_answers WHERE n > 1 AND status = 'in_progress'), 49::bigint,
          '(2) the other 49 answered in_progress');
SELECT is((SELECT count(DISTINCT key) FROM t07_answers), 1::bigint, '(2) all 50 answers carry one key');
SELECT is((SELECT DISTINCT key FROM t07_answers), billguard.idempotency_key('t07_retry', '2033-05'),
          '(2) and it is the content-hash key');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't07_retry' AND billing_period = '2033-05'), 1::bigint,
          '(2) one record');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-t07_retry-2033-05'), 1::bigint,
          '(2) one BillingInitiated event');
SELECT is((SELECT request_id FROM billguard.billing_records WHERE customer_id = 't07_retry' AND billing_period = '2033-05'),
          (SELECT request_id FROM t07_answers WHERE n = 1), '(2) the record traces the first request only');
SELECT ok(NOT EXISTS (SELECT 1 FROM t07_answers a
                        WHERE a.key IN (billguard.idempotency_key('t07_retry', '2033-05', md5(a.request_id)))),
          '(2) no key depends on the request envelope');

------------------------------------------------------------------------------
-- (3) Re-fired scheduler.
SELECT results_eq($$SELECT * FROM billguard.bill_period('2033-04')$$,
                  $$VALUES ('2033-04'::text, 5::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  '(3) first tick of 2033-04: 5 initiated');
INSERT INTO t07_keys
SELECT 'p4_' || customer_id, idempotency_key FROM billguard.billing_records WHERE billing_period = '2033-04';
SELECT results_eq($$SELECT * FROM billguard.bill_period('2033-04')$$,
                  $$VALUES ('2033-04'::text, 0::bigint, 0::bigint, 5::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  '(3) the tick fires again: nothing initiated');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2033-04'), 5::bigint,
          '(3) still 5 records');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t07\_%-2033-04'), 5::bigint,
          '(3) still 5 BillingInitiated events');

-- Lose every snapshot and prune the scheduler's events and the billings'
-- events: retention keeps only each entity's newest event.
CREATE TEMP TABLE t07_scheduler AS SELECT billguard.highest_seq_nr('billing-scheduler') AS seq_nr_before;
SELECT ok(billguard.save_snapshot('billing-scheduler') > 0, '(3) scheduler snapshotted');
SELECT results_eq($$SELECT events_deleted > 0 FROM billguard.apply_retention('billing-scheduler', 1)$$,
                  ARRAY[true], '(3) the scheduler''s events were pruned by retention');
SELECT is(count(billguard.save_snapshot('billing-' || customer_id || '-2033-04')), 5::bigint,
          '(3) the five billing entities snapshotted')
  FROM billguard.billing_records WHERE billing_period = '2033-04';
SELECT is(sum(d.events_deleted), 0::numeric, '(3) retention keeps each billing''s newest (only) event')
  FROM billguard.billing_records r, billguard.apply_retention('billing-' || r.customer_id || '-2033-04', 1) d
 WHERE r.billing_period = '2033-04';
DELETE FROM billguard.snapshots;
ALTER TABLE t07_scheduler ADD COLUMN lost_at timestamptz;
UPDATE t07_scheduler SET lost_at = clock_timestamp();
SELECT is((SELECT count(*) FROM billguard.snapshots), 0::bigint, '(3) every snapshot is gone');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler'),
          1::bigint, '(3) the scheduler keeps only its newest event');

SELECT results_eq($$SELECT * FROM billguard.bill_period('2033-04')$$,
                  $$VALUES ('2033-04'::text, 0::bigint, 0::bigint, 5::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  '(3) after losing snapshots and events, the re-fired tick still initiates nothing');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t07_sched2', '2033-04', 'req-after-loss')$$,
                  $$SELECT 'in_progress'::text, (SELECT key FROM t07_keys WHERE label = 'p4_t07_sched2'), NULL::text$$,
                  '(3) bill_customer also answers from the record, with the original key');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE billing_period = '2033-04'), 5::bigint,
          '(3) still exactly 5 records for 2033-04');
SELECT is((SELECT count(*) FROM billguard.journal WHERE event_type = 'BillingInitiated'
             AND persistence_id LIKE 'billing-t07\_%-2033-04'), 5::bigint,
          '(3) no BillingInitiated event was written again');
SELECT bag_eq($$SELECT 'p4_' || customer_id AS label, idempotency_key AS key
                  FROM billguard.billing_records WHERE billing_period = '2033-04'$$,
              $$SELECT label, key FROM t07_keys WHERE label LIKE 'p4\_%'$$,
              '(3) every record keeps its original key');
-- The journal's sequence must not go back when a cache (the snapshot) is
-- lost: a reused seq_nr is a second, different event under an id that
-- readers have already seen.
SELECT cmp_ok(billguard.highest_seq_nr('billing-scheduler'), '>=', (SELECT seq_nr_before FROM t07_scheduler),
              '(3) the scheduler''s seq_nr did not go back after snapshot loss');
SELECT is((SELECT count(*) FROM billguard.journal j, t07_scheduler t
            WHERE j.persistence_id = 'billing-scheduler' AND j.seq_nr <= t.seq_nr_before AND j.written_at > t.lost_at),
          0::bigint, '(3) no scheduler seq_nr at or below the old highest was written again after the loss');

SELECT * FROM finish();
ROLLBACK;
