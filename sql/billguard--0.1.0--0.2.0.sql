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

-- ==== The dispatch path (issue 6, items 5, 6, 11, 12, 13, 14, 15, 16, 22, 23) ====

-- A record keeps the request of its first attempt (endpoint and exact body),
-- and its charge id once set; both are frozen with the rest of its identity.
ALTER TABLE billguard.billing_records ADD COLUMN stripe_endpoint text, ADD COLUMN request_body text;

CREATE OR REPLACE FUNCTION billguard.refuse_billing_record_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'UPDATE' AND OLD.charge_id IS NOT NULL AND OLD.charge_id IS DISTINCT FROM NEW.charge_id THEN
    RAISE EXCEPTION 'billing record %/% already has charge %: a charge id never changes',
                    OLD.customer_id, OLD.billing_period, OLD.charge_id
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  IF TG_OP = 'UPDATE'
     AND ((OLD.stripe_endpoint IS NOT NULL AND OLD.stripe_endpoint IS DISTINCT FROM NEW.stripe_endpoint)
          OR (OLD.request_body IS NOT NULL AND OLD.request_body IS DISTINCT FROM NEW.request_body)) THEN
    RAISE EXCEPTION 'billing record %/%: the request sent to Stripe never changes once stored',
                    OLD.customer_id, OLD.billing_period
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  IF TG_OP = 'UPDATE' THEN
    RAISE EXCEPTION 'billing record %/% : customer, period, key, amount and payee never change',
                    OLD.customer_id, OLD.billing_period
      USING ERRCODE = 'integrity_constraint_violation';
  END IF;
  RAISE EXCEPTION 'billguard.billing_records rows are never removed: % refused', TG_OP
    USING ERRCODE = 'integrity_constraint_violation';
END $$;

DROP TRIGGER billing_records_frozen_identity ON billguard.billing_records;
CREATE TRIGGER billing_records_frozen_identity BEFORE UPDATE ON billguard.billing_records
  FOR EACH ROW
  WHEN (OLD.customer_id IS DISTINCT FROM NEW.customer_id
     OR OLD.billing_period IS DISTINCT FROM NEW.billing_period
     OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key
     OR OLD.amount_cents IS DISTINCT FROM NEW.amount_cents
     OR OLD.currency IS DISTINCT FROM NEW.currency
     OR OLD.stripe_customer IS DISTINCT FROM NEW.stripe_customer
     OR OLD.payment_method IS DISTINCT FROM NEW.payment_method
     OR (OLD.stripe_endpoint IS NOT NULL AND OLD.stripe_endpoint IS DISTINCT FROM NEW.stripe_endpoint)
     OR (OLD.request_body IS NOT NULL AND OLD.request_body IS DISTINCT FROM NEW.request_body)
     OR (OLD.charge_id IS NOT NULL AND OLD.charge_id IS DISTINCT FROM NEW.charge_id))
  EXECUTE FUNCTION billguard.refuse_billing_record_change();

CREATE FUNCTION billguard.charge_request_body(endpoint text, idempotency_key text,
                                              customer_id text, billing_period text,
                                              amount_cents bigint, currency text,
                                              stripe_customer text, payment_method text)
  RETURNS text
  LANGUAGE c IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_charge_request_body';

-- Records that 0.1.0 may have sent (first dispatched) keep the request it
-- sent: 0.1.0 encoded the body with this same encoder (common/'s
-- ChargeFields and FormEncode, unchanged since; test/unit pins the bytes)
-- for the endpoint in force, which is the setting now, as that setting
-- could not be changed safely under 0.1.0 while a record was unresolved.
-- Records never sent get their request at their first claim.
UPDATE billguard.billing_records r
   SET stripe_endpoint = s.endpoint,
       request_body = billguard.charge_request_body(s.endpoint, r.idempotency_key, r.customer_id,
                                                    r.billing_period, r.amount_cents, r.currency,
                                                    r.stripe_customer, r.payment_method)
  FROM (SELECT coalesce(current_setting('billguard.stripe_endpoint', true), '/v1/payment_intents')
                 AS endpoint) s
 WHERE r.first_dispatched_at IS NOT NULL;

-- The dispatcher reads and judges Stripe's answers in C++
-- (common/stripe_response.cpp) and passes typed fields: no body is parsed in
-- SQL any more.
DROP FUNCTION billguard.record_charge_response(text, integer, integer, text, text, boolean, integer, interval);
DROP FUNCTION billguard.record_search_result(text, integer, integer, text);
DROP FUNCTION billguard.record_transport_error(text, integer, text, integer);
DROP FUNCTION billguard.classify_stripe_response(integer, boolean, text, text);
DROP FUNCTION billguard.json_or_null(text);
DROP FUNCTION billguard.is_json(text);
DROP FUNCTION billguard.claim_due_records(integer, interval, interval);

