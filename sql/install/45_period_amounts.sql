-- What each customer owes for a period, written by the application's own
-- metering before or while the period is billed: bill_period and
-- bill_customer charge it instead of the account's fixed amount. Once a
-- record claims it, it is frozen (refuse_frozen_period_amount). No foreign
-- key to accounts: metering may write a customer's amount before its
-- account exists (it is billed once the account is there and active), and
-- a key referenced from here would stop TRUNCATE, DELETE and a replicated
-- truncate of accounts with PostgreSQL's error instead of billguard's rules.

\ir ../udfs/is_stripe_metadata/latest.sql

CREATE TABLE billguard.period_amounts (
  customer_id    text NOT NULL,
  billing_period text NOT NULL,
  -- In the currency's minor units. Zero, or less than Stripe's minimum for
  -- the currency, is claimed as a below_minimum record and never sent.
  amount_cents   bigint NOT NULL,
  currency       text NOT NULL REFERENCES billguard.currencies (code),
  -- The charge's description at Stripe; NULL: billguard's own.
  description    text,
  -- Sent as the charge's metadata[key] = value, beside billguard's keys.
  metadata       jsonb NOT NULL DEFAULT '{}',
  created_at     timestamptz NOT NULL DEFAULT now(),
  updated_at     timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT period_amounts_pk PRIMARY KEY (customer_id, billing_period),
  CONSTRAINT period_amounts_customer_id_valid CHECK (billguard.is_valid_customer_id(customer_id)),
  CONSTRAINT period_amounts_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT period_amounts_amount_valid CHECK (amount_cents BETWEEN 0 AND 99999999),
  -- Stripe's limit, and nothing a terminal or a log would misread.
  CONSTRAINT period_amounts_description_valid CHECK (char_length(description) >= 1 AND char_length(description) <= 1000
                                                     AND description !~ '[[:cntrl:]]'),
  CONSTRAINT period_amounts_metadata_valid CHECK (billguard.is_stripe_metadata(metadata))
);
COMMENT ON TABLE billguard.period_amounts IS
  'What a customer owes for a billing period, charged instead of accounts.amount_cents; frozen once its record is claimed.';

\ir ../udfs/refuse_frozen_period_amount/latest.sql

-- bill_period reads one period's amounts, whatever the history holds.
CREATE INDEX period_amounts_period ON billguard.period_amounts (billing_period);
CREATE TRIGGER period_amounts_frozen BEFORE INSERT OR UPDATE OR DELETE ON billguard.period_amounts
  FOR EACH ROW EXECUTE FUNCTION billguard.refuse_frozen_period_amount();
CREATE TRIGGER period_amounts_updated_at BEFORE UPDATE ON billguard.period_amounts
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*)
  EXECUTE FUNCTION billguard.touch_updated_at();
-- TRUNCATE takes every row away from its record at once.
CREATE TRIGGER period_amounts_keep_rows BEFORE TRUNCATE ON billguard.period_amounts
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_frozen_period_amount();
ALTER TABLE billguard.period_amounts ENABLE ALWAYS TRIGGER period_amounts_frozen;
ALTER TABLE billguard.period_amounts ENABLE ALWAYS TRIGGER period_amounts_updated_at;
ALTER TABLE billguard.period_amounts ENABLE ALWAYS TRIGGER period_amounts_keep_rows;

-- What a claim charges.
\ir ../udfs/is_below_minimum/latest.sql
\ir ../udfs/below_minimum_event/latest.sql
\ir ../udfs/check_claim_isolation/latest.sql
\ir ../udfs/period_charge/latest.sql
