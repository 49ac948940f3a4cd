-- The spend-cap ledger of billguard-proxy (worker/): budgets, vault keys,
-- reservations and the audit trail. Each decision of the proxy is one call
-- of a function below (81_vault_keys.sql, 82_vault_decisions.sql), so it is
-- atomic and survives a proxy crash. A period's cap belongs to its budget,
-- never to a key: a key issued again for the period (after a crash lost the
-- first answer) joins the budget, and so can never double the cap.

\ir ../udfs/random_base62/latest.sql
\ir ../udfs/usd_to_cents/latest.sql
\ir ../udfs/are_vault_endpoints/latest.sql
\ir ../udfs/to_minor_units/latest.sql
\ir ../udfs/minor_units_text/latest.sql
\ir ../udfs/are_stripe_accounts/latest.sql

CREATE TABLE billguard.vault_budgets (
  vendor         text NOT NULL,
  billing_period text NOT NULL,
  currency       text NOT NULL REFERENCES billguard.currencies (code),
  cap_cents      bigint NOT NULL,
  -- The sum of the budget's reservations not released (reserved or
  -- settled): what the cap is checked against. Changed, under the budget's
  -- row lock, only when a reservation is counted or stops being counted; a
  -- success settling a reservation leaves it, and the row, alone.
  committed_cents bigint NOT NULL DEFAULT 0,
  created_at     timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  -- The connected accounts (Stripe-Account) the budget may spend on, beside
  -- the platform's own account, which it always may: those its keys named
  -- at POST /keys.
  stripe_accounts text[] NOT NULL DEFAULT '{}',
  PRIMARY KEY (vendor, billing_period, currency),
  CONSTRAINT vault_budgets_vendor_valid CHECK (vendor ~ '^[a-z][a-z0-9_]{0,39}$'),
  CONSTRAINT vault_budgets_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT vault_budgets_cap_valid CHECK (cap_cents > 0 AND cap_cents <= 1000000000000000),
  CONSTRAINT vault_budgets_committed_valid CHECK (committed_cents >= 0),
  CONSTRAINT vault_budgets_stripe_accounts_valid CHECK (billguard.are_stripe_accounts(stripe_accounts))
);
COMMENT ON TABLE billguard.vault_budgets IS
  'One spend cap per (vendor, billing_period, currency), shared by every vault key of the period.';

CREATE TABLE billguard.vault_keys (
  key_id            text PRIMARY KEY,
  -- SHA-256 of the secret; the secret itself is returned once and never stored.
  secret_sha256     bytea NOT NULL UNIQUE,
  vendor            text NOT NULL,
  billing_period    text NOT NULL,
  currency          text NOT NULL,
  allowed_endpoints text[] NOT NULL,
  livemode          boolean NOT NULL,
  expires_at        timestamptz NOT NULL,
  revoked_at        timestamptz,
  created_at        timestamptz NOT NULL DEFAULT now(),
  FOREIGN KEY (vendor, billing_period, currency) REFERENCES billguard.vault_budgets,
  CONSTRAINT vault_keys_key_id_valid CHECK (key_id ~ '^vkey_[A-Za-z0-9]{16}$'),
  CONSTRAINT vault_keys_secret_is_sha256 CHECK (octet_length(secret_sha256) = 32),
  CONSTRAINT vault_keys_endpoints_valid CHECK (billguard.are_vault_endpoints(allowed_endpoints))
);
COMMENT ON TABLE billguard.vault_keys IS
  'Vault keys: a public key_id, the hash of the secret, the budget it spends, its scope and life.';

