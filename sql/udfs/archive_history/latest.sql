-- Retiring billguard and keeping its history: every table that holds users'
-- data (the tables pg_dump carries) leaves the extension for archive_schema,
-- read-only, and DROP EXTENSION billguard is then allowed. Refused while a
-- record may still be sent (pending, dispatching, unknown): let those settle,
-- or cancel the never-sent ones, first. Only the extension's owner can run it.
-- The archive goes only into a schema it creates (owned by the extension's
-- owner) or one that owner owns already: whoever owns a schema may drop
-- every table in it, so a schema another role created beforehand would hand
-- that role the billing history.
CREATE OR REPLACE FUNCTION billguard.archive_history(archive_schema text)
  RETURNS TABLE (archived_table text, row_count bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  extension oid := (SELECT e.oid FROM pg_extension e WHERE e.extname = 'billguard');
  history regclass[] := (SELECT e.extconfig FROM pg_extension e WHERE e.oid = extension);
  extension_owner oid := (SELECT e.extowner FROM pg_extension e WHERE e.oid = extension);
  schema_owner oid := (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = archive_schema);
  unsettled bigint;
  dependent record;
  history_table regclass;
BEGIN
  IF archive_schema IS NULL OR archive_schema IN ('', 'billguard') THEN
    RAISE EXCEPTION 'archive_schema must name a schema other than billguard'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF schema_owner <> extension_owner THEN
    RAISE EXCEPTION 'schema % is owned by %, not by %, the owner of billguard: its owner could drop the archived history',
                    quote_ident(archive_schema), schema_owner::regrole, extension_owner::regrole
      USING ERRCODE = 'insufficient_privilege',
            HINT = format('Name a schema that does not exist: archive_history creates it, owned by %s.',
                          extension_owner::regrole);
  END IF;
  -- Nothing claims or records while the tables move.
  EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', array_to_string(history, ', '));
  SELECT count(*) INTO unsettled FROM billguard.billing_records r
   WHERE r.status IN ('pending', 'dispatching', 'unknown');
  IF unsettled > 0 THEN
    RAISE EXCEPTION '% billing records may still be sent to Stripe (pending, dispatching or unknown)',
                    unsettled
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Let the dispatcher settle them, or cancel the never-sent ones with '
                   'billguard.cancel_record(), then archive.';
  END IF;

  IF schema_owner IS NULL THEN
    -- Not IF NOT EXISTS: a schema created since the check above is refused.
    EXECUTE format('CREATE SCHEMA %I AUTHORIZATION %I', archive_schema,
                   pg_get_userbyid(extension_owner));
  END IF;
  EXECUTE format($f$
    CREATE FUNCTION %I.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
      RAISE EXCEPTION '%%.%% is archived billing history: %% refused', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
    END $body$ $f$, archive_schema);

  -- Triggers and CHECK constraints that call the extension's functions would
  -- keep DROP EXTENSION from dropping those; the archive is read-only instead.
  FOR dependent IN
    SELECT DISTINCT coalesce(t.tgrelid, c.conrelid)::regclass AS history_table,
                    coalesce(t.tgname, c.conname) AS name, t.oid IS NOT NULL AS is_trigger
      FROM pg_depend d
      JOIN pg_depend member ON member.classid = 'pg_proc'::regclass AND member.objid = d.refobjid
                           AND member.refclassid = 'pg_extension'::regclass
                           AND member.refobjid = extension AND member.deptype = 'e'
      LEFT JOIN pg_trigger t ON d.classid = 'pg_trigger'::regclass AND t.oid = d.objid
      LEFT JOIN pg_constraint c ON d.classid = 'pg_constraint'::regclass AND c.oid = d.objid
     WHERE d.refclassid = 'pg_proc'::regclass AND coalesce(t.tgrelid, c.conrelid) = ANY (history)
  LOOP
    EXECUTE CASE WHEN dependent.is_trigger
                 THEN format('DROP TRIGGER %I ON %s', dependent.name, dependent.history_table)
                 ELSE format('ALTER TABLE %s DROP CONSTRAINT %I', dependent.history_table, dependent.name)
            END;
  END LOOP;

  FOREACH history_table IN ARRAY history LOOP
    EXECUTE format('ALTER EXTENSION billguard DROP TABLE %s', history_table);
    EXECUTE format('ALTER TABLE %s SET SCHEMA %I', history_table, archive_schema);
    EXECUTE format('CREATE TRIGGER archived_read_only BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                   'ON %s FOR EACH STATEMENT EXECUTE FUNCTION %I.refuse_change()',
                   history_table, archive_schema);
    archived_table := history_table::text;
    EXECUTE format('SELECT count(*) FROM %s', history_table) INTO row_count;
    RETURN NEXT;
  END LOOP;
END $$;
COMMENT ON FUNCTION billguard.archive_history(text) IS
  'Moves the billing history out of the extension into archive_schema, read-only; DROP EXTENSION billguard is then allowed.';
