-- What operators see and do: the dispatcher's state, and deliberate
-- requeueing or resolution of records that need a person.

-- The dispatcher of the current database, from shared memory: it runs
-- (pid) or why not (not_served_reason); wakeup_registered says whether a
-- billing's COMMIT would set a dispatcher's latch, never while none runs.
CREATE FUNCTION billguard.dispatcher_state(
    OUT pid integer, OUT started_at timestamptz, OUT paused boolean, OUT pause_reason text,
    OUT in_flight integer, OUT requests_sent bigint, OUT wakeup_registered boolean,
    OUT not_served_reason text, OUT waiting_for text, OUT scheduler_pause_reason text)
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_dispatcher_state';

CREATE VIEW billguard.dispatch_status AS
SELECT d.pid IS NOT NULL AS worker_running,
       d.pid AS worker_pid,
       d.started_at AS worker_started_at,
       d.paused,
       d.pause_reason,
       d.in_flight,
       d.requests_sent,
       -- Outstanding records are the dispatch queue (next_attempt_at set); due
       -- as billguard.claim_due_records sees it.
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.next_attempt_at <= now() AND r.status IN ('pending', 'dispatching', 'unknown')
           AND (r.status <> 'dispatching' OR r.lease_expires_at IS NULL OR r.lease_expires_at <= now())) AS due,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.next_attempt_at IS NOT NULL AND r.status IN ('pending', 'dispatching', 'unknown')) AS outstanding,
       (SELECT now() - min(r.created_at) FROM billguard.billing_records r
         WHERE r.next_attempt_at IS NOT NULL AND r.status IN ('pending', 'dispatching', 'unknown')) AS oldest_outstanding_age,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status = 'completed' AND r.completed_at > now() - interval '1 minute') AS completed_last_minute,
       (SELECT count(*) FROM billguard.billing_records r
         WHERE r.status IN ('failed', 'needs_review') AND r.updated_at > now() - interval '1 minute') AS failed_last_minute,
       d.not_served_reason,
       d.waiting_for
  FROM billguard.dispatcher_state() d;
COMMENT ON VIEW billguard.dispatch_status IS
  'The dispatcher of this database: running or not and why, paused and why, requests in flight, the queue, recent outcomes, a lock it waits for.';

-- The record of (customer_id, billing_period), locked, if its status is one
-- of `allowed`; otherwise a clear error naming what `action` needs.
CREATE FUNCTION billguard.record_for_operator(customer_id text, billing_period text,
                                              allowed text[], action text)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
  n   int := cardinality(allowed);
BEGIN
  PERFORM billguard.check_billing_period(record_for_operator.billing_period);
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.customer_id = record_for_operator.customer_id
     AND r.billing_period = record_for_operator.billing_period
     FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record for % in %',
                    quote_literal(left(record_for_operator.customer_id, 64)),
                    record_for_operator.billing_period
      USING ERRCODE = 'no_data_found';
  END IF;
  IF rec.status <> ALL (allowed) THEN
    RAISE EXCEPTION 'billing record %/% is %, only % or % records can be %',
                    rec.customer_id, rec.billing_period, rec.status,
                    array_to_string(allowed[1:n - 1], ', '), allowed[n], action
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN rec;
END $$;

-- Requeues a locked record: pending, attempts 0, no unknown cycles, due
-- now, journaled. It keeps its key, its stored request and its first
-- dispatch time, so a record older than the idempotency window is searched
-- for at Stripe before anything is re-sent.
CREATE FUNCTION billguard.requeue_record(rec billguard.billing_records) RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  UPDATE billguard.billing_records r
     SET status = 'pending', attempts = 0, unknown_cycles = NULL, next_attempt_at = now(),
         updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'RecordRequeued',
    jsonb_build_object('previous_status', rec.status, 'last_error', rec.last_error,
                       'by', session_user));
END $$;

-- Requeues a failed or needs_review record deliberately.
CREATE FUNCTION billguard.retry_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.requeue_record(
    billguard.record_for_operator(retry_record.customer_id, retry_record.billing_period,
                                  ARRAY['failed', 'needs_review'], 'retried'));
  PERFORM billguard.wake_dispatcher();
  RETURN 'pending';
END $$;

-- Requeues every record of a period in one status, failed or needs_review
-- (after an outage, or once a cause is fixed); returns how many.
CREATE FUNCTION billguard.retry_period(billing_period text, status text)
  RETURNS bigint
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
  n   bigint := 0;
BEGIN
  PERFORM billguard.check_billing_period(retry_period.billing_period);
  IF retry_period.status IS NULL OR retry_period.status NOT IN ('failed', 'needs_review') THEN
    RAISE EXCEPTION 'retry_period requeues failed or needs_review records, not %',
                    coalesce(quote_literal(left(retry_period.status, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  FOR rec IN SELECT * FROM billguard.billing_records r
              WHERE r.billing_period = retry_period.billing_period AND r.status = retry_period.status
              ORDER BY r.idempotency_key
                FOR UPDATE
  LOOP
    PERFORM billguard.requeue_record(rec);
    n := n + 1;
  END LOOP;
  IF n > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN n;
END $$;

-- Marks a reviewed record completed with the charge a person found; a
-- record's charge id is set once.
CREATE FUNCTION billguard.resolve_record(customer_id text, billing_period text, charge_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  IF resolve_record.charge_id IS NULL OR resolve_record.charge_id !~ '^(pi|ch)_[A-Za-z0-9_]+$' THEN
    RAISE EXCEPTION 'charge_id must be a Stripe id (pi_... or ch_...)'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  rec := billguard.record_for_operator(resolve_record.customer_id, resolve_record.billing_period,
                                       ARRAY['needs_review', 'failed', 'unknown'], 'resolved');
  IF rec.charge_id IS NOT NULL THEN
    RAISE EXCEPTION 'billing record %/% already has charge %: a charge id never changes',
                    rec.customer_id, rec.billing_period, rec.charge_id
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  UPDATE billguard.billing_records r
     SET status = 'completed', charge_id = resolve_record.charge_id, completed_at = now(),
         last_error = NULL, next_attempt_at = NULL, updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ReviewResolved',
    jsonb_build_object('charge_id', resolve_record.charge_id, 'previous_status', rec.status,
                       'by', session_user));
  RETURN 'completed';
END $$;
