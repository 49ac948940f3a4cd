-- 03_cpp_boundary.sql: a C++ function that fails raises a clean SQL error.
--
-- Proves: bad input to a C++ function (idempotency_key) surfaces as SQLSTATE
-- 22023 with the C++ message, never XX000 (internal error) and never a
-- backend crash; afterwards the same backend keeps working: the same
-- pg_backend_pid(), following queries succeed, an error inside a SAVEPOINT
-- can be rolled back to and the transaction continues with its earlier work
-- intact; 1,000 failing calls caught in a loop leave the backend alive and
-- every one of them reported the same clean error; a compressed (TOASTed)
-- argument fails just as cleanly; in parallel workers the function sees the
-- leader's namespace and its errors reach the client as 22023.
BEGIN;
SELECT plan(28);

CREATE TEMP TABLE t03_facts (name text PRIMARY KEY, value text);
INSERT INTO t03_facts VALUES ('pid_before', pg_backend_pid()::text);

-- Runs a statement and returns its SQLSTATE and message ('00000' if it
-- succeeded), so the tests can say "not XX000" as well as "is 22023".
CREATE FUNCTION pg_temp.t03_outcome(statement text) RETURNS text
  LANGUAGE plpgsql AS $$
DECLARE
  state text;
  message text;
BEGIN
  EXECUTE statement;
  RETURN '00000';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
  RETURN state || ' ' || message;
END $$;

-- A failing C++ call: 22023, not XX000.
SELECT throws_ok($$SELECT billguard.idempotency_key('', '2026-08')$$, '22023',
                 'customer_id must not be empty', 'empty customer_id raises 22023 from C++');
SELECT is(pg_temp.t03_outcome($$SELECT billguard.idempotency_key('', '2026-08')$$),
          '22023 customer_id must not be empty', 'the outcome is exactly 22023 with the C++ message');
SELECT isnt(left(pg_temp.t03_outcome($$SELECT billguard.idempotency_key('cust_1', '2026-13')$$), 5),
            'XX000', 'a bad period is not reported as an internal error (XX000)');
SELECT is(pg_temp.t03_outcome($$SELECT billguard.idempotency_key('cust_1', '2026-08', 'a:b')$$),
          '22023 namespace must not contain '':''', 'a bad namespace is 22023 with the C++ message');
SELECT is(pg_temp.t03_outcome($$SELECT billguard.idempotency_key(repeat('x', 100000), '2026-08')$$),
          '22023 customer_id must be at most 255 bytes, got 100000', 'a 100 kB customer id is 22023, not a crash');

-- The same backend keeps working.
SELECT is(pg_backend_pid()::text, (SELECT value FROM t03_facts WHERE name = 'pid_before'),
          'pg_backend_pid() is unchanged after the failures (no crash, no reconnect)');
SELECT is(billguard.idempotency_key('cust_123', '2026-08', 'akka-billing'), '0f3fe6c7ee131571ac54c216d9553542',
          'a following call of the same C++ function succeeds');
SELECT is(billguard.key_namespace(), 'akka-billing', 'another C++ function still works');

-- An error inside an explicit SAVEPOINT is rolled back to; the transaction
-- continues and keeps its earlier work. (The failing statement prints one
-- ERROR line on stderr: that is expected.)
INSERT INTO t03_facts VALUES ('before_savepoint', 'kept');
SAVEPOINT t03_sp;
INSERT INTO t03_facts VALUES ('inside_savepoint', 'discarded');
\set ON_ERROR_STOP 0
SELECT billguard.idempotency_key('', '2026-08');
\set ON_ERROR_STOP 1
ROLLBACK TO SAVEPOINT t03_sp;
RELEASE SAVEPOINT t03_sp;
SELECT is(:'LAST_ERROR_SQLSTATE'::text, '22023', 'the statement inside the savepoint failed with 22023');
SELECT is(:'LAST_ERROR_MESSAGE'::text, 'customer_id must not be empty', 'and with the C++ message');
SELECT is((SELECT value FROM t03_facts WHERE name = 'before_savepoint'), 'kept',
          'work done before the savepoint survives ROLLBACK TO');
SELECT is((SELECT count(*) FROM t03_facts WHERE name = 'inside_savepoint'), 0::bigint,
          'work done inside the rolled-back savepoint is gone');
SELECT is(billguard.idempotency_key('cust_456', '2026-09', 'akka-billing'), 'dcbc621235ef1fb27999f191e826e070',
          'the transaction continues after ROLLBACK TO SAVEPOINT');
SELECT is(pg_backend_pid()::text, (SELECT value FROM t03_facts WHERE name = 'pid_before'),
          'pg_backend_pid() is unchanged after the savepoint rollback');

-- A failure caught in PL/pgSQL (an implicit savepoint) and work continues
-- in the same block.
DO $$
DECLARE
  key text;
BEGIN
  BEGIN
    PERFORM billguard.idempotency_key('cust_1', '2026-8');
  EXCEPTION WHEN invalid_parameter_value THEN
    INSERT INTO t03_facts VALUES ('caught_in_block', SQLSTATE);
  END;
  key := billguard.idempotency_key('cust_123', '2026-08', 'akka-billing');
  INSERT INTO t03_facts VALUES ('key_after_catch', key);
