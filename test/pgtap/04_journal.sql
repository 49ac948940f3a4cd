-- 04_journal.sql: the event journal is append-only, gap-free and replayable.
--
-- Proves: append_event numbers events 1, 2, 3 without gaps; a stale (or
-- future) expected_seq_nr is SQLSTATE 40001 and writes nothing; events()
-- replays in order with from/to bounds and max_count; several appends rolled
-- back together leave nothing (atomic multi-event writes); UPDATE, DELETE and
-- TRUNCATE of billguard.journal are refused (42501); after save_snapshot +
-- apply_retention the covered events are gone but the newest, which keeps
-- the highest seq_nr, so seq_nr never goes back; entity_state folds the snapshot plus later
-- events; a billing entity pruned down to its snapshot still folds to
-- 'in_progress'; billguard.snapshot_every takes automatic snapshots; bad
-- input to append_event is 22023 and writes nothing.
BEGIN;
SELECT plan(61);

-- Gap-free appends.
SELECT is(billguard.append_event('t04-entity-a', 0, 'Created', '{"n": 1}'), 1::bigint, 'first append returns seq_nr 1');
SELECT is(billguard.append_event('t04-entity-a', 1, 'Changed', '{"n": 2}'), 2::bigint, 'second append returns seq_nr 2');
SELECT is(billguard.append_event('t04-entity-a', 2, 'Changed', '{"n": 3}'), 3::bigint, 'third append returns seq_nr 3');
SELECT results_eq($$SELECT seq_nr FROM billguard.journal WHERE persistence_id = 't04-entity-a' ORDER BY seq_nr$$,
                  ARRAY[1, 2, 3]::bigint[], 'the journal holds seq_nr 1, 2, 3 and nothing else');
SELECT is(billguard.highest_seq_nr('t04-entity-a'), 3::bigint, 'highest_seq_nr is 3');
SELECT is(billguard.highest_seq_nr('t04-no-such-entity'), 0::bigint, 'highest_seq_nr of an unknown entity is 0');

-- Optimistic concurrency.
SELECT throws_ok($$SELECT billguard.append_event('t04-entity-a', 1, 'Stale', '{}')$$, '40001',
                 'concurrent append to t04-entity-a: expected seq_nr 1, journal is at 3',
                 'a stale expected_seq_nr is refused with 40001');
SELECT throws_ok($$SELECT billguard.append_event('t04-entity-a', 0, 'Stale', '{}')$$, '40001',
                 'concurrent append to t04-entity-a: expected seq_nr 0, journal is at 3',
                 'expected_seq_nr 0 on an existing entity is refused with 40001');
SELECT throws_ok($$SELECT billguard.append_event('t04-entity-a', 5, 'Ahead', '{}')$$, '40001',
                 'concurrent append to t04-entity-a: expected seq_nr 5, journal is at 3',
                 'an expected_seq_nr ahead of the journal is refused (no gaps)');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 't04-entity-a'), 3::bigint,
          'the refused appends wrote nothing');

-- Replay.
SELECT results_eq($$SELECT seq_nr, event_type, event FROM billguard.events('t04-entity-a')$$,
                  $$VALUES (1::bigint, 'Created', '{"n": 1}'::jsonb), (2, 'Changed', '{"n": 2}'), (3, 'Changed', '{"n": 3}')$$,
                  'events() replays every event in order');
SELECT results_eq($$SELECT seq_nr FROM billguard.events('t04-entity-a', 2)$$,
                  ARRAY[2, 3]::bigint[], 'events(from 2) starts at 2');
SELECT results_eq($$SELECT seq_nr FROM billguard.events('t04-entity-a', to_seq_nr => 2)$$,
                  ARRAY[1, 2]::bigint[], 'events(to 2) stops at 2');
SELECT results_eq($$SELECT seq_nr FROM billguard.events('t04-entity-a', 2, 2)$$,
                  ARRAY[2]::bigint[], 'events(from 2, to 2) is just 2');
SELECT results_eq($$SELECT seq_nr FROM billguard.events('t04-entity-a', max_count => 2)$$,
                  ARRAY[1, 2]::bigint[], 'events(max_count 2) is the first two');
SELECT results_eq($$SELECT seq_nr FROM billguard.events('t04-entity-a', 2, NULL, 1)$$,
                  ARRAY[2]::bigint[], 'events(from 2, max_count 1) is just 2');
SELECT is_empty($$SELECT * FROM billguard.events('t04-entity-a', max_count => 0)$$, 'events(max_count 0) is empty');
SELECT is_empty($$SELECT * FROM billguard.events('t04-entity-a', 4)$$, 'events(from beyond the end) is empty');
SELECT is_empty($$SELECT * FROM billguard.events('t04-entity-a', 3, 2)$$, 'events(from 3, to 2) is empty');
SELECT is_empty($$SELECT * FROM billguard.events('t04-no-such-entity')$$, 'events() of an unknown entity is empty');
SELECT throws_ok($$SELECT * FROM billguard.events('t04-entity-a', max_count => -1)$$, '22023',
                 'max_count must be >= 0, got -1', 'events(max_count -1) is refused');