-- One reservation per (budget, account, Idempotency-Key): every request
-- carrying the key on that account, through any key of the budget, shares
-- it, so a retry is counted once; Stripe scopes a key to the account it acts
-- on, so the same key on another account is another request.
-- reserved: counted against the cap, outcome unknown or in flight;
-- settled: a success, still counted, its answer kept to be replayed for ever;
-- released: no attempt of the key can have charged, no longer counted.
CREATE TABLE billguard.vault_reservations (
  vendor              text NOT NULL,
  billing_period      text NOT NULL,
  currency            text NOT NULL,
  idempotency_key     text NOT NULL,
  -- SHA-256 (hex) of the method, path and parameters: the same key with
  -- other parameters is Stripe's idempotency_error.
  request_digest      text NOT NULL,
  key_id              text NOT NULL REFERENCES billguard.vault_keys,
  endpoint            text NOT NULL,
  customer            text,
  amount_cents        bigint NOT NULL,
  status              text NOT NULL DEFAULT 'reserved',
  upstream_status     integer,   -- Stripe's last answer; 0 when none arrived
  charge_id           text,
  response_status     integer,
  response_body       text,
  response_request_id text,
  -- When it was reserved (again, after a release): Stripe remembers the
  -- key's first request for 24 hours, so a key still reserved past the
  -- proxy's idempotency window is never forwarded before the proxy has
  -- found out from Stripe what its attempts did.
  reserved_at         timestamptz NOT NULL DEFAULT now(),
  settled_at          timestamptz,
  -- The request's metadata[billguard_key], by which the proxy searches
  -- Stripe for what the key created.
  search_key          text,
  -- The attempts forwarded with the key, numbered 1..attempts, and those
  -- of them that may have charged: forwarded and not answered yet, or
  -- answered with no definite outcome (a 5xx, no answer). A refusal
  -- releases the reservation only when no other attempt is in doubt.
  attempts            integer NOT NULL DEFAULT 0,
  attempts_in_doubt   integer[] NOT NULL DEFAULT '{}',
  last_forwarded_at   timestamptz,
  -- The connected account the request acted on (Stripe-Account), '' for
  -- the platform's own.
  stripe_account      text NOT NULL DEFAULT '',
  PRIMARY KEY (vendor, billing_period, currency, stripe_account, idempotency_key),
  FOREIGN KEY (vendor, billing_period, currency) REFERENCES billguard.vault_budgets,
  CONSTRAINT vault_reservations_status_valid CHECK (status IN ('reserved', 'settled', 'released')),
  CONSTRAINT vault_reservations_amount_positive CHECK (amount_cents > 0),
  CONSTRAINT vault_reservations_settled_answer CHECK (status <> 'settled' OR response_body IS NOT NULL),
  CONSTRAINT vault_reservations_doubt_only_reserved CHECK (status = 'reserved' OR attempts_in_doubt = '{}'),
  CONSTRAINT vault_reservations_stripe_account_valid CHECK (stripe_account ~ '^(acct_[A-Za-z0-9]{1,250})?$')
);
COMMENT ON TABLE billguard.vault_reservations IS
  'Amounts reserved against a budget per Idempotency-Key, and the answers of settled successes.';

-- The reservations still in flight or of unknown outcome, few at any time:
-- a budget's reserved sum is read from here, its settled sum is its
-- committed sum less that (vault_spend).
CREATE INDEX vault_reservations_reserved ON billguard.vault_reservations
  (vendor, billing_period, currency) INCLUDE (amount_cents) WHERE status = 'reserved';

-- Append-only: one row per decision of the proxy, allowed or refused, in
-- the order of occurred_at.
CREATE TABLE billguard.vault_audit (
  occurred_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
  key_id          text,
  vendor          text,
  billing_period  text,
  method          text,
  endpoint        text,
  customer        text,
  amount_cents    bigint,
  currency        text,
  idempotency_key text,
  decision        text NOT NULL,
  http_status     integer,
  reason          text,
  stripe_account  text,   -- of a request on a connected account (Stripe-Account)
  CONSTRAINT vault_audit_decision_valid CHECK (decision IN (
    'forwarded', 'reserved', 'reused', 'replayed', 'refused',   -- vault_authorize
    'reconcile',
    'settled', 'released', 'unknown',                           -- vault_settle, vault_reconcile
    'issued', 'revoked', 'cap_raised'))                         -- keys and caps
);
COMMENT ON TABLE billguard.vault_audit IS
  'Every decision of the spend-cap proxy: time, key, period, request, decision, HTTP status, reason.';

\ir ../udfs/refuse_vault_audit_change/latest.sql

CREATE TRIGGER vault_audit_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON billguard.vault_audit
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_vault_audit_change();

\ir ../views/vault_spend/latest.sql

-- pg_dump carries the ledger with its rows: a restored database must still
-- know what each period has spent and which answers it replays.
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_budgets', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_keys', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_reservations', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_audit', '');
