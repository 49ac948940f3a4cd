-- 12_search_path.sql: every function of the extension pins its search_path,
-- but for the pure C functions called once per row, which run no SQL and
-- look no name up (see sql/install/10_c_functions.sql); they are named here,
-- so a new function without the setting fails.
--
-- The dispatcher runs as a superuser. A function that resolved a name
-- through the caller's search_path would let a role that can CREATE in a
-- schema on that path (public, in PostgreSQL 15 the database owner) plant a
-- better-matching function or operator, e.g. public.jsonb_build_object(text,
-- integer, ...), and have it run as the superuser. test/t/100_search_path_attack.pl
-- replays that attack against the running dispatcher.
BEGIN;
SELECT plan(3);

SELECT cmp_ok((SELECT count(*) FROM pg_depend d
                WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard')
                  AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'), '>=', 35::bigint,
              'the extension''s functions are found through pg_depend');

CREATE TEMP TABLE pure_c_functions (signature text PRIMARY KEY) ON COMMIT DROP;
INSERT INTO pure_c_functions VALUES
  ('billguard.key_namespace()'),
  ('billguard.idempotency_key(text,text,text)'),
  ('billguard.is_billing_period(text)'),
  ('billguard.billing_initiated_event(text,text,text,bigint,text,timestamp with time zone,text)'),
  ('billguard.is_valid_customer_id(text)'),
  ('billguard.charge_request_body(text,text,text,text,bigint,text,text,text,text,jsonb,bigint)');

SELECT is(array_agg(p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text), NULL,
          'no function of the extension lacks SET search_path = pg_catalog, pg_temp, but the pure C ones')
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard')
   AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false)
   AND p.oid::regprocedure::text NOT IN (SELECT signature FROM pure_c_functions);

SELECT is(array_agg(f.signature ORDER BY f.signature), NULL,
          'the functions let off are C functions of the extension without a setting of their own')
  FROM pure_c_functions f
  LEFT JOIN pg_proc p ON p.oid::regprocedure::text = f.signature
 WHERE p.oid IS NULL OR p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c')
    OR p.proconfig IS NOT NULL;

SELECT * FROM finish();
ROLLBACK;