CREATE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
BEGIN
  -- The dispatcher commits its answers asynchronously (a lost answer is
  -- re-sent with the same key and replayed by Stripe), but a claim is
  -- flushed before any request leaves.
  PERFORM set_config('synchronous_commit', 'on', true);
  RETURN QUERY
  WITH due AS (
    SELECT r.idempotency_key, r.status, r.created_at, r.first_dispatched_at
      FROM billguard.billing_records r
     WHERE r.status IN ('pending', 'dispatching', 'unknown') AND r.next_attempt_at <= now()
     ORDER BY r.next_attempt_at
     LIMIT max_rows
       FOR UPDATE SKIP LOCKED
  ), claimed AS (
    UPDATE billguard.billing_records r
       SET status = 'dispatching',
           attempts = r.attempts + 1,
           first_dispatched_at = coalesce(r.first_dispatched_at, now()),
           lease_expires_at = now() + lease,
           next_attempt_at = now() + lease,
           updated_at = now(),
           stripe_endpoint = coalesce(r.stripe_endpoint, endpoint),
           request_body = coalesce(r.request_body,
             billguard.charge_request_body(endpoint, r.idempotency_key, r.customer_id,
                                           r.billing_period, r.amount_cents, r.currency,
                                           r.stripe_customer, r.payment_method))
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period,
              r.stripe_endpoint, r.request_body,
              CASE WHEN due.status = 'unknown'
                     OR least(due.created_at, due.first_dispatched_at) < now() - idempotency_window
                   THEN 'search' ELSE 'charge' END AS action
  ), journaled AS (
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           c.customer_id, 'ChargeAttempted',
           jsonb_build_object('attempt', c.attempts, 'action', c.action,
                              'idempotency_key', c.idempotency_key, 'at', now())
      FROM claimed c
     CROSS JOIN LATERAL (SELECT 'billing-' || c.customer_id || '-' || c.billing_period AS id) p
  )
  SELECT c.idempotency_key, c.attempts, c.action, c.customer_id, c.billing_period,
         c.stripe_endpoint, c.request_body
    FROM claimed c;
END $$;

-- The dispatcher never waits for a row another session holds (SKIP LOCKED),
-- and finds a row by its primary key alone.
CREATE OR REPLACE FUNCTION billguard.lock_attempt(key text, attempt integer)
  RETURNS billguard.billing_records
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key
     FOR UPDATE SKIP LOCKED;
  IF rec.status IS DISTINCT FROM 'dispatching' OR rec.attempts IS DISTINCT FROM attempt THEN
    RETURN NULL;
  END IF;
  RETURN rec;
END $$;

CREATE FUNCTION billguard.missed_attempt(key text, attempt integer)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN (SELECT r.status = 'dispatching' AND r.attempts = attempt
                      FROM billguard.billing_records r WHERE r.idempotency_key = key)
              THEN 'locked' ELSE 'stale' END;

CREATE FUNCTION billguard.record_charge_response(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    replayed boolean, request_id text, error_type text, error_code text, decline_code text,
    message text, body_excerpt text, settle_delay interval)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec    billguard.billing_records;
  detail jsonb;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  detail := jsonb_strip_nulls(jsonb_build_object(
    'http_status', nullif(http_status, 0), 'type', error_type, 'code', error_code,
    'decline_code', decline_code, 'message', message, 'body', body_excerpt,
    'request_id', request_id, 'attempt', attempt));

  CASE outcome
    WHEN 'completed' THEN
      UPDATE billguard.billing_records r
         SET status = 'completed', charge_id = record_charge_response.charge_id,
             completed_at = now(), lease_expires_at = NULL, last_error = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCompleted',
        jsonb_strip_nulls(jsonb_build_object(
          'charge_id', record_charge_response.charge_id, 'replayed', coalesce(replayed, false),
          'http_status', http_status, 'attempt', attempt, 'request_id', request_id)));
    WHEN 'paused' THEN
      -- The key was refused before anything was charged: the attempt does
      -- not count, and the record waits for a fixed key.
      UPDATE billguard.billing_records r
         SET status = 'pending', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
    WHEN 'not_sent' THEN
      UPDATE billguard.billing_records r
         SET status = 'pending', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, last_error = 'not sent: ' || message, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeNotSent',
        jsonb_build_object('attempt', attempt, 'message', message));
    WHEN 'retry', 'throttled' THEN
      -- A rate limit or a key still in use backs off a minute at most.
      UPDATE billguard.billing_records r
         SET status = 'pending',
             next_attempt_at = now() + billguard.retry_delay(attempt,
                                 CASE WHEN outcome = 'throttled' THEN 60 ELSE 900 END),
             lease_expires_at = NULL, last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', false));
    WHEN 'unknown' THEN
      -- Search is eventually consistent: do not conclude "absent" before
      -- the settle delay has passed.
      UPDATE billguard.billing_records r
         SET status = 'unknown', next_attempt_at = now() + settle_delay,
             lease_expires_at = NULL, last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeUnknown',
        detail);
    WHEN 'needs_review' THEN
      UPDATE billguard.billing_records r
         SET status = 'needs_review', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'NeedsReview',
        detail);
    WHEN 'failed' THEN
      UPDATE billguard.billing_records r
         SET status = 'failed', lease_expires_at = NULL,
             last_error = billguard.error_text(detail), updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingFailed',
        detail || jsonb_build_object('terminal', true));
  END CASE;
  RETURN 'recorded';
