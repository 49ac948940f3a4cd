-- Which database bills the history it holds (extension/billing_database.hpp).
--
-- A copy made with CREATE DATABASE ... TEMPLATE and a dump restored into a
-- new database hold billing history that another database bills; a
-- promoted standby and a pg_upgrade'd cluster are that database itself.
-- billguard.installation, written by CREATE EXTENSION and never dumped,
-- names the database (by OID, which a copy changes and pg_upgrade keeps)
-- that installed billguard here; billguard.billing_installations, which
-- pg_dump carries with the history, names every installation that billed
-- it. A database whose history is another's sends nothing and bills no
-- period until an operator adopts it with billguard.adopt_database().

\ir ../udfs/created_by_restore/latest.sql

CREATE TABLE billguard.installation (
  singleton              boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  installation_id        text NOT NULL UNIQUE,
  database_oid           oid NOT NULL,
  database_name          name NOT NULL,
  system_identifier      bigint NOT NULL,
  installed_at           timestamptz NOT NULL DEFAULT now(),
  -- CREATE EXTENSION ran in a restore: the history arrives after it.
  created_by_restore     boolean NOT NULL DEFAULT false,
  creator_pid            integer,
  creator_started_at     timestamptz,
  adopted_at             timestamptz,
  adopted_by             name,
  -- The installations that had billed the history when it was adopted.
  adopted_installations  text[]
);
COMMENT ON TABLE billguard.installation IS
  'This database''s installation of billguard; never dumped: a copy or a restore is told apart by it.';

CREATE TABLE billguard.billing_installations (
  installation_id    text PRIMARY KEY,
  database_name      name NOT NULL,
  database_oid       oid NOT NULL,
  system_identifier  bigint NOT NULL,
  began_at           timestamptz NOT NULL DEFAULT now(),
  how                text NOT NULL CHECK (how IN ('installed', 'adopted'))
);
COMMENT ON TABLE billguard.billing_installations IS
  'Every installation of billguard that billed this history: dumped with it.';
SELECT pg_catalog.pg_extension_config_dump('billguard.billing_installations', '');

WITH me AS (
  SELECT gen_random_uuid()::text AS id, d.oid, d.datname,
         (SELECT c.system_identifier FROM pg_control_system() c) AS system_identifier
    FROM pg_database d WHERE d.datname = current_database()
), installed AS (
  INSERT INTO billguard.installation (installation_id, database_oid, database_name,
                                      system_identifier, created_by_restore, creator_pid,
                                      creator_started_at)
  SELECT me.id, me.oid, me.datname, me.system_identifier, billguard.created_by_restore(),
         pg_backend_pid(), (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid())
    FROM me
)
INSERT INTO billguard.billing_installations (installation_id, database_name, database_oid,
                                             system_identifier, how)
SELECT me.id, me.datname, me.oid, me.system_identifier, 'installed' FROM me;

\ir ../udfs/billing_database_problem/latest.sql
\ir ../udfs/adopt_database/latest.sql