END $$;
SELECT is((SELECT value FROM t03_facts WHERE name = 'caught_in_block'), '22023',
          'PL/pgSQL catches the C++ error as invalid_parameter_value');
SELECT is((SELECT value FROM t03_facts WHERE name = 'key_after_catch'), '0f3fe6c7ee131571ac54c216d9553542',
          'the same block computes a correct key right after catching');

-- 1,000 failing calls in a loop.
DO $$
DECLARE
  i int;
  caught int := 0;
  clean int := 0;
  state text;
  message text;
BEGIN
  FOR i IN 1..1000 LOOP
    BEGIN
      PERFORM billguard.idempotency_key(CASE i % 4 WHEN 0 THEN '' ELSE 'cust_' || i END,
                                        CASE i % 4 WHEN 1 THEN '2026-' || (13 + i % 80) ELSE '2026-08' END,
                                        CASE i % 4 WHEN 2 THEN 'ns:' || i
                                                   WHEN 3 THEN ''
                                                   ELSE 'akka-billing' END);
    EXCEPTION WHEN OTHERS THEN
      GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
      caught := caught + 1;
      IF state = '22023' AND message IN ('customer_id must not be empty',
                                         'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)',
                                         'namespace must not contain '':''',
                                         'namespace must not be empty') THEN
        clean := clean + 1;
      END IF;
    END;
  END LOOP;
  INSERT INTO t03_facts VALUES ('loop_caught', caught::text), ('loop_clean', clean::text);
END $$;
SELECT is((SELECT value FROM t03_facts WHERE name = 'loop_caught'), '1000',
          '1,000 failing calls each raised an error');
SELECT is((SELECT value FROM t03_facts WHERE name = 'loop_clean'), '1000',
          'each of the 1,000 errors was 22023 with the expected message');
SELECT is(pg_backend_pid()::text, (SELECT value FROM t03_facts WHERE name = 'pid_before'),
          'pg_backend_pid() is unchanged after 1,000 failures');
SELECT is(billguard.idempotency_key('kunde_müller_€', '2026-08', 'akka-billing'), '367a7ab8ea973d526f05c19d4e3ba1e5',
          'the C++ function still computes correct keys after 1,000 failures');
SELECT is((SELECT count(DISTINCT billguard.idempotency_key('cust_' || g, '2026-08'))
             FROM generate_series(1, 1000) g), 1000::bigint,
          '1,000 successful calls afterwards give 1,000 distinct keys');
SELECT is((SELECT count(*) FROM pg_stat_activity WHERE pid = pg_backend_pid()), 1::bigint,
          'the backend is still listed in pg_stat_activity');

-- A compressed (TOASTed) argument read from a table goes through the
-- detoasting path inside the C++ boundary and still fails cleanly.
CREATE TEMP TABLE t03_big (v text);
INSERT INTO t03_big VALUES (repeat('x', 100000));
SELECT ok((SELECT pg_column_size(v) < 100000 FROM t03_big), 'the stored 100 kB value is compressed');
SELECT throws_ok($$SELECT billguard.idempotency_key(v, '2026-08') FROM t03_big$$, '22023',
                 'customer_id must be at most 255 bytes, got 100000',
                 'a compressed 100 kB customer id from a table is 22023');

-- Parallel workers (idempotency_key is PARALLEL SAFE): they compute the
-- same keys with the leader's namespace setting, and their errors reach the
-- client as the same clean 22023.
CREATE TABLE public.t03_parallel AS SELECT 'cust_' || g AS c FROM generate_series(1, 1000) g;
ANALYZE public.t03_parallel;
SET LOCAL parallel_setup_cost = 0;
SET LOCAL parallel_tuple_cost = 0;
SET LOCAL min_parallel_table_scan_size = 0;
SET LOCAL max_parallel_workers_per_gather = 2;
SET LOCAL billguard.key_namespace = 'other-ns';
CREATE FUNCTION pg_temp.t03_plan(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  line text;
  plan text := '';
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
    plan := plan || line || E'\n';
  END LOOP;
  RETURN plan;
END $$;
SELECT matches(pg_temp.t03_plan($$SELECT count(*) FROM public.t03_parallel
                                   WHERE billguard.idempotency_key(c, '2026-08') = 'a9937d13d8dac69afbf7a570a56bd1c1'$$),
               'Parallel Seq Scan on t03_parallel\s+Filter: \(billguard\.idempotency_key',
               'the key filter is planned inside parallel workers');
SELECT is((SELECT count(*) FROM public.t03_parallel
            WHERE billguard.idempotency_key(c, '2026-08') = 'a9937d13d8dac69afbf7a570a56bd1c1'), 1::bigint,
          'parallel workers use the leader''s namespace (other-ns vector for cust_123 found once)');
SELECT throws_ok($$SELECT count(*) FROM public.t03_parallel WHERE billguard.idempotency_key(c, '2026-13') IS NOT NULL$$,
                 '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)',
                 'an error inside parallel workers reaches the client as 22023');
RESET billguard.key_namespace;
RESET max_parallel_workers_per_gather;
RESET min_parallel_table_scan_size;
RESET parallel_tuple_cost;
RESET parallel_setup_cost;
SELECT is(pg_backend_pid()::text, (SELECT value FROM t03_facts WHERE name = 'pid_before'),
          'pg_backend_pid() is unchanged at the end');

SELECT * FROM finish();
ROLLBACK;
