-- Who is billed each period, and the currencies they may be billed in.

-- ISO 4217 active codes, lower case as Stripe writes them, with their minor
-- units (amount_cents counts these).
CREATE TABLE billguard.currencies (
  code        text PRIMARY KEY CHECK (code ~ '^[a-z]{3}$'),
  minor_units smallint NOT NULL CHECK (minor_units BETWEEN 0 AND 3),
  -- The ISO rows CREATE EXTENSION makes: pg_dump leaves them out (90_privileges.sql).
  builtin     boolean NOT NULL DEFAULT false,
  -- Stripe's smallest charge in this currency, in its minor units; NULL
  -- where billguard knows none (then only zero is too little). A claimed
  -- amount below it is never sent: its record is below_minimum.
  min_charge_units bigint CHECK (min_charge_units > 0)
);
INSERT INTO billguard.currencies (code, minor_units, builtin)
SELECT code, minor_units, true FROM (VALUES
  ('aed', 2), ('afn', 2), ('all', 2), ('amd', 2), ('ang', 2), ('aoa', 2), ('ars', 2), ('aud', 2),
  ('awg', 2), ('azn', 2), ('bam', 2), ('bbd', 2), ('bdt', 2), ('bgn', 2), ('bhd', 3), ('bif', 0),
  ('bmd', 2), ('bnd', 2), ('bob', 2), ('brl', 2), ('bsd', 2), ('btn', 2), ('bwp', 2), ('byn', 2),
  ('bzd', 2), ('cad', 2), ('cdf', 2), ('chf', 2), ('clp', 0), ('cny', 2), ('cop', 2), ('crc', 2),
  ('cup', 2), ('cve', 2), ('czk', 2), ('djf', 0), ('dkk', 2), ('dop', 2), ('dzd', 2), ('egp', 2),
  ('ern', 2), ('etb', 2), ('eur', 2), ('fjd', 2), ('fkp', 2), ('gbp', 2), ('gel', 2), ('ghs', 2),
  ('gip', 2), ('gmd', 2), ('gnf', 0), ('gtq', 2), ('gyd', 2), ('hkd', 2), ('hnl', 2), ('htg', 2),
  ('huf', 2), ('idr', 2), ('ils', 2), ('inr', 2), ('iqd', 3), ('irr', 2), ('isk', 0), ('jmd', 2),
  ('jod', 3), ('jpy', 0), ('kes', 2), ('kgs', 2), ('khr', 2), ('kmf', 0), ('kpw', 2), ('krw', 0),
  ('kwd', 3), ('kyd', 2), ('kzt', 2), ('lak', 2), ('lbp', 2), ('lkr', 2), ('lrd', 2), ('lsl', 2),
  ('lyd', 3), ('mad', 2), ('mdl', 2), ('mga', 2), ('mkd', 2), ('mmk', 2), ('mnt', 2), ('mop', 2),
  ('mru', 2), ('mur', 2), ('mvr', 2), ('mwk', 2), ('mxn', 2), ('myr', 2), ('mzn', 2), ('nad', 2),
  ('ngn', 2), ('nio', 2), ('nok', 2), ('npr', 2), ('nzd', 2), ('omr', 3), ('pab', 2), ('pen', 2),
  ('pgk', 2), ('php', 2), ('pkr', 2), ('pln', 2), ('pyg', 0), ('qar', 2), ('ron', 2), ('rsd', 2),
  ('rub', 2), ('rwf', 0), ('sar', 2), ('sbd', 2), ('scr', 2), ('sdg', 2), ('sek', 2), ('sgd', 2),
  ('shp', 2), ('sle', 2), ('sll', 2), ('sos', 2), ('srd', 2), ('ssp', 2), ('stn', 2), ('svc', 2),
  ('syp', 2), ('szl', 2), ('thb', 2), ('tjs', 2), ('tmt', 2), ('tnd', 3), ('top', 2), ('try', 2),
  ('ttd', 2), ('twd', 2), ('tzs', 2), ('uah', 2), ('ugx', 0), ('usd', 2), ('uyu', 2), ('uzs', 2),
  ('ves', 2), ('vnd', 0), ('vuv', 0), ('wst', 2), ('xaf', 0), ('xcd', 2), ('xcg', 2), ('xof', 0),
  ('xpf', 0), ('yer', 2), ('zar', 2), ('zmw', 2), ('zwg', 2), ('zwl', 2)) AS iso (code, minor_units);
