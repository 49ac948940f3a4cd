-- 16_history.sql: the billing history survives pg_dump and cannot be
-- dropped with the extension (the whole dump,
-- restore, archive and drop in test/t/091_dump_restore.pl and
-- test/t/092_drop_guard.pl).
--
-- Proves: every table of the extension is registered for pg_dump but
-- vault_credentials (the dispatcher's vault keys: secrets never dumped, a
-- restored database obtains its keys again), currencies
-- with 'WHERE NOT builtin' and the others whole; the ISO rows made by CREATE
-- EXTENSION are builtin and not dumped, a currency a user adds is, a user's
-- change to a built-in currency makes it the user's, and a dumped row for a
-- built-in code inserted as pg_restore does (after CREATE EXTENSION)
-- replaces the built-in values instead of failing; while billing records
-- exist, DROP EXTENSION billguard (also with CASCADE, or in a list), DROP
-- SCHEMA billguard CASCADE and DROP OWNED BY the extension's owner are
-- refused with 2BP01 saying how to archive, and drop nothing;
-- archive_history refuses while a record may still be sent (55000).
BEGIN;
SELECT plan(31);

-- What pg_dump carries: a restore must bring back the whole history.
SELECT is((SELECT array_agg(c.relname::text ORDER BY c.relname) FROM pg_class c
            JOIN pg_depend d ON d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.deptype = 'e'
           WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard') AND c.relkind = 'r'
             AND NOT c.oid = ANY ((SELECT extconfig FROM pg_extension WHERE extname = 'billguard')::oid[])),
          ARRAY['installation', 'vault_credentials'],
          'every table of the extension is registered with pg_extension_config_dump, but the vault keys and this database''s installation');
SELECT is((SELECT 'billguard.vault_credentials'::regclass = ANY (extconfig) FROM pg_extension WHERE extname = 'billguard'),
          false, 'the dispatcher''s vault keys are never dumped');
SELECT is((SELECT u.condition FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS u (config, condition)
            WHERE e.extname = 'billguard' AND u.config = 'billguard.currencies'::regclass),
          'WHERE NOT builtin', 'currencies: only rows that are not built-in are dumped');
SELECT is((SELECT count(*) FROM billguard.currencies WHERE builtin), 158::bigint,
          'the 158 ISO 4217 rows of CREATE EXTENSION are built-in');
INSERT INTO billguard.currencies (code, minor_units) VALUES ('xts', 2);
SELECT is((SELECT builtin FROM billguard.currencies WHERE code = 'xts'), false, 'a currency a user adds is not built-in');
INSERT INTO billguard.currencies (code, minor_units, builtin) VALUES ('xxx', 0, true);
SELECT is((SELECT builtin FROM billguard.currencies WHERE code = 'xxx'), false,
          'nor one a user inserts as built-in (it would not be dumped)');
UPDATE billguard.currencies SET minor_units = 2 WHERE code = 'isk';
SELECT is((SELECT builtin FROM billguard.currencies WHERE code = 'isk'), false,
          'a built-in currency a user changes becomes the user''s, so it is dumped');
UPDATE billguard.currencies SET builtin = true WHERE code = 'xts';
SELECT is((SELECT builtin FROM billguard.currencies WHERE code = 'xts'), false, 'a user''s row never becomes built-in');
UPDATE billguard.currencies SET minor_units = 2 WHERE code = 'chf';
SELECT is((SELECT builtin FROM billguard.currencies WHERE code = 'chf'), true,
          'an UPDATE that changes nothing leaves a built-in row built-in');
-- pg_restore: CREATE EXTENSION made the built-in 'jpy', then the dump's row arrives.
SELECT lives_ok($$INSERT INTO billguard.currencies (code, minor_units, builtin) VALUES ('jpy', 2, false)$$,
                'a dumped row for a built-in code is restored without a duplicate key error');
SELECT results_eq($$SELECT minor_units, builtin FROM billguard.currencies WHERE code = 'jpy'$$,
                  $$VALUES (2::smallint, false)$$, 'it replaced the built-in values and is the user''s now');
SELECT throws_ok($$INSERT INTO billguard.currencies (code, minor_units) VALUES ('xts', 3)$$, '23505', NULL,
                 'a user''s own code inserted twice is still a duplicate');

