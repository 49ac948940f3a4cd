-- Makes this database the billing database of its history, once a person
-- has made sure the one it came from no longer bills it. Refused while a
-- restore into it still runs.
CREATE OR REPLACE FUNCTION billguard.adopt_database() RETURNS text
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
