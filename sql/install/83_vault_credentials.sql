-- Billing through billguard-proxy: with billguard.vault_issuer_token_file
-- set, the dispatcher obtains one vault key per billing period and currency
-- from the proxy (POST /keys) before the period's first request, keeps it
-- here, and sends every charge and search of the period with it
-- (extension/vault_keys.cpp).
--
-- The secrets are readable by superusers only: nothing on this table is
-- granted to anyone, and the dispatcher runs as the bootstrap superuser.
-- The table is deliberately not registered with pg_extension_config_dump,
-- so no dump ever holds a vault key: a database restored from a dump has
-- none, and its dispatcher obtains the period's key again, which the
-- proxy's ledger joins to the period's existing budget (same cap, same
-- spend, same answers replayed).
CREATE TABLE billguard.vault_credentials (
  -- The proxy that issued the key: a key is only good there, so a new
  -- billguard.api_base obtains new keys.
  api_base       text NOT NULL,
  billing_period text NOT NULL,
  currency       text NOT NULL,
  key_id         text NOT NULL,
  vault_key      text NOT NULL,
  cap_cents      bigint NOT NULL,
  obtained_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (api_base, billing_period, currency),
  CONSTRAINT vault_credentials_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT vault_credentials_key_id_valid CHECK (key_id ~ '^vkey_[A-Za-z0-9]{16}$'),
  CONSTRAINT vault_credentials_key_valid CHECK (vault_key ~ '^vk_(live|test)_[A-Za-z0-9]{32}$'),
  CONSTRAINT vault_credentials_cap_valid CHECK (cap_cents > 0)
);
COMMENT ON TABLE billguard.vault_credentials IS
  'The dispatcher''s vault key per billing period and currency (superusers only; never dumped).';

\ir ../udfs/vault_key_request/latest.sql
\ir ../udfs/store_vault_credential/latest.sql
\ir ../udfs/forget_vault_credential/latest.sql
