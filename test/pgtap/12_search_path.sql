-- 12_search_path.sql: every function of the extension pins its search_path.
--
-- The dispatcher runs as a superuser. A function that resolved a name
-- through the caller's search_path would let a role that can CREATE in a
-- schema on that path (public, in PostgreSQL 15 the database owner) plant a
-- better-matching function or operator, e.g. public.jsonb_build_object(text,
-- integer, ...), and have it run as the superuser. test/t/100_search_path_attack.pl
-- replays that attack against the running dispatcher.
BEGIN;
SELECT plan(2);

SELECT cmp_ok((SELECT count(*) FROM pg_depend d
                WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard')
                  AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'), '>=', 35::bigint,
              'the extension''s functions are found through pg_depend');

SELECT is(array_agg(p.oid::regprocedure::text ORDER BY p.oid::regprocedure::text), NULL,
          'no function of the extension lacks SET search_path = pg_catalog, pg_temp')
  FROM pg_proc p
  JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard')
   AND NOT coalesce(p.proconfig @> ARRAY['search_path=pg_catalog, pg_temp'], false);

SELECT * FROM finish();
ROLLBACK;
