-- The dispatcher of the current database, from shared memory: it runs
-- (pid) or why not (not_served_reason); wakeup_registered says whether a
-- billing's COMMIT would set a dispatcher's latch, never while none runs.
CREATE OR REPLACE FUNCTION billguard.dispatcher_state(
    OUT pid integer, OUT started_at timestamptz, OUT paused boolean, OUT pause_reason text,
    OUT in_flight integer, OUT requests_sent bigint, OUT wakeup_registered boolean,
    OUT not_served_reason text, OUT waiting_for text, OUT scheduler_pause_reason text)
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_dispatcher_state';
