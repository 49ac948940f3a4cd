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

-- The CREATE EXTENSION billguard running now restores a dump (the
-- ProcessUtility hook saw the session's settings; false without preloading).
CREATE FUNCTION billguard.created_by_restore() RETURNS boolean
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_created_by_restore';

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

-- Why this database does not bill its history, or NULL when it does.
CREATE FUNCTION billguard.billing_database_problem() RETURNS text
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  me     billguard.installation;
  others text;
  why    text;
BEGIN
  SELECT * INTO me FROM billguard.installation;
  IF NOT FOUND THEN
    why := 'billguard.installation, which names the database that installed billguard here, is empty';
  ELSIF me.database_oid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()) THEN
    why := format('this database is a copy of database %s (CREATE DATABASE ... TEMPLATE, or a copy '
                  'of its files), which bills this history', quote_ident(me.database_name));
  ELSIF me.created_by_restore AND me.adopted_at IS NULL THEN
    why := 'this database was restored from a dump (its CREATE EXTENSION billguard ran in a '
           'restore), and the database it was dumped from bills this history';
  ELSE
    SELECT string_agg(DISTINCT quote_ident(b.database_name), ', ') INTO others
      FROM billguard.billing_installations b
     WHERE b.installation_id <> me.installation_id
       AND b.installation_id <> ALL (coalesce(me.adopted_installations, '{}'));
    IF others IS NOT NULL THEN
      why := format('this database''s billing history came from database %s (a dump restored '
                    'here), which bills it', others);
    END IF;
  END IF;
  IF why IS NULL THEN
    RETURN NULL;
  END IF;
  RETURN why || ': it sends nothing and bills no period until an operator adopts it as the '
             || 'billing database (SELECT billguard.adopt_database())';
END $$;

-- Makes this database the billing database of its history, once a person
-- has made sure the one it came from no longer bills it. Refused while a
-- restore into it still runs.
CREATE FUNCTION billguard.adopt_database() RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  problem   text := billguard.billing_database_problem();
  here      oid := (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
  history   regclass[] := (SELECT e.extconfig FROM pg_extension e WHERE e.extname = 'billguard');
  me        billguard.installation;
  restoring text;
  new_id    text := gen_random_uuid()::text;
  sysid     bigint := (SELECT c.system_identifier FROM pg_control_system() c);
BEGIN
  IF problem IS NULL THEN
    RETURN 'this database bills its history already: nothing to adopt';
  END IF;
  SELECT * INTO me FROM billguard.installation FOR UPDATE;
  SELECT format('pid %s, %s', a.pid, coalesce(nullif(a.application_name, ''), 'no application_name'))
    INTO restoring
    FROM pg_stat_activity a
   WHERE a.datid = here AND a.pid <> pg_backend_pid()
     AND (a.application_name = 'pg_restore'
          OR (me.created_by_restore AND a.pid = me.creator_pid
              AND a.backend_start = me.creator_started_at))
   LIMIT 1;
  IF restoring IS NOT NULL THEN
    RAISE EXCEPTION 'the restore into this database still runs (%)', restoring
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Adopt the database once the restore has finished.';
  END IF;
  BEGIN
    EXECUTE format('LOCK TABLE %s IN SHARE MODE NOWAIT', array_to_string(history, ', '));
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'a session is writing billguard''s tables (a restore that still runs?)'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Adopt the database once the restore has finished.';
  END;

  DELETE FROM billguard.installation;
  INSERT INTO billguard.installation (installation_id, database_oid, database_name,
                                      system_identifier, installed_at, created_by_restore,
                                      adopted_at, adopted_by, adopted_installations)
  VALUES (new_id, here, current_database(), sysid, coalesce(me.installed_at, now()),
          coalesce(me.created_by_restore, false), now(), session_user,
          (SELECT array_agg(b.installation_id ORDER BY b.began_at, b.installation_id)
             FROM billguard.billing_installations b));
  INSERT INTO billguard.billing_installations (installation_id, database_name, database_oid,
                                               system_identifier, how)
  VALUES (new_id, current_database(), here, sysid, 'adopted');
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'DatabaseAdopted',
                                 jsonb_build_object('database', current_database(),
                                                    'installation_id', new_id,
                                                    'adopted_by', session_user,
                                                    'was', problem));
  PERFORM billguard.wake_dispatcher();
  RETURN 'adopted: this database bills its history from now on';
END $$;
COMMENT ON FUNCTION billguard.adopt_database() IS
  'Makes a copy or a restored database the one that bills its history; refused while a restore into it runs.';
