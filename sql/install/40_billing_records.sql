-- The pre-flight table: one row per (customer, period), claimed before any
-- call to Stripe. It is the authority on whether a charge may be sent.

CREATE TABLE billguard.billing_records (
  -- The seed's columns and constraints, verbatim.
  customer_id      TEXT NOT NULL,
  billing_period   TEXT NOT NULL,
  idempotency_key  TEXT NOT NULL,
  status           TEXT NOT NULL DEFAULT 'pending',
  charge_id        TEXT,
  created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
  -- What dispatch needs, frozen at claim time so every retry sends
  -- byte-identical parameters.
  amount_cents        bigint NOT NULL,
  currency            text NOT NULL,
  stripe_customer     text NOT NULL,
  payment_method      text,
  request_id          text,            -- tracing only; never part of a key
  attempts            integer NOT NULL DEFAULT 0,
  -- When the dispatcher may next send it; NULL once it is settled (the
  -- dispatch queue below holds only the records that still need a request).
  next_attempt_at     timestamptz DEFAULT now(),
  lease_expires_at    timestamptz,
  first_dispatched_at timestamptz,
  last_error          text,
  completed_at        timestamptz,
  updated_at          timestamptz NOT NULL DEFAULT now(),
  -- The request of the first attempt, stored by the claim before it leaves:
  -- every later attempt and every search use exactly these, whatever the
  -- settings or the code say by then (billguard.charge_request_body).
  stripe_endpoint     text,
  request_body        text,
  -- Indeterminate answers (cached 500s) since the record was last queued: a
  -- search that finds nothing after billguard.max_unknown_cycles of them
  -- settles it as needs_review. Kept on the row rather than counted from
  -- the journal's ChargeUnknown events on every claim; NULL (no bytes, a
  -- bit of the null bitmap) for the records that never had one, which is
  -- almost all of them, and for every row an upgrade found.
  unknown_cycles      smallint,
  -- Why the dispatcher searches Stripe for this record's charge before it
  -- sends one, on every claim: the scheduler claimed it more than
  -- billguard.idempotency_window after its period became due, so a charge an
  -- earlier system made for it (a restored backup that lost the tick) may be
  -- one Stripe no longer knows the key of. NULL for every other record.
  search_first_reason text,
  -- Frozen at claim with the amount: the period amount's description and
  -- metadata (sent in the charge's body), and the account's Connect account
  -- (sent as Stripe-Account) and application fee. NULL: none.
  description           text,
  metadata              jsonb,
  stripe_account        text,
  application_fee_cents bigint,
  CONSTRAINT billing_records_pk PRIMARY KEY (idempotency_key),
  CONSTRAINT billing_records_uq UNIQUE (customer_id, billing_period),
  CONSTRAINT billing_records_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT billing_records_status_valid CHECK (status IN
    ('pending', 'dispatching', 'completed', 'failed', 'blocked', 'needs_review', 'unknown',
     'cancelled', 'below_minimum')),
  -- Zero, and amounts under Stripe's minimum, are claimed as below_minimum
  -- and never sent.
  CONSTRAINT billing_records_amount_not_negative CHECK (amount_cents >= 0),
  CONSTRAINT billing_records_completed_has_charge CHECK (status <> 'completed' OR charge_id IS NOT NULL)
)
-- A record grows to about 470 bytes when its first claim stores the
-- request, and its answer writes one more version of it: with room left on
-- the page both updates stay there, the claim as a HOT update (no index
-- entry) and the answer logging only the columns it changes, not the body.
WITH (fillfactor = 50);
COMMENT ON TABLE billguard.billing_records IS
  'Pre-flight claims: one per (customer_id, billing_period), each with its one idempotency key.';

-- The dispatch queue: records that still need a request, in due order. Its
-- key and predicate are next_attempt_at alone, which a claim leaves as it is
-- (the lease is lease_expires_at), so a claim is a HOT update; settling a
-- record sets next_attempt_at NULL, which takes it out.
CREATE INDEX billing_records_due ON billguard.billing_records (next_attempt_at)
  WHERE next_attempt_at IS NOT NULL;

\ir ../udfs/refuse_billing_record_change/latest.sql

CREATE TRIGGER billing_records_keep_rows BEFORE DELETE OR TRUNCATE ON billguard.billing_records
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_billing_record_change();

-- What a record charges changes only when a cancelled record that was never
-- sent is claimed again (reclaim_record): Stripe never saw its key.
CREATE TRIGGER billing_records_frozen_identity BEFORE UPDATE ON billguard.billing_records
  FOR EACH ROW
  WHEN (OLD.customer_id IS DISTINCT FROM NEW.customer_id
     OR OLD.billing_period IS DISTINCT FROM NEW.billing_period
     OR OLD.idempotency_key IS DISTINCT FROM NEW.idempotency_key
     OR ((OLD.amount_cents IS DISTINCT FROM NEW.amount_cents
          OR OLD.currency IS DISTINCT FROM NEW.currency
          OR OLD.stripe_customer IS DISTINCT FROM NEW.stripe_customer
          OR OLD.payment_method IS DISTINCT FROM NEW.payment_method
          OR OLD.description IS DISTINCT FROM NEW.description
          OR OLD.metadata IS DISTINCT FROM NEW.metadata
          OR OLD.stripe_account IS DISTINCT FROM NEW.stripe_account
          OR OLD.application_fee_cents IS DISTINCT FROM NEW.application_fee_cents)
         AND NOT (OLD.status = 'cancelled' AND OLD.first_dispatched_at IS NULL
                  AND OLD.request_body IS NULL))
     OR (OLD.stripe_endpoint IS NOT NULL AND OLD.stripe_endpoint IS DISTINCT FROM NEW.stripe_endpoint)
     OR (OLD.request_body IS NOT NULL AND OLD.request_body IS DISTINCT FROM NEW.request_body)
     OR (OLD.charge_id IS NOT NULL AND OLD.charge_id IS DISTINCT FROM NEW.charge_id))
  EXECUTE FUNCTION billguard.refuse_billing_record_change();

\ir ../udfs/caller_status/latest.sql
\ir ../udfs/period_lock_class/latest.sql
\ir ../udfs/scheduler_lock_class/latest.sql
