-- billguard 0.1.0 -> 0.2.0. Run by ALTER EXTENSION billguard UPDATE.
-- Every schema change since the 0.1.0 release is made here as well as in
-- sql/install/ (the fresh install of 0.2.0); test/t/080_upgrade.pl proves
-- that both give the same schema.
\echo Use "ALTER EXTENSION billguard UPDATE TO '0.2.0'" to load this file. \quit

-- ==== Every function pins its search_path (issue 6, item 1) ====
-- The dispatcher runs as a superuser: a function that resolved names through
-- the caller's search_path could run an object planted in a schema another
-- role can create in (public, in a database that role owns).
ALTER FUNCTION billguard.key_namespace() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.idempotency_key(text,text,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.wake_dispatcher() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.is_billing_period(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.check_billing_period(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.billing_initiated_event(text,text,text,bigint,text,timestamp with time zone,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.refuse_journal_change() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.highest_seq_nr(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.state_version() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.initial_state(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.apply_event(jsonb,text,jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.refuse_billing_record_change() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.caller_status(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.period_lock_class() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.scheduler_lock_class() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.append_billing_event(text,text,text,jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.retry_delay(integer,double precision) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.requeue_abandoned() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.claim_due_records(integer,interval,interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.lock_attempt(text,integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.is_json(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.json_or_null(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.classify_stripe_response(integer,boolean,text,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_charge_response(text,integer,integer,text,text,boolean,integer,interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.error_text(jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_transport_error(text,integer,text,integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_search_result(text,integer,integer,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.release_claim(text,integer,boolean) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.dispatcher_state() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_for_operator(text,text,text[],text) SET search_path = pg_catalog, pg_temp;

-- ==== The worker: a dispatcher in every database, its wake-up latch and status (issue 6, items 17, 18, 20) ====
-- dispatcher_state() gains columns, so it is created anew; dispatch_status is
-- re-pointed with CREATE OR REPLACE, never dropped, so that the grants
-- operators hold on it survive the update.
ALTER FUNCTION billguard.dispatcher_state() RENAME TO dispatcher_state_0_1_0;
CREATE FUNCTION billguard.dispatcher_state(
    OUT pid integer, OUT started_at timestamptz, OUT paused boolean, OUT pause_reason text,
    OUT in_flight integer, OUT requests_sent bigint, OUT wakeup_registered boolean,
    OUT not_served_reason text)
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_dispatcher_state';
REVOKE ALL ON FUNCTION billguard.dispatcher_state() FROM PUBLIC;
COMMENT ON FUNCTION billguard.wake_dispatcher() IS
  'Wakes this database''s dispatcher when the current transaction commits (no-op unless billguard is preloaded).';
CREATE OR REPLACE VIEW billguard.dispatch_status AS
SELECT d.pid IS NOT NULL AS worker_running,
       d.pid AS worker_pid,
       d.started_at AS worker_started_at,
       d.paused,
       d.pause_reason,
       d.in_flight,
       d.requests_sent,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('pending', 'dispatching', 'unknown') AND r.next_attempt_at <= now()) AS due,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('pending', 'dispatching', 'unknown')) AS outstanding,
       (SELECT now() - min(r.created_at) FROM billguard.billing_records r
         WHERE r.status IN ('pending', 'dispatching', 'unknown')) AS oldest_outstanding_age,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status = 'completed' AND r.completed_at > now() - interval '1 minute') AS completed_last_minute,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('failed', 'needs_review') AND r.updated_at > now() - interval '1 minute') AS failed_last_minute,
       d.not_served_reason
  FROM billguard.dispatcher_state() d;
DROP FUNCTION billguard.dispatcher_state_0_1_0();
COMMENT ON VIEW billguard.dispatch_status IS
  'The dispatcher of this database: running or not and why, paused and why, requests in flight, the queue, recent outcomes.';