SELECT throws_ok($$SELECT * FROM billguard.events(NULL)$$, '22023',
                 'persistence_id must not be NULL', 'events(NULL) is refused');

-- Several appends in one savepoint, rolled back: none is visible.
SAVEPOINT t04_multi;
SELECT billguard.append_event('t04-entity-a', 3, 'Batch', '{"n": 4}') AS ignored \gset
SELECT billguard.append_event('t04-entity-a', 4, 'Batch', '{"n": 5}') AS ignored \gset
SELECT billguard.append_event('t04-entity-m', 0, 'Batch', '{"n": 1}') AS ignored \gset
ROLLBACK TO SAVEPOINT t04_multi;
RELEASE SAVEPOINT t04_multi;
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id IN ('t04-entity-a', 't04-entity-m')),
          3::bigint, 'a rolled-back batch of appends to two entities leaves none of them');
SELECT is(billguard.highest_seq_nr('t04-entity-a'), 3::bigint, 'highest_seq_nr is back to 3 after the rollback');
SELECT is(billguard.append_event('t04-entity-a', 3, 'Changed', '{"n": 4}'), 4::bigint,
          'the next append after the rollback gets seq_nr 4 (no gap)');

-- Append-only.
SELECT throws_ok($$UPDATE billguard.journal SET event = '{}' WHERE persistence_id = 't04-entity-a'$$, '42501',
                 'billguard.journal is append-only: UPDATE refused', 'UPDATE of the journal is refused');
SELECT throws_ok($$DELETE FROM billguard.journal WHERE persistence_id = 't04-entity-a'$$, '42501',
                 'billguard.journal is append-only: DELETE refused', 'DELETE from the journal is refused');
SELECT throws_ok($$DELETE FROM billguard.journal WHERE false$$, '42501',
                 'billguard.journal is append-only: DELETE refused', 'even a DELETE matching no row is refused');
SELECT throws_ok($$TRUNCATE billguard.journal$$, '42501',
                 'billguard.journal is append-only: TRUNCATE refused', 'TRUNCATE of the journal is refused');
SELECT results_eq($$SELECT seq_nr, event FROM billguard.journal WHERE persistence_id = 't04-entity-a' ORDER BY seq_nr$$,
                  $$VALUES (1::bigint, '{"n": 1}'::jsonb), (2, '{"n": 2}'), (3, '{"n": 3}'), (4, '{"n": 4}')$$,
                  'the refused changes left the events as written');

-- Snapshot + retention: events go, the sequence does not go back.
SELECT is(billguard.append_event('t04-entity-r', g - 1, 'Step', jsonb_build_object('n', g)), g::bigint,
          'retention entity: append ' || g)
  FROM generate_series(1, 5) g;
SELECT is(billguard.save_snapshot('t04-entity-r'), 5::bigint, 'save_snapshot returns the latest seq_nr 5');
SELECT results_eq($$SELECT * FROM billguard.apply_retention('t04-entity-r', 1)$$,
                  $$VALUES (0::bigint, 4::bigint)$$,
                  'apply_retention(keep 1) deletes the covered events but the newest');
SELECT results_eq($$SELECT seq_nr FROM billguard.events('t04-entity-r')$$, ARRAY[5::bigint],
                  'only the newest event stays: it keeps the highest seq_nr');
SELECT is(billguard.highest_seq_nr('t04-entity-r'), 5::bigint, 'highest_seq_nr is still 5');
SELECT throws_ok($$SELECT billguard.append_event('t04-entity-r', 0, 'Step', '{}')$$, '40001',
                 'concurrent append to t04-entity-r: expected seq_nr 0, journal is at 5',
                 'after retention, appending at 0 is refused: seq_nr never goes back');
SELECT is(billguard.append_event('t04-entity-r', 5, 'Step', '{"n": 6}'), 6::bigint,
          'after retention the next append uses the old highest seq_nr and gets 6');
SELECT is((billguard.entity_state('t04-entity-r') ->> 'seq_nr')::bigint, 6::bigint,
          'entity_state after retention is at seq_nr 6');

-- entity_state folds the latest snapshot plus the later events.
SELECT billguard.append_event('billing-t04_fold-2031-03', 0, 'BillingInitiated',
         '{"customer_id": "t04_fold", "billing_period": "2031-03", "idempotency_key": "k-t04-fold",
           "amount_cents": 1200, "currency": "eur", "initiated_at": "2031-03-01T00:00:00Z"}') AS ignored \gset
SELECT billguard.append_event('billing-t04_fold-2031-03', 1, 'ChargeAttempted', '{"attempt": 1}') AS ignored \gset
SELECT is(billguard.save_snapshot('billing-t04_fold-2031-03'), 2::bigint, 'fold entity snapshotted at seq_nr 2');
-- Mark the snapshot so the fold provably starts from it.
UPDATE billguard.snapshots SET state = state || '{"marker": "from-snapshot"}'
 WHERE persistence_id = 'billing-t04_fold-2031-03';
