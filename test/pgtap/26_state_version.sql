-- 26_state_version.sql: snapshots carry the state_version of their state,
-- and a snapshot of an older version is upcast when folded.
--
-- Proves: the state version is 2 and save_snapshot records it; upcast_state
-- brings a version 1 scheduler state to version 2 (last_issued_period the
-- greatest issued period, last_issued_at unknown, ended_when_issued
-- empty: 0.1.0 did not record it), gives a state without
-- issued_periods an empty list, and leaves version 2 states and billing
-- entities alone; entity_state folds a version 1 snapshot whose events
-- retention deleted (before, such a snapshot was skipped and the fold lost
-- every period those events issued); retention counts version 1 snapshots;
-- a snapshot of a newer version than the library's is never folded.
BEGIN;
SELECT plan(15);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't26\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
VALUES ('t26_a', 'cus_t26a', 1200, 'usd');

SELECT is(billguard.state_version(), 2, 'the state version is 2');

SELECT is(billguard.upcast_state(
            '{"entity": "billing-scheduler", "issued_periods": ["2036-01", "2036-03", "2036-02"]}', 1),
          '{"entity": "billing-scheduler", "issued_periods": ["2036-01", "2036-03", "2036-02"],
            "last_issued_period": "2036-03", "last_issued_at": null, "ended_when_issued": []}'::jsonb,
          'upcast 1 -> 2: last_issued_period is the greatest issued period, last_issued_at unknown, ended_when_issued empty');
SELECT is(billguard.upcast_state('{"entity": "billing-scheduler"}', 1),
          '{"entity": "billing-scheduler", "issued_periods": [], "last_issued_period": null,
            "last_issued_at": null, "ended_when_issued": []}'::jsonb,
          'upcast 1 -> 2: a state without issued_periods gets an empty list');
SELECT is(billguard.upcast_state('{"entity": "billing", "status": "completed"}', 1),
          '{"entity": "billing", "status": "completed"}'::jsonb,
          'upcast 1 -> 2: a billing entity''s state is unchanged');
SELECT is(billguard.upcast_state('{"entity": "billing-scheduler", "issued_periods": ["2036-01"]}', 2),
          '{"entity": "billing-scheduler", "issued_periods": ["2036-01"]}'::jsonb,
          'a version 2 state is not upcast');

-- Two periods issued; a version 1 snapshot covers both ticks, and retention
-- deletes the first tick's event.
SELECT is((SELECT initiated FROM billguard.bill_period('2036-01')), 1::bigint, '2036-01 billed');
SELECT is((SELECT initiated FROM billguard.bill_period('2036-02')), 1::bigint, '2036-02 billed');
CREATE TEMP TABLE t26_head AS
  SELECT billguard.highest_seq_nr('billing-scheduler') AS seq_nr,
         (SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler') AS events;
INSERT INTO billguard.snapshots (persistence_id, seq_nr, state, state_version)
SELECT 'billing-scheduler', seq_nr,
       billguard.entity_state('billing-scheduler') - 'persistence_id' - 'seq_nr'
         - 'last_issued_period' - 'last_issued_at',
       1
  FROM t26_head;
SELECT results_eq($$SELECT snapshots_deleted, events_deleted FROM billguard.apply_retention('billing-scheduler', 1)$$,
                  $$SELECT 0::bigint, events - 1 FROM t26_head$$,
                  'retention counts the version 1 snapshot and deletes the events it covers but the newest');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-scheduler'
             AND event ->> 'billing_period' = '2036-01'), 0::bigint,
          'the event that issued 2036-01 is gone');
SELECT ok((billguard.entity_state('billing-scheduler') -> 'issued_periods') ?& ARRAY['2036-01', '2036-02'],
          'entity_state folds the upcast version 1 snapshot: both periods still issued');
SELECT is(billguard.entity_state('billing-scheduler') ->> 'last_issued_period', '2036-02',
          'entity_state: the last period issued, from the upcast');

SELECT is((SELECT initiated FROM billguard.bill_period('2036-03')), 1::bigint, '2036-03 billed');
SELECT is(billguard.save_snapshot('billing-scheduler'), (SELECT seq_nr + 1 FROM t26_head),
          'a new snapshot after the next tick');
SELECT is((SELECT state_version FROM billguard.snapshots WHERE persistence_id = 'billing-scheduler'
            ORDER BY seq_nr DESC LIMIT 1), 2, 'save_snapshot records state version 2');

-- A newer library's snapshot (a state this one cannot read) is never folded.
INSERT INTO billguard.snapshots (persistence_id, seq_nr, state, state_version)
VALUES ('billing-scheduler', billguard.highest_seq_nr('billing-scheduler') + 1,
        '{"entity": "billing-scheduler", "shape": "from the future"}', 3);
SELECT ok((billguard.entity_state('billing-scheduler') -> 'issued_periods') ?& ARRAY['2036-01', '2036-02', '2036-03']
          AND NOT billguard.entity_state('billing-scheduler') ? 'shape',
          'a version 3 snapshot is skipped; the fold starts from the version 2 one');

SELECT * FROM finish();
ROLLBACK;
