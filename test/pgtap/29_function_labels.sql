-- 29_function_labels.sql: every function of the extension carries the
-- volatility and parallel label its body earns, and PostgreSQL's own rule
-- (opr_sanity: an IMMUTABLE function is never PARALLEL UNSAFE) holds for it.
--
-- Proves: no function is IMMUTABLE and PARALLEL UNSAFE; every IMMUTABLE or
-- STABLE one is PARALLEL SAFE but those named in `not_parallel_safe` with a
-- reason (none today); a PARALLEL SAFE function establishes no
-- subtransaction (a PL/pgSQL EXCEPTION block errors in a parallel query),
-- writes nothing and sets no setting; a function calls none of the
-- extension's functions that is less safe or more volatile than itself; and
-- run under force_parallel_mode, the PARALLEL SAFE functions that have a
-- reason to differ in a worker (a subtransaction, this transaction's rows,
-- the scheduler's settings, reading the journal) run there and answer as in
-- the leader.
BEGIN;
SELECT plan(12);

CREATE TEMP TABLE extension_functions ON COMMIT DROP AS
SELECT p.oid, p.oid::regprocedure::text AS signature, l.lanname, p.provolatile, p.proparallel,
       CASE WHEN l.lanname IN ('sql', 'plpgsql') THEN pg_get_functiondef(p.oid) END AS body
  FROM pg_proc p
  JOIN pg_language l ON l.oid = p.prolang
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard');

-- A STABLE or IMMUTABLE function that must not run in a parallel query
-- (one using temporary tables or a subtransaction) is named here with why.
CREATE TEMP TABLE not_parallel_safe (signature text PRIMARY KEY, reason text NOT NULL) ON COMMIT DROP;

-- Calls of the extension's functions by name: billguard.<name>( in a body,
-- outside its string literals (a message may name a function to call).
CREATE TEMP TABLE extension_calls ON COMMIT DROP AS
SELECT DISTINCT f.signature AS caller, f.provolatile AS caller_volatile,
       f.proparallel AS caller_parallel, c.signature AS callee, c.provolatile AS callee_volatile,
       c.proparallel AS callee_parallel
  FROM extension_functions f
 CROSS JOIN LATERAL regexp_matches(regexp_replace(f.body, '''([^'']|'''')*''', '', 'g'),
                                  'billguard\.([a-z_0-9]+)\s*\(', 'g') AS m(name)
  JOIN extension_functions c ON c.signature LIKE 'billguard.' || m.name[1] || '(%'
 WHERE f.body IS NOT NULL AND c.oid <> f.oid;

SELECT cmp_ok((SELECT count(*) FROM extension_functions), '>=', 80::bigint,
              'the extension''s functions are found through pg_depend');

SELECT is(array_agg(signature ORDER BY signature), NULL,
          'no function of the extension is IMMUTABLE and PARALLEL UNSAFE (PostgreSQL''s opr_sanity rule)')
  FROM extension_functions WHERE provolatile = 'i' AND proparallel = 'u';

SELECT is(array_agg(f.signature ORDER BY f.signature), NULL,
          'every IMMUTABLE or STABLE function is PARALLEL SAFE, but those named with a reason')
  FROM extension_functions f
 WHERE f.provolatile IN ('i', 's') AND f.proparallel <> 's'
   AND f.signature NOT IN (SELECT signature FROM not_parallel_safe);

SELECT is(array_agg(f.signature ORDER BY f.signature), NULL,
          'no PARALLEL SAFE function establishes a subtransaction (an EXCEPTION block)')
  FROM extension_functions f
 WHERE f.proparallel = 's' AND f.body ~* '\mEXCEPTION\s+WHEN\M';

SELECT is(array_agg(f.signature ORDER BY f.signature), NULL,
          'no PARALLEL SAFE function writes, locks or sets anything')
  FROM extension_functions f
 WHERE f.proparallel = 's'
   AND f.body ~* '\m(INSERT\s+INTO|UPDATE\s+billguard|DELETE\s+FROM|TRUNCATE|FOR\s+UPDATE|FOR\s+SHARE|set_config|pg_advisory|pg_try_advisory|nextval|setval)\M';

SELECT is(array_agg(c.caller || ' -> ' || c.callee ORDER BY c.caller, c.callee), NULL,
          'a PARALLEL SAFE function calls only PARALLEL SAFE functions of the extension')
  FROM extension_calls c WHERE c.caller_parallel = 's' AND c.callee_parallel <> 's';

SELECT is(array_agg(c.caller || ' -> ' || c.callee ORDER BY c.caller, c.callee), NULL,
          'an IMMUTABLE function calls only IMMUTABLE functions of the extension, a STABLE one no VOLATILE one')
  FROM extension_calls c
 WHERE (c.caller_volatile = 'i' AND c.callee_volatile <> 'i')
    OR (c.caller_volatile = 's' AND c.callee_volatile = 'v');

-- Rows of `query` as a parallel plan computes them, or NULL (with a
-- warning) when it was not planned in parallel: force_parallel_mode puts a
-- Gather on top of every plan the planner may run in parallel, so a plan
-- without one means some function of the query is not PARALLEL SAFE.
-- PostgreSQL 16 renamed it debug_parallel_query.
CREATE FUNCTION pg_temp.parallel_rows(query text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
  plan jsonb;
  force_parallel text := CASE WHEN current_setting('server_version_num')::int >= 160000
                              THEN 'debug_parallel_query' ELSE 'force_parallel_mode' END;
BEGIN
  PERFORM set_config(force_parallel, 'on', true);
  PERFORM set_config('parallel_leader_participation', 'off', true);
  EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF, FORMAT JSON) ' || query INTO plan;
  PERFORM set_config(force_parallel, 'off', true);
  PERFORM set_config('parallel_leader_participation', 'on', true);
  IF plan -> 0 -> 'Plan' ->> 'Node Type' IS DISTINCT FROM 'Gather' THEN
    RAISE WARNING 'not planned in parallel: %', query;
    RETURN NULL;
  END IF;
  -- 18 shows Actual Rows with two decimals (1.00).
  RETURN (plan -> 0 -> 'Plan' ->> 'Actual Rows')::numeric::bigint;
END $$;

SELECT is(pg_temp.parallel_rows($q$
            SELECT 1 WHERE billguard.stripe_event_json(
              '{"id": "evt_t29", "type": "payment_intent.succeeded", "created": 1700000000,
                "data": {"object": {"object": "payment_intent", "id": "pi_t29", "amount": 1000,
                                    "currency": "usd", "metadata": {}}}}') ->> 'id' = 'evt_t29'
              AND billguard.error_text('{"http_status": 402, "type": "card_error", "message": "no"}')
                  = '402 card_error: no'$q$),
          1::bigint, 'stripe_event_json and error_text run in a parallel worker');

INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t29_mine', 'cus_t29', 1000);
SELECT is(pg_temp.parallel_rows($q$
            SELECT 1 FROM billguard.accounts a
             WHERE a.customer_id = 't29_mine' AND billguard.written_by_this_transaction(a.xmin)$q$),
          1::bigint, 'a worker sees a row this transaction wrote as written by it');

SELECT is(pg_temp.parallel_rows($q$
            SELECT 1 FROM billguard.scheduler_settings() s, billguard.current_schedule() c
             WHERE s.auto_bill = current_setting('billguard.auto_bill')
               AND s.bill_day = current_setting('billguard.bill_day')::integer
               AND c.due_period IS NOT NULL$q$),
          1::bigint, 'a worker reads the scheduler''s settings as the leader does');

SELECT results_eq($$SELECT status FROM billguard.bill_customer('t29_mine', '2039-01')$$, ARRAY['initiated'],
                  'a billing of this transaction');
SELECT is(pg_temp.parallel_rows($q$
            SELECT 1 FROM billguard.period_status('2039-01') p
             WHERE p.status = 'pending' AND p.count = 1
               AND billguard.entity_state('billing-t29_mine-2039-01') ->> 'status' = 'in_progress'$q$),
          1::bigint, 'a worker folds the journal and counts the records this transaction wrote');

SELECT * FROM finish();
ROLLBACK;