SELECT billguard.append_event('billing-t04_fold-2031-03', 2, 'ChargeAttempted', '{"attempt": 2}') AS ignored \gset
SELECT billguard.append_event('billing-t04_fold-2031-03', 3, 'BillingCompleted', '{"charge_id": "ch_t04"}') AS ignored \gset
SELECT is(billguard.entity_state('billing-t04_fold-2031-03') ->> 'marker', 'from-snapshot',
          'entity_state starts from the snapshot');
SELECT is(billguard.entity_state('billing-t04_fold-2031-03') - 'marker' - 'initiated_at',
          '{"entity": "billing", "status": "completed", "attempts": 2, "charge_id": "ch_t04",
            "customer_id": "t04_fold", "billing_period": "2031-03", "idempotency_key": "k-t04-fold",
            "amount_cents": 1200, "currency": "eur", "last_event_type": "BillingCompleted",
            "persistence_id": "billing-t04_fold-2031-03", "seq_nr": 4}'::jsonb,
          'entity_state = snapshot + the two later events');

-- A billing entity with only BillingInitiated + ChargeAttempted, snapshotted
-- and pruned, still folds to in_progress.
SELECT billguard.append_event('billing-t04_pruned-2031-03', 0, 'BillingInitiated',
         '{"customer_id": "t04_pruned", "billing_period": "2031-03", "idempotency_key": "k-t04-pruned",
           "amount_cents": 500, "currency": "usd", "initiated_at": "2031-03-01T00:00:00Z"}') AS ignored \gset
SELECT billguard.append_event('billing-t04_pruned-2031-03', 1, 'ChargeAttempted', '{"attempt": 1}') AS ignored \gset
SELECT is(billguard.save_snapshot('billing-t04_pruned-2031-03'), 2::bigint, 'pruned entity snapshotted at seq_nr 2');
SELECT results_eq($$SELECT * FROM billguard.apply_retention('billing-t04_pruned-2031-03', 1)$$,
                  $$VALUES (0::bigint, 1::bigint)$$, 'retention deletes the covered event but the newest');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 'billing-t04_pruned-2031-03'), 1::bigint,
          'the pruned entity keeps only its newest event');
SELECT is(billguard.entity_state('billing-t04_pruned-2031-03') ->> 'status', 'in_progress',
          'the pruned billing entity still folds to in_progress');
SELECT is(billguard.entity_state('billing-t04_pruned-2031-03') ->> 'idempotency_key', 'k-t04-pruned',
          'the pruned billing entity keeps its idempotency key');
SELECT is((billguard.entity_state('billing-t04_pruned-2031-03') ->> 'attempts')::int, 1,
          'the pruned billing entity keeps its attempt count');

-- Automatic snapshots every billguard.snapshot_every events.
SET LOCAL billguard.snapshot_every = 3;
SELECT is(array_agg(billguard.append_event('t04-entity-s', g - 1, 'Tick', jsonb_build_object('n', g))),
          ARRAY[1, 2, 3, 4, 5, 6, 7]::bigint[], 'snapshot_every 3: seven appends return 1..7')
  FROM generate_series(1, 7) g;
RESET billguard.snapshot_every;
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id = 't04-entity-s'), 7::bigint,
          'snapshot_every 3: seven events appended');
SELECT results_eq($$SELECT seq_nr FROM billguard.snapshots WHERE persistence_id = 't04-entity-s' ORDER BY seq_nr$$,
                  ARRAY[3, 6]::bigint[], 'snapshot_every 3: two snapshots, at seq_nr 3 and 6');

-- Bad input: 22023, nothing written.
CREATE TEMP TABLE t04_count AS SELECT count(*) AS n FROM billguard.journal;
SELECT throws_ok($$SELECT billguard.append_event(NULL, 0, 'E', '{}')$$, '22023',
                 'persistence_id must not be empty', 'NULL persistence_id is refused');
SELECT throws_ok($$SELECT billguard.append_event('', 0, 'E', '{}')$$, '22023',
                 'persistence_id must not be empty', 'empty persistence_id is refused');
SELECT throws_ok($$SELECT billguard.append_event('t04-bad', -1, 'E', '{}')$$, '22023',
                 'expected_seq_nr must be >= 0', 'negative expected_seq_nr is refused');
SELECT throws_ok($$SELECT billguard.append_event('t04-bad', NULL, 'E', '{}')$$, '22023',
                 'expected_seq_nr must be >= 0', 'NULL expected_seq_nr is refused');
SELECT throws_ok($$SELECT billguard.append_event('t04-bad', 0, '', '{}')$$, '22023',
                 'event_type must not be empty', 'empty event_type is refused');
SELECT throws_ok($$SELECT billguard.append_event('t04-bad', 0, 'E', NULL)$$, '22023',
                 'event must not be NULL', 'NULL event is refused');
SELECT is((SELECT count(*) FROM billguard.journal), (SELECT n FROM t04_count),
          'the refused appends wrote nothing');

SELECT * FROM finish();
ROLLBACK;