-- Stripe's minimum charge amounts ("minimum and maximum charge amounts" in
-- its docs), in minor units.
UPDATE billguard.currencies c SET min_charge_units = m.units
  FROM (VALUES
    ('usd', 50), ('aed', 200), ('aud', 50), ('bgn', 100), ('brl', 50), ('cad', 50), ('chf', 50),
    ('czk', 1500), ('dkk', 250), ('eur', 50), ('gbp', 30), ('hkd', 400), ('huf', 17500),
    ('inr', 50), ('jpy', 50), ('mxn', 1000), ('myr', 200), ('nok', 300), ('nzd', 50),
    ('pln', 200), ('ron', 200), ('sek', 300), ('sgd', 50), ('thb', 1000)) AS m (code, units)
 WHERE c.code = m.code;

\ir ../udfs/keep_user_currency/latest.sql

CREATE TRIGGER currencies_user_rows BEFORE INSERT OR UPDATE ON billguard.currencies
  FOR EACH ROW EXECUTE FUNCTION billguard.keep_user_currency();
-- The triggers of currencies and accounts fire whoever writes the row,
-- logical replication's apply worker too: it runs with
-- session_replication_role = replica, in which ordinary triggers do not.
ALTER TABLE billguard.currencies ENABLE ALWAYS TRIGGER currencies_user_rows;

CREATE TABLE billguard.accounts (
  customer_id     text PRIMARY KEY,
  stripe_customer text NOT NULL,
  -- NULL: usage-only, billed only for the periods that have a period amount.
  amount_cents    bigint,
  currency        text NOT NULL DEFAULT 'usd' REFERENCES billguard.currencies (code),
  payment_method  text,
  active          boolean NOT NULL DEFAULT true,
  created_at      timestamptz NOT NULL DEFAULT now(),
  updated_at      timestamptz NOT NULL DEFAULT now(),
  -- The Stripe Connect account its charges are made on (Stripe-Account);
  -- NULL: the platform's own account.
  stripe_account  text,
  -- Sent as application_fee_amount, the platform's part of each charge on
  -- the connected account.
  application_fee_cents bigint,
  -- No two ids that look alike (' cust_1' and 'cust_1' would be two
  -- customers billed twice): see sql/udfs/is_valid_customer_id/.
  CONSTRAINT accounts_customer_id_valid CHECK (billguard.is_valid_customer_id(customer_id)),
  CONSTRAINT accounts_stripe_customer_valid CHECK (stripe_customer ~ '^cus_[A-Za-z0-9_]{1,250}$'),
  CONSTRAINT accounts_amount_positive CHECK (amount_cents > 0),
  -- Stripe's largest charge: eight digits of the smallest currency unit.
  CONSTRAINT accounts_amount_within_stripe_max CHECK (amount_cents <= 99999999),
  CONSTRAINT accounts_payment_method_valid CHECK (payment_method ~ '^[a-z]+_[A-Za-z0-9_]{1,250}$'),
  CONSTRAINT accounts_stripe_account_valid CHECK (stripe_account ~ '^acct_[A-Za-z0-9]{1,250}$'),
  CONSTRAINT accounts_application_fee_valid CHECK (application_fee_cents BETWEEN 0 AND 99999999),
  -- An application fee goes to the platform from a connected account's charge.
  CONSTRAINT accounts_application_fee_needs_account CHECK (application_fee_cents IS NULL OR stripe_account IS NOT NULL)
);
COMMENT ON TABLE billguard.accounts IS 'Who is billed each period: one row per customer, billed its period amount, else amount_cents in currency (none when NULL).';

\ir ../udfs/touch_updated_at/latest.sql

CREATE TRIGGER accounts_updated_at BEFORE UPDATE ON billguard.accounts
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*)
  EXECUTE FUNCTION billguard.touch_updated_at();

\ir ../udfs/refuse_billed_account_change/latest.sql

CREATE TRIGGER accounts_keep_billed_ids BEFORE UPDATE OF customer_id OR DELETE ON billguard.accounts
  FOR EACH ROW EXECUTE FUNCTION billguard.refuse_billed_account_change();
CREATE TRIGGER accounts_keep_billed_rows BEFORE TRUNCATE ON billguard.accounts
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_billed_account_change();
-- Stripe scopes idempotency keys per account: a record in flight re-sent
-- on another account would be a second charge.
CREATE TRIGGER accounts_keep_connected_account BEFORE UPDATE OF stripe_account, application_fee_cents
  ON billguard.accounts
  FOR EACH ROW WHEN (OLD.stripe_account IS DISTINCT FROM NEW.stripe_account
                     OR OLD.application_fee_cents IS DISTINCT FROM NEW.application_fee_cents)
  EXECUTE FUNCTION billguard.refuse_billed_account_change();
-- accounts kept in sync by a subscription (a CRM publishing its customers):
-- a rename or delete at the source must be refused here too, or the next
-- bill_period charges the same customer again under the new id. The apply
-- worker then fails on that transaction and retries it: replication stalls
-- rather than billing twice (see docs/sql-api.md, accounts).
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_updated_at;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_keep_billed_ids;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_keep_billed_rows;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_keep_connected_account;
