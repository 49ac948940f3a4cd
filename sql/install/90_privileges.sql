-- pg_dump must carry the data tables: losing billing_records in a dump and
-- restore would let every (customer, period) be claimed again. Of the
-- currencies, only the rows CREATE EXTENSION does not make: a restore runs
-- CREATE EXTENSION first.
SELECT pg_catalog.pg_extension_config_dump('billguard.currencies', 'WHERE NOT builtin');
SELECT pg_catalog.pg_extension_config_dump('billguard.accounts', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.period_amounts', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.billing_records', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.journal', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.snapshots', '');

-- Nothing is granted to PUBLIC. Application roles get EXECUTE on the
-- functions they call (see docs/privileges.md); the SECURITY DEFINER
-- functions do the table access.
REVOKE ALL ON ALL TABLES IN SCHEMA billguard FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA billguard FROM PUBLIC;
REVOKE ALL ON SCHEMA billguard FROM PUBLIC;
