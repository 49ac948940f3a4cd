CREATE OR REPLACE VIEW billguard.dispatch_status AS
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
