-- 30_archive_schema.sql: archive_history() puts the billing history only
-- where nobody but the extension's owner can drop it.
--
-- Proves: a schema a non-superuser created beforehand is refused (42501,
-- naming its owner) and nothing moves, so that role can drop nothing of the
-- history; a schema that does not exist is created owned by the extension's
-- owner, the history goes there, and the other role can drop none of it;
-- a schema the extension's owner owns already is accepted.
BEGIN;
SELECT plan(9);

CREATE ROLE t30_crm NOLOGIN;
DO $$BEGIN EXECUTE format('GRANT CREATE ON DATABASE %I TO t30_crm', current_database()); END$$;
SET LOCAL ROLE t30_crm;
CREATE SCHEMA t30_prepared;
RESET ROLE;

SELECT throws_ok($$SELECT * FROM billguard.archive_history('t30_prepared')$$, '42501',
                 'schema t30_prepared is owned by t30_crm, not by '
                 || (SELECT extowner::regrole::text FROM pg_extension WHERE extname = 'billguard')
                 || ', the owner of billguard: its owner could drop the archived history',
                 'a schema another role created beforehand is refused');
SELECT is((SELECT count(*) FROM pg_class WHERE relnamespace = 't30_prepared'::regnamespace), 0::bigint,
          'nothing moved into it');
SELECT is((SELECT 'billguard.billing_records'::regclass = ANY (extconfig) FROM pg_extension WHERE extname = 'billguard'),
          true, 'the history is still the extension''s');
SET LOCAL ROLE t30_crm;
SELECT throws_ok($$DROP TABLE billguard.billing_records$$, '42501', NULL,
                 'the role that made the schema cannot drop the billing records');
RESET ROLE;

SAVEPOINT fresh;
SELECT is((SELECT count(*) FROM billguard.archive_history('t30_fresh') WHERE archived_table = 't30_fresh.billing_records'),
          1::bigint, 'a schema that does not exist is created and the history moves there');
SELECT is((SELECT nspowner FROM pg_namespace WHERE nspname = 't30_fresh'),
          (SELECT extowner FROM pg_extension WHERE extname = 'billguard'),
          'it is owned by the extension''s owner');
SET LOCAL ROLE t30_crm;
SELECT throws_ok($$DROP TABLE t30_fresh.billing_records, t30_fresh.journal, t30_fresh.accounts$$, '42501', NULL,
                 'the other role can drop none of the archived history');
RESET ROLE;
ROLLBACK TO SAVEPOINT fresh;

CREATE SCHEMA t30_owned;
SELECT is((SELECT nspowner FROM pg_namespace WHERE nspname = 't30_owned'),
          (SELECT extowner FROM pg_extension WHERE extname = 'billguard'),
          'a schema the extension''s owner made');
SELECT is((SELECT count(*) FROM billguard.archive_history('t30_owned') WHERE archived_table = 't30_owned.journal'),
          1::bigint, 'is accepted as the archive');

SELECT * FROM finish();
ROLLBACK;