END $$;

CREATE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  CASE outcome
    WHEN 'absent' THEN
      NULL;
    WHEN 'completed' THEN
      UPDATE billguard.billing_records r
         SET status = 'completed', charge_id = record_search_result.charge_id,
             completed_at = now(), lease_expires_at = NULL, last_error = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
      PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ChargeReconciled',
        jsonb_strip_nulls(jsonb_build_object(
          'charge_id', record_search_result.charge_id, 'via', 'search', 'attempt', attempt,
          'request_id', request_id)));
    WHEN 'retry' THEN
      -- We still do not know whether an earlier attempt charged: stay unknown.
      UPDATE billguard.billing_records r
         SET status = 'unknown', next_attempt_at = now() + billguard.retry_delay(attempt),
             lease_expires_at = NULL, last_error = message, updated_at = now()
       WHERE r.idempotency_key = key;
    WHEN 'paused', 'not_sent' THEN
      UPDATE billguard.billing_records r
         SET status = 'unknown', attempts = r.attempts - 1, next_attempt_at = now(),
             lease_expires_at = NULL, updated_at = now()
       WHERE r.idempotency_key = key;
  END CASE;
  RETURN 'recorded';
END $$;

CREATE OR REPLACE FUNCTION billguard.release_claim(key text, attempt integer, search boolean)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  rec := billguard.lock_attempt(key, attempt);
  IF rec.idempotency_key IS NULL THEN
    RETURN billguard.missed_attempt(key, attempt);
  END IF;
  UPDATE billguard.billing_records r
     SET status = CASE WHEN search THEN 'unknown' ELSE 'pending' END,
         attempts = r.attempts - 1, next_attempt_at = now(), lease_expires_at = NULL,
         updated_at = now()
   WHERE r.idempotency_key = key;
  RETURN 'released';
END $$;

-- A Stripe outage of minutes must cost nothing but time: backoff grows to
-- 15 minutes (max_attempts now defaults to 20: hours of retries), and
-- operators requeue a period's failed or needs_review records at once.
CREATE OR REPLACE FUNCTION billguard.retry_delay(attempt integer, cap_seconds double precision DEFAULT 900)
  RETURNS interval
  LANGUAGE plpgsql VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  RETURN make_interval(secs => least(0.5 * power(2, least(greatest(attempt - 1, 0), 30)), cap_seconds)
                               * (0.5 + random() / 2));
END $$;

CREATE FUNCTION billguard.requeue_record(rec billguard.billing_records) RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  UPDATE billguard.billing_records r
     SET status = 'pending', attempts = 0, next_attempt_at = now(), updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'RecordRequeued',
    jsonb_build_object('previous_status', rec.status, 'last_error', rec.last_error,
                       'by', session_user));
END $$;

CREATE OR REPLACE FUNCTION billguard.retry_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.requeue_record(
    billguard.record_for_operator(retry_record.customer_id, retry_record.billing_period,
                                  ARRAY['failed', 'needs_review'], 'retried'));
  PERFORM billguard.wake_dispatcher();
  RETURN 'pending';
END $$;

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

CREATE OR REPLACE FUNCTION billguard.resolve_record(customer_id text, billing_period text, charge_id text)
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
         last_error = NULL, updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ReviewResolved',
    jsonb_build_object('charge_id', resolve_record.charge_id, 'previous_status', rec.status,
                       'by', session_user));
  RETURN 'completed';
END $$;

-- As in a fresh install, nothing of the above is granted to PUBLIC.
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA billguard FROM PUBLIC;
