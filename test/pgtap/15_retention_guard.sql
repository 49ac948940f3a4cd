-- 15_retention_guard.sql: only billguard.apply_retention deletes journal
-- events, so no other statement can shorten the billing history.
--
-- Proves: a role granted DELETE (and SELECT) on billguard.journal deletes
-- nothing, with 42501, by every trick tried: the old transaction-local
-- billguard_internal.retention setting, the same setting for the session,
-- a data-modifying CTE, MERGE ... DELETE, a SECURITY DEFINER function of its
-- own, session_replication_role = replica, disabling the trigger, becoming
-- the journal's owner; the journal's owner's own plain DELETE is refused
-- too; apply_retention, granted to that role, still prunes (keeping each
-- entity's newest event).
BEGIN;
SELECT plan(15);

SELECT billguard.append_event('t15-entity', g - 1, 'Changed', jsonb_build_object('n', g))
  FROM generate_series(1, 4) g;
CREATE FUNCTION pg_temp.t15_events() RETURNS bigint LANGUAGE sql AS
  $$ SELECT count(*) FROM billguard.journal WHERE persistence_id = 't15-entity' $$;

CREATE ROLE t15_janitor NOLOGIN;
GRANT USAGE, CREATE ON SCHEMA billguard TO t15_janitor;
GRANT SELECT, DELETE ON billguard.journal TO t15_janitor;
GRANT CREATE ON SCHEMA public TO t15_janitor;
-- As a session of that role, so that SET ROLE is checked against it.
SET SESSION AUTHORIZATION t15_janitor;

SET LOCAL billguard_internal.retention = 'on';
SELECT throws_ok($$DELETE FROM billguard.journal WHERE persistence_id = 't15-entity'$$, '42501',
                 'billguard.journal is append-only: DELETE refused',
                 'SET LOCAL billguard_internal.retention = on, then DELETE: refused');
SELECT set_config('billguard_internal.retention', 'on', false);
SELECT throws_ok($$DELETE FROM billguard.journal WHERE persistence_id = 't15-entity'$$, '42501',
                 'billguard.journal is append-only: DELETE refused',
                 'the setting for the whole session, then DELETE: refused');
SELECT throws_ok($$WITH gone AS (DELETE FROM billguard.journal WHERE persistence_id = 't15-entity' RETURNING 1)
                   SELECT count(*) FROM gone$$, '42501',
                 'billguard.journal is append-only: DELETE refused',
                 'a DELETE in a data-modifying CTE: refused');
SELECT throws_ok($$MERGE INTO billguard.journal j USING (SELECT 't15-entity' AS id) s ON j.persistence_id = s.id
                   WHEN MATCHED THEN DELETE$$, '42501',
                 'billguard.journal is append-only: DELETE refused',
                 'MERGE ... WHEN MATCHED THEN DELETE: refused');
CREATE FUNCTION public.t15_prune() RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE n bigint;
BEGIN
  PERFORM set_config('billguard_internal.retention', 'on', true);
  DELETE FROM billguard.journal WHERE persistence_id = 't15-entity';
  GET DIAGNOSTICS n = ROW_COUNT;
  RETURN n;
END $$;
SELECT throws_ok($$SELECT public.t15_prune()$$, '42501', 'billguard.journal is append-only: DELETE refused',
                 'its own SECURITY DEFINER function with the setting: refused');
SELECT throws_ok($$SET session_replication_role = replica$$, '42501',
                 'permission denied to set parameter "session_replication_role"',
                 'turning triggers off with session_replication_role: refused');
SELECT throws_ok($$ALTER TABLE billguard.journal DISABLE TRIGGER journal_append_only$$, '42501',
                 'must be owner of table journal', 'disabling the append-only trigger: refused');
SELECT throws_ok(format('SET ROLE %I', (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'billguard.journal'::regclass)),
                 '42501', NULL, 'becoming the journal''s owner: refused');
SELECT throws_ok($$TRUNCATE billguard.journal$$, '42501', NULL, 'TRUNCATE: refused');
SELECT is(pg_temp.t15_events(), 4::bigint, 'every trick deleted nothing');
RESET SESSION AUTHORIZATION;
SELECT set_config('billguard_internal.retention', 'off', false);

-- The owner's own stray DELETE is refused too: only apply_retention deletes.
SELECT throws_ok($$DELETE FROM billguard.journal WHERE persistence_id = 't15-entity'$$, '42501',
                 'billguard.journal is append-only: DELETE refused',
                 'the journal''s owner''s plain DELETE: refused');

-- apply_retention, when granted, prunes as before.
SELECT billguard.save_snapshot('t15-entity') AS ignored \gset
GRANT EXECUTE ON FUNCTION billguard.apply_retention(text, integer) TO t15_janitor;
SET LOCAL ROLE t15_janitor;
SELECT results_eq($$SELECT * FROM billguard.apply_retention('t15-entity', 1)$$,
                  $$VALUES (0::bigint, 3::bigint)$$,
                  'apply_retention, granted to the role, deletes the events its snapshot covers');
RESET ROLE;
SELECT results_eq($$SELECT seq_nr FROM billguard.journal WHERE persistence_id = 't15-entity'$$,
                  ARRAY[4::bigint], 'the newest event stays');
SELECT is(current_setting('billguard_internal.retention', true), 'off',
          'apply_retention leaves the setting off');
SELECT throws_ok($$DELETE FROM billguard.journal WHERE persistence_id = 't15-entity'$$, '42501',
                 'billguard.journal is append-only: DELETE refused',
                 'after apply_retention, a plain DELETE is refused again');

SELECT * FROM finish();
ROLLBACK;
