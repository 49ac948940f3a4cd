-- Claims up to max_rows due records: status 'dispatching', attempts + 1,
-- first_dispatched_at set once, a lease (lease_expires_at: a dispatching row
-- is due again once it has passed, or when it has none), and on its first
-- claim the request it sends for good: `endpoint` and the body built for
-- it. The claim leaves next_attempt_at as it is, so the record keeps its
-- place in the dispatch queue and the update stays HOT (no index entry).
-- action says what to send:
--   'charge'  POST the stored body to the stored endpoint with the key;
--   'search'  look the charge up first: the outcome of an earlier attempt
--             is unknown (a cached 500; unknown_cycles says how many the
--             record has had), or the record was claimed (created)
--             longer than idempotency_window ago, so Stripe may have pruned
--             the key of a request the record no longer knows it sent (a
--             backup restored from between that request and its recording
--             has no first_dispatched_at), or the scheduler claimed it
--             late (search_first_reason: a charge an earlier system
--             made for it may be one whose key Stripe has pruned).
-- stripe_account is the Connect account the record charges on (its
-- Stripe-Account header), NULL for the platform's own.
-- Whatever the statistics say, the queue is read in due order from its
-- index and each claimed row is updated through its primary key.
CREATE OR REPLACE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text,
                 unknown_cycles integer, stripe_account text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_bitmapscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
BEGIN
  -- The dispatcher commits its answers asynchronously (a lost answer is
  -- re-sent with the same key and replayed by Stripe), but a claim is
  -- flushed before any request leaves.
  PERFORM set_config('synchronous_commit', 'on', true);
  RETURN QUERY
  WITH due AS (
    SELECT r.idempotency_key, r.status, r.created_at, r.first_dispatched_at,
           r.search_first_reason
      FROM billguard.billing_records r
     WHERE r.next_attempt_at <= now() AND r.status IN ('pending', 'dispatching', 'unknown')
       AND (r.status <> 'dispatching' OR r.lease_expires_at IS NULL OR r.lease_expires_at <= now())
     ORDER BY r.next_attempt_at
     LIMIT max_rows
       FOR UPDATE SKIP LOCKED
  ), claimed AS (
    UPDATE billguard.billing_records r
       SET status = 'dispatching',
           attempts = r.attempts + 1,
           first_dispatched_at = coalesce(r.first_dispatched_at, now()),
           lease_expires_at = now() + lease,
           updated_at = now(),
           stripe_endpoint = coalesce(r.stripe_endpoint, endpoint),
           request_body = coalesce(r.request_body,
             billguard.charge_request_body(endpoint, r.idempotency_key, r.customer_id,
                                           r.billing_period, r.amount_cents, r.currency,
                                           r.stripe_customer, r.payment_method, r.description,
                                           r.metadata, r.application_fee_cents))
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period,
              r.stripe_endpoint, r.request_body, r.unknown_cycles, r.stripe_account,
              CASE WHEN due.status = 'unknown'
                     OR least(due.created_at, due.first_dispatched_at) < now() - idempotency_window
                     OR due.search_first_reason IS NOT NULL
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
         c.stripe_endpoint, c.request_body, coalesce(c.unknown_cycles, 0)::integer, c.stripe_account
    FROM claimed c;
END $$;