-- DROP would take the history with it: refused while records exist.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t16_kept', 'cus_t16kept', 1000);
SELECT results_eq($$SELECT status FROM billguard.bill_customer('t16_kept', '2037-01')$$, ARRAY['initiated'],
                  'one billing record exists');
SELECT throws_ok($$DROP EXTENSION billguard$$, '2BP01',
                 format('DROP EXTENSION would drop billguard''s billing history (%s billing records)',
                        (SELECT count(*) FROM billguard.billing_records)),
                 'DROP EXTENSION billguard is refused while billing records exist');
SELECT throws_ok($$DROP EXTENSION billguard CASCADE$$, '2BP01', NULL, 'DROP EXTENSION billguard CASCADE is refused');
SELECT throws_ok($$DROP EXTENSION IF EXISTS t16_no_such_extension, billguard$$, '2BP01', NULL,
                 'DROP EXTENSION naming billguard in a list is refused');
SELECT throws_ok($$DROP SCHEMA billguard CASCADE$$, '2BP01',
                 format('DROP SCHEMA would drop billguard''s billing history (%s billing records)',
                        (SELECT count(*) FROM billguard.billing_records)),
                 'DROP SCHEMA billguard CASCADE is refused');
SELECT throws_ok(format('DROP OWNED BY %I CASCADE', (SELECT pg_get_userbyid(extowner) FROM pg_extension WHERE extname = 'billguard')),
                 '2BP01', NULL, 'DROP OWNED BY the extension''s owner is refused');
CREATE FUNCTION pg_temp.t16_hint(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE hint text;
BEGIN
  EXECUTE sql;
  RETURN NULL;
EXCEPTION WHEN dependent_objects_still_exist THEN
  GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
  RETURN hint;
END $$;
SELECT is(pg_temp.t16_hint('DROP EXTENSION billguard'),
          'Archive the history first: SELECT * FROM billguard.archive_history(''billguard_archive''); then run DROP EXTENSION again.',
          'the refusal says how to archive first');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't16_kept'), 1::bigint,
          'the refused drops dropped nothing');
SELECT lives_ok($$CREATE SCHEMA t16_other; DROP SCHEMA t16_other CASCADE$$,
                'other schemas drop as before');
SELECT throws_ok($$SELECT * FROM billguard.archive_history('t16_archive')$$, '55000', NULL,
                 'archive_history refuses while a record may still be sent');

-- What a statement drops, cascades included, not what it names.
SELECT throws_ok($$DROP EXTENSION plpgsql CASCADE$$, '2BP01',
                 format('DROP EXTENSION would drop billguard''s billing history (%s billing records)',
                        (SELECT count(*) FROM billguard.billing_records)),
                 'DROP EXTENSION plpgsql CASCADE, which would drop billguard with it, is refused');
SELECT is((SELECT count(*) FROM pg_extension WHERE extname IN ('billguard', 'plpgsql')), 2::bigint,
          'billguard and plpgsql are both still there');

-- The guards hold in replica mode (a superuser's session_replication_role,
-- logical replication's apply worker).
SET LOCAL session_replication_role = replica;
SELECT throws_ok($$DROP EXTENSION billguard$$, '2BP01', NULL, 'replica mode: DROP EXTENSION billguard is refused');
SELECT throws_ok($$UPDATE billguard.journal SET event = '{}' WHERE persistence_id = 'billing-t16_kept-2037-01'$$,
                 '42501', 'billguard.journal is append-only: UPDATE refused', 'replica mode: a journal rewrite is refused');
SELECT throws_ok($$DELETE FROM billguard.journal$$, '42501', NULL, 'replica mode: a journal DELETE is refused');
SELECT throws_ok($$UPDATE billguard.billing_records SET amount_cents = 1 WHERE customer_id = 't16_kept'$$,
                 '23000', NULL, 'replica mode: a billing record''s frozen identity is kept');
SELECT throws_ok($$TRUNCATE billguard.billing_records$$, '23000', NULL,
                 'replica mode: TRUNCATE billing_records is refused');
SELECT throws_ok($$DELETE FROM billguard.vault_audit$$, '42501', NULL, 'replica mode: the vault audit stays append-only');
RESET session_replication_role;
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't16_kept' AND amount_cents = 1000),
          1::bigint, 'the record is as it was');

SELECT * FROM finish();
ROLLBACK;
