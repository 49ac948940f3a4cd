-- The billing history outlives billguard: dropping the extension would drop
-- billing_records and the journal with it, and a billguard installed again
-- would claim, and charge, periods already billed.

\ir ../udfs/protect_history/latest.sql

CREATE EVENT TRIGGER billguard_protect_history ON ddl_command_start
  WHEN TAG IN ('DROP ACCESS METHOD', 'DROP AGGREGATE', 'DROP CAST', 'DROP COLLATION',
               'DROP CONVERSION', 'DROP DOMAIN', 'DROP EXTENSION', 'DROP FOREIGN DATA WRAPPER',
               'DROP FOREIGN TABLE', 'DROP FUNCTION', 'DROP INDEX', 'DROP LANGUAGE',
               'DROP MATERIALIZED VIEW', 'DROP OPERATOR', 'DROP OPERATOR CLASS',
               'DROP OPERATOR FAMILY', 'DROP OWNED', 'DROP POLICY', 'DROP PROCEDURE',
               'DROP PUBLICATION', 'DROP ROUTINE', 'DROP RULE', 'DROP SCHEMA', 'DROP SEQUENCE',
               'DROP SERVER', 'DROP STATISTICS', 'DROP SUBSCRIPTION', 'DROP TABLE',
               'DROP TEXT SEARCH CONFIGURATION', 'DROP TEXT SEARCH DICTIONARY',
               'DROP TEXT SEARCH PARSER', 'DROP TEXT SEARCH TEMPLATE', 'DROP TRANSFORM',
               'DROP TRIGGER', 'DROP TYPE', 'DROP USER MAPPING', 'DROP VIEW')
  EXECUTE FUNCTION billguard.protect_history();
ALTER EVENT TRIGGER billguard_protect_history ENABLE ALWAYS;

-- The triggers that keep the history as it was fire whoever writes: also
-- with session_replication_role = replica, which a superuser may set and
-- logical replication's apply worker runs with.
ALTER TABLE billguard.journal ENABLE ALWAYS TRIGGER journal_append_only;
ALTER TABLE billguard.billing_records ENABLE ALWAYS TRIGGER billing_records_keep_rows;
ALTER TABLE billguard.billing_records ENABLE ALWAYS TRIGGER billing_records_frozen_identity;
ALTER TABLE billguard.vault_audit ENABLE ALWAYS TRIGGER vault_audit_append_only;

\ir ../udfs/archive_history/latest.sql
