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

-- ==== Data that must never be lost or confused (issue 6, items 3, 7, 8, 9, 10, 11 accounts.updated_at, 19, 21) ====

-- The one definition of a valid customer id, for the CHECK on
-- billguard.accounts (extension/customer_id.cpp): 1..255 bytes, NFC, no
-- control character, and neither first nor last character blank or
-- invisible (White_Space, format characters, default-ignorables), so that no
-- two accounts can look alike. In a database whose encoding is not UTF8 an
-- id is printable ASCII.
CREATE FUNCTION billguard.is_valid_customer_id(customer_id text) RETURNS boolean
  LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_is_valid_customer_id';
COMMENT ON FUNCTION billguard.is_valid_customer_id(text) IS
  'True for 1..255 bytes in NFC without control characters that neither begin nor end with white space or an invisible character.';

-- Accounts that 0.2.0's rules refuse stop the update before anything
-- changes: amounts above Stripe's largest charge, and customer ids that are
-- not NFC or begin or end with a blank or invisible character (listed with
-- every character outside printable ASCII written as <U+XXXX>).
DO $$
DECLARE
  listed text;
BEGIN
  SELECT string_agg(format('%s (%s)', quote_literal(a.customer_id), a.amount_cents), ', '
                    ORDER BY a.customer_id)
    INTO listed
    FROM billguard.accounts a WHERE a.amount_cents > 99999999;
  IF listed IS NOT NULL THEN
    RAISE EXCEPTION 'billguard 0.2.0 caps accounts.amount_cents at 99999999, Stripe''s largest charge; these accounts exceed it: %',
                    listed
      USING ERRCODE = 'check_violation',
            HINT = 'Correct their amount_cents (UPDATE billguard.accounts), then run ALTER EXTENSION billguard UPDATE again.';
  END IF;
  SELECT string_agg(quote_literal(
           (SELECT string_agg(CASE WHEN c.ch ~ '^[!-~]$' THEN c.ch
                                   ELSE format('<U+%s>', upper(lpad(to_hex(ascii(c.ch)), 4, '0'))) END,
                              '' ORDER BY c.n)
              FROM regexp_split_to_table(a.customer_id, '') WITH ORDINALITY AS c (ch, n))),
           ', ' ORDER BY a.customer_id)
    INTO listed
    FROM billguard.accounts a WHERE NOT billguard.is_valid_customer_id(a.customer_id);
  IF listed IS NOT NULL THEN
    RAISE EXCEPTION 'billguard 0.2.0 refuses customer ids that are not NFC or begin or end with white space or an invisible character; these accounts have one: %',
                    listed
      USING ERRCODE = 'check_violation',
            HINT = 'Give them the id they show (UPDATE billguard.accounts SET customer_id = ...), or delete look-alike duplicates, then run ALTER EXTENSION billguard UPDATE again.';
  END IF;
END $$;

-- Item 3.
-- Only the retention function may delete events, and nothing may change
-- them. apply_retention is SECURITY DEFINER, so its DELETE runs as the
-- journal's owner, a role nobody but a superuser can become: that is the
-- guard, since any session can set any setting. The transaction-local
-- setting it raises keeps the owner's own stray DELETE out too.
CREATE OR REPLACE FUNCTION billguard.refuse_journal_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'DELETE' AND current_setting('billguard_internal.retention', true) = 'on'
     AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
    RETURN NULL;
  END IF;
  RAISE EXCEPTION 'billguard.journal is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege',
          HINT = 'Old events are removed only by billguard.apply_retention().';
END $$;

-- Item 10: rows of currencies that CREATE EXTENSION makes are not dumped;
-- rows users added or changed are.
ALTER TABLE billguard.currencies ADD COLUMN builtin boolean;
UPDATE billguard.currencies c SET builtin = (c.code, c.minor_units) IN (VALUES
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
  ('xpf', 0), ('yer', 2), ('zar', 2), ('zmw', 2), ('zwg', 2), ('zwl', 2)
);
ALTER TABLE billguard.currencies
  ALTER COLUMN builtin SET DEFAULT false,
  ALTER COLUMN builtin SET NOT NULL;

-- pg_dump carries the currencies users added and the built-in ones they
-- changed, which stop being built-in here. pg_restore runs CREATE EXTENSION
-- first: a dumped row for a built-in code then replaces the built-in values
-- instead of colliding with them (and taking every other dumped row down).
CREATE FUNCTION billguard.keep_user_currency() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    UPDATE billguard.currencies c SET minor_units = NEW.minor_units
     WHERE c.code = NEW.code AND c.builtin;
    IF FOUND THEN
      RETURN NULL;
    END IF;
    NEW.builtin := false;
  ELSE
    NEW.builtin := OLD.builtin AND NEW.code = OLD.code AND NEW.minor_units = OLD.minor_units;
  END IF;
  RETURN NEW;
END $$;

CREATE TRIGGER currencies_user_rows BEFORE INSERT OR UPDATE ON billguard.currencies
  FOR EACH ROW EXECUTE FUNCTION billguard.keep_user_currency();
SELECT pg_catalog.pg_extension_config_dump('billguard.currencies', 'WHERE NOT builtin');

-- Items 7, 8, 11, 21: accounts.
ALTER TABLE billguard.accounts
  DROP CONSTRAINT accounts_customer_id_valid,
  ADD CONSTRAINT accounts_customer_id_valid CHECK (billguard.is_valid_customer_id(customer_id)),
  ADD CONSTRAINT accounts_amount_within_stripe_max CHECK (amount_cents <= 99999999);

CREATE FUNCTION billguard.touch_updated_at() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  NEW.updated_at := now();
  RETURN NEW;
END $$;

CREATE TRIGGER accounts_updated_at BEFORE UPDATE ON billguard.accounts
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*)
  EXECUTE FUNCTION billguard.touch_updated_at();

-- Billing records name their account by customer_id alone (a foreign key
-- would tax every claim of bill_period). Once an account has records, a new
-- id for it, by UPDATE or by DELETE and INSERT, is a new customer to
-- bill_period, billed again for the periods it has already paid.
-- SECURITY DEFINER: whoever maintains accounts need not read billing_records.
CREATE FUNCTION billguard.refuse_billed_account_change() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  billed bigint;
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    SELECT count(*) INTO billed FROM billguard.accounts a
     WHERE EXISTS (SELECT FROM billguard.billing_records r WHERE r.customer_id = a.customer_id);
    IF billed > 0 THEN
      RAISE EXCEPTION 'billguard.accounts cannot be truncated: % accounts have billing records', billed
        USING ERRCODE = 'restrict_violation',
              HINT = 'Deactivate them instead: UPDATE billguard.accounts SET active = false.';
    END IF;
    RETURN NULL;
  END IF;
  IF TG_OP = 'UPDATE' AND NEW.customer_id = OLD.customer_id THEN
    RETURN NEW;
  END IF;
  IF EXISTS (SELECT FROM billguard.billing_records r WHERE r.customer_id = OLD.customer_id) THEN
    RAISE EXCEPTION 'account % has billing records: %', quote_literal(OLD.customer_id),
                    CASE TG_OP WHEN 'UPDATE' THEN 'its customer_id never changes'
                                              ELSE 'it is never deleted' END
      USING ERRCODE = 'restrict_violation',
            DETAIL = 'Under another id the same customer would be billed again for the periods already billed.',
            HINT = 'Deactivate it instead: UPDATE billguard.accounts SET active = false.';
  END IF;
  RETURN CASE TG_OP WHEN 'DELETE' THEN OLD ELSE NEW END;
END $$;

CREATE TRIGGER accounts_keep_billed_ids BEFORE UPDATE OF customer_id OR DELETE ON billguard.accounts
  FOR EACH ROW EXECUTE FUNCTION billguard.refuse_billed_account_change();
CREATE TRIGGER accounts_keep_billed_rows BEFORE TRUNCATE ON billguard.accounts
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_billed_account_change();

-- Item 19: the status 'cancelled'.
ALTER TABLE billguard.billing_records
  DROP CONSTRAINT billing_records_status_valid,
  ADD CONSTRAINT billing_records_status_valid CHECK (status IN
    ('pending', 'dispatching', 'completed', 'failed', 'blocked', 'needs_review', 'unknown',
     'cancelled'));

-- How a record's status reads to a caller of bill_customer.
CREATE OR REPLACE FUNCTION billguard.caller_status(record_status text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE record_status
    WHEN 'completed' THEN 'already_completed'
    WHEN 'failed' THEN 'failed'
    WHEN 'blocked' THEN 'blocked'
    WHEN 'cancelled' THEN 'cancelled'
    ELSE 'in_progress'   -- pending, dispatching, unknown, needs_review
  END;

-- One step of the fold. Pure: the same events always give the same state.
CREATE OR REPLACE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

-- Items 19 and 21: bill_period counts cancelled records, period_status sums
-- in numeric. New result types need DROP and CREATE: the old functions are
-- renamed first, so that the grants users gave on them (README, Privileges)
-- can be carried over to the new ones.
ALTER FUNCTION billguard.bill_period(text) RENAME TO bill_period_0_1_0;
ALTER FUNCTION billguard.claim_period(text) RENAME TO claim_period_0_1_0;
ALTER FUNCTION billguard.period_status(text) RENAME TO period_status_0_1_0;

CREATE FUNCTION billguard.claim_period(period text)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint,
                 cancelled bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  -- The anti-join below reads billing_records while the same statement
  -- inserts into it; planned as a nested loop over a seq scan (likely while
  -- the table is new and unanalysed) it would rescan the growing table per
  -- account. Hash and merge joins keep a large period linear.
  SET enable_nestloop = off
  AS $$
#variable_conflict use_column
DECLARE
  ns        text := billguard.key_namespace();
  scheduler_state jsonb;
BEGIN
  PERFORM billguard.check_billing_period(period);

  -- Claims of one period are serialised: bill_period holds the period's
  -- lock exclusively, bill_customer holds it shared. Once we have it, every
  -- earlier claim is committed and visible to the next statement, so a plain
  -- set-based INSERT of the accounts without a record claims each exactly
  -- once; no per-row speculative insertion, no row-order deadlocks.
  PERFORM pg_advisory_xact_lock(billguard.period_lock_class(), hashtext(period));
  BEGIN
    WITH claimed AS (
      INSERT INTO billguard.billing_records AS r
             (customer_id, billing_period, idempotency_key, amount_cents, currency,
              stripe_customer, payment_method)
      SELECT a.customer_id, period, billguard.idempotency_key(a.customer_id, period, ns),
             a.amount_cents, a.currency, a.stripe_customer, a.payment_method
        FROM billguard.accounts a
       WHERE a.active
         AND NOT EXISTS (SELECT FROM billguard.billing_records e
                          WHERE e.customer_id = a.customer_id AND e.billing_period = period)
      RETURNING r.customer_id, r.idempotency_key, r.amount_cents, r.currency, r.created_at
    ), journaled AS (
      INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
      SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
             billguard.billing_initiated_event(c.customer_id, period, c.idempotency_key,
                                               c.amount_cents, c.currency, c.created_at)
        FROM claimed c
      RETURNING 1
    )
    SELECT count(*) INTO initiated FROM journaled;
  EXCEPTION WHEN unique_violation THEN
    -- Only a REPEATABLE READ / SERIALIZABLE caller whose snapshot predates
    -- another claim gets here; nothing of this call is kept.
    RAISE EXCEPTION 'billing records of % were claimed concurrently; retry the transaction', period
      USING ERRCODE = 'serialization_failure';
  END;

  -- Every record of the period (others' claims committed before we took the
  -- lock), whatever its account has become since: period_status's counts.
  SELECT count(*) FILTER (WHERE r.status = 'completed'),
         count(*) FILTER (WHERE r.status IN ('pending', 'dispatching', 'unknown', 'needs_review')),
         count(*) FILTER (WHERE r.status IN ('failed', 'blocked')),
         count(*) FILTER (WHERE r.status = 'cancelled')
    INTO already_completed, in_progress, failed, cancelled
    FROM billguard.billing_records r
   WHERE r.billing_period = period;
  in_progress := in_progress - initiated;   -- our own claims are pending too

  -- The first time a period is billed, the scheduler entity records it.
  -- The advisory lock serialises appends to that one entity.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  scheduler_state := billguard.entity_state('billing-scheduler');
  IF NOT (scheduler_state -> 'issued_periods') ? period THEN
    PERFORM billguard.append_event('billing-scheduler', (scheduler_state ->> 'seq_nr')::bigint,
                                   'BillingTickIssued',
                                   jsonb_build_object('billing_period', period,
                                                      'issued_at', clock_timestamp()));
  END IF;

  IF initiated > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.bill_period(billing_period text)
  RETURNS TABLE (billing_period text, initiated bigint, already_completed bigint,
                 in_progress bigint, failed bigint, cancelled bigint)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT bill_period.billing_period, c.initiated, c.already_completed, c.in_progress, c.failed,
           c.cancelled
      FROM billguard.claim_period(bill_period.billing_period) c;
  END;
COMMENT ON FUNCTION billguard.bill_period(text) IS
  'Claims and queues one charge per active account for the period; idempotent and safe to run concurrently.';

CREATE FUNCTION billguard.period_status(billing_period text)
  RETURNS TABLE (status text, count bigint, amount_cents numeric)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM billguard.check_billing_period(period_status.billing_period);
  RETURN QUERY
    -- sum(bigint) is numeric: no total overflows, whatever amounts records
    -- claimed before amounts were capped hold.
    SELECT st.status, count(r.status), coalesce(sum(r.amount_cents), 0)
      FROM unnest(ARRAY['pending', 'dispatching', 'unknown', 'needs_review', 'completed',
                        'failed', 'blocked', 'cancelled']) WITH ORDINALITY AS st (status, position)
      LEFT JOIN billguard.billing_records r
        ON r.status = st.status AND r.billing_period = period_status.billing_period
     GROUP BY st.status, st.position
     ORDER BY st.position;
END $$;
COMMENT ON FUNCTION billguard.period_status(text) IS
  'One row per record status for the period: how many records, and their amount in minor units.';

REVOKE ALL ON FUNCTION billguard.claim_period(text), billguard.bill_period(text),
  billguard.period_status(text) FROM PUBLIC;

-- A GRANT in an extension script also records the grant among the
-- extension's initial privileges, which pg_dump leaves out as the
-- extension's own: after carrying users' grants over, the initial privileges
-- are set back to a fresh install's, so the grants stay users' and dumped.
DO $$
DECLARE
  replaced record;
  fresh aclitem[];
  grant_of record;
BEGIN
  FOR replaced IN
    SELECT old.oid AS old_oid, new.oid AS new_oid
      FROM unnest(ARRAY['bill_period', 'period_status']) AS f (name)
      JOIN pg_proc old ON old.pronamespace = 'billguard'::regnamespace AND old.proname = f.name || '_0_1_0'
      JOIN pg_proc new ON new.pronamespace = 'billguard'::regnamespace AND new.proname = f.name
  LOOP
    SELECT p.proacl INTO fresh FROM pg_proc p WHERE p.oid = replaced.new_oid;
    FOR grant_of IN
      SELECT pg_get_userbyid(a.grantee) AS grantee, a.is_grantable
        FROM pg_proc p, aclexplode(p.proacl) a
       WHERE p.oid = replaced.old_oid AND a.privilege_type = 'EXECUTE'
         AND a.grantee NOT IN (0, p.proowner)
    LOOP
      EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I%s', replaced.new_oid::regprocedure,
                     grant_of.grantee, CASE WHEN grant_of.is_grantable THEN ' WITH GRANT OPTION' END);
    END LOOP;
    UPDATE pg_init_privs i SET initprivs = fresh
     WHERE i.objoid = replaced.new_oid AND i.classoid = 'pg_proc'::regclass AND i.objsubid = 0;
  END LOOP;
END $$;
DROP FUNCTION billguard.bill_period_0_1_0(text), billguard.claim_period_0_1_0(text),
  billguard.period_status_0_1_0(text);

-- Withdrawing a billing that was never sent: by an operator (cancel_record)
-- or because its account was deactivated. Only a record no dispatcher ever
-- claimed is provably unsent; one that was claimed may have charged the
-- customer already, and must reach its outcome. The dispatcher claims only
-- pending, dispatching and unknown records, so a cancelled one is never sent.

-- Cancels the never-sent records of customer_id (of one period, or of every
-- period when billing_period is NULL), each with a BillingCancelled event;
-- returns how many. The UPDATE locks each row: a record a dispatcher is
-- claiming at this moment is read again once that claim commits, and then
-- no longer matches.
CREATE FUNCTION billguard.cancel_unsent(customer_id text, billing_period text, reason text)
  RETURNS bigint
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec record;
  cancelled bigint := 0;
BEGIN
  FOR rec IN
    UPDATE billguard.billing_records r SET status = 'cancelled', updated_at = now()
     WHERE r.customer_id = cancel_unsent.customer_id
       AND (cancel_unsent.billing_period IS NULL OR r.billing_period = cancel_unsent.billing_period)
       AND r.status = 'pending' AND r.first_dispatched_at IS NULL
    RETURNING r.customer_id, r.billing_period
  LOOP
    PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCancelled',
      jsonb_build_object('previous_status', 'pending', 'reason', reason, 'by', session_user));
    cancelled := cancelled + 1;
  END LOOP;
  RETURN cancelled;
END $$;

-- Cancels the record of (customer_id, billing_period) if it was never sent;
-- cancelling a cancelled record again changes nothing. Wakes nothing.
CREATE FUNCTION billguard.cancel_record(customer_id text, billing_period text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  rec billguard.billing_records;
BEGIN
  PERFORM billguard.check_billing_period(cancel_record.billing_period);
  SELECT * INTO rec FROM billguard.billing_records r
   WHERE r.customer_id = cancel_record.customer_id AND r.billing_period = cancel_record.billing_period
     FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record for % in %', quote_literal(left(cancel_record.customer_id, 64)),
                    cancel_record.billing_period
      USING ERRCODE = 'no_data_found';
  END IF;
  IF rec.status = 'cancelled' THEN
    RETURN 'cancelled';
  END IF;
  IF rec.status <> 'pending' OR rec.first_dispatched_at IS NOT NULL THEN
    RAISE EXCEPTION 'billing record %/% cannot be cancelled: it is %, so it may already have charged the customer',
                    rec.customer_id, rec.billing_period,
                    rec.status || coalesce(' and was first sent to Stripe at ' || rec.first_dispatched_at, '')
      USING ERRCODE = 'invalid_parameter_value',
            HINT = 'Only a record that was never sent can be cancelled. Let this one reach its '
                   'outcome, and refund a completed charge in Stripe.';
  END IF;
  PERFORM billguard.cancel_unsent(rec.customer_id, rec.billing_period, 'cancel_record');
  RETURN 'cancelled';
END $$;
COMMENT ON FUNCTION billguard.cancel_record(text, text) IS
  'Cancels a billing record that was never sent to Stripe; refuses one that may have been (22023).';

-- Deactivating an account withdraws its billings that were never sent.
-- SECURITY DEFINER: whoever maintains accounts need not write billing_records.
CREATE FUNCTION billguard.cancel_unsent_of_deactivated() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.cancel_unsent(NEW.customer_id, NULL, 'account deactivated');
  RETURN NULL;
END $$;

CREATE TRIGGER accounts_deactivated AFTER UPDATE OF active ON billguard.accounts
  FOR EACH ROW WHEN (OLD.active AND NOT NEW.active)
  EXECUTE FUNCTION billguard.cancel_unsent_of_deactivated();

-- The billing history outlives billguard: dropping the extension would drop
-- billing_records and the journal with it, and a billguard installed again
-- would claim, and charge, periods already billed.

-- Refuses DROP EXTENSION billguard, DROP SCHEMA billguard and DROP OWNED BY
-- their owner while billing_records holds rows (extension/history_guard.cpp).
CREATE FUNCTION billguard.protect_history() RETURNS event_trigger
  LANGUAGE c
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_protect_history';

CREATE EVENT TRIGGER billguard_protect_history ON ddl_command_start
  WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
  EXECUTE FUNCTION billguard.protect_history();

-- Retiring billguard and keeping its history: every table that holds users'
-- data (the tables pg_dump carries) leaves the extension for archive_schema,
-- read-only, and DROP EXTENSION billguard is then allowed. Refused while a
-- record may still be sent (pending, dispatching, unknown): let those settle,
-- or cancel the never-sent ones, first. Only the extension's owner can run it.
CREATE FUNCTION billguard.archive_history(archive_schema text)
  RETURNS TABLE (archived_table text, row_count bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  extension oid := (SELECT e.oid FROM pg_extension e WHERE e.extname = 'billguard');
  history regclass[] := (SELECT e.extconfig FROM pg_extension e WHERE e.oid = extension);
  unsettled bigint;
  dependent record;
  history_table regclass;
BEGIN
  IF archive_schema IS NULL OR archive_schema IN ('', 'billguard') THEN
    RAISE EXCEPTION 'archive_schema must name a schema other than billguard'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Nothing claims or records while the tables move.
  EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', array_to_string(history, ', '));
  SELECT count(*) INTO unsettled FROM billguard.billing_records r
   WHERE r.status IN ('pending', 'dispatching', 'unknown');
  IF unsettled > 0 THEN
    RAISE EXCEPTION '% billing records may still be sent to Stripe (pending, dispatching or unknown)',
                    unsettled
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Let the dispatcher settle them, or cancel the never-sent ones with '
                   'billguard.cancel_record(), then archive.';
  END IF;

  EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', archive_schema);
  EXECUTE format($f$
    CREATE FUNCTION %I.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
      RAISE EXCEPTION '%%.%% is archived billing history: %% refused', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
    END $body$ $f$, archive_schema);

  -- Triggers and CHECK constraints that call the extension's functions would
  -- keep DROP EXTENSION from dropping those; the archive is read-only instead.
  FOR dependent IN
    SELECT DISTINCT coalesce(t.tgrelid, c.conrelid)::regclass AS history_table,
                    coalesce(t.tgname, c.conname) AS name, t.oid IS NOT NULL AS is_trigger
      FROM pg_depend d
      JOIN pg_depend member ON member.classid = 'pg_proc'::regclass AND member.objid = d.refobjid
                           AND member.refclassid = 'pg_extension'::regclass
                           AND member.refobjid = extension AND member.deptype = 'e'
      LEFT JOIN pg_trigger t ON d.classid = 'pg_trigger'::regclass AND t.oid = d.objid
      LEFT JOIN pg_constraint c ON d.classid = 'pg_constraint'::regclass AND c.oid = d.objid
     WHERE d.refclassid = 'pg_proc'::regclass AND coalesce(t.tgrelid, c.conrelid) = ANY (history)
  LOOP
    EXECUTE CASE WHEN dependent.is_trigger
                 THEN format('DROP TRIGGER %I ON %s', dependent.name, dependent.history_table)
                 ELSE format('ALTER TABLE %s DROP CONSTRAINT %I', dependent.history_table, dependent.name)
            END;
  END LOOP;

  FOREACH history_table IN ARRAY history LOOP
    EXECUTE format('ALTER EXTENSION billguard DROP TABLE %s', history_table);
    EXECUTE format('ALTER TABLE %s SET SCHEMA %I', history_table, archive_schema);
    EXECUTE format('CREATE TRIGGER archived_read_only BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                   'ON %s FOR EACH STATEMENT EXECUTE FUNCTION %I.refuse_change()',
                   history_table, archive_schema);
    archived_table := history_table::text;
    EXECUTE format('SELECT count(*) FROM %s', history_table) INTO row_count;
    RETURN NEXT;
  END LOOP;
END $$;
COMMENT ON FUNCTION billguard.archive_history(text) IS
  'Moves the billing history out of the extension into archive_schema, read-only; DROP EXTENSION billguard is then allowed.';

REVOKE ALL ON FUNCTION billguard.is_valid_customer_id(text), billguard.keep_user_currency(),
  billguard.touch_updated_at(), billguard.refuse_billed_account_change(),
  billguard.cancel_unsent(text, text, text), billguard.cancel_record(text, text),
  billguard.cancel_unsent_of_deactivated(), billguard.protect_history(),
  billguard.archive_history(text) FROM PUBLIC;

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

-- ==== The spend-cap ledger (issue 8) ====

-- The spend-cap ledger of billguard-proxy (worker/): budgets, vault keys,
-- reservations and the audit trail. Each decision of the proxy is one call
-- of a function below (81_vault_keys.sql, 82_vault_decisions.sql), so it is
-- atomic and survives a proxy crash. A period's cap belongs to its budget,
-- never to a key: a key issued again for the period (after a crash lost the
-- first answer) joins the budget, and so can never double the cap.

-- Secrets and public ids of vault keys (extension/random_text.cpp).
CREATE FUNCTION billguard.random_base62(length integer) RETURNS text
  LANGUAGE c VOLATILE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_random_base62';

-- A USD amount in cents, exactly (numeric, never floating point); 22023
-- unless it is positive whole cents within 10^15 cents, which keeps every
-- sum of a budget within bigint.
CREATE FUNCTION billguard.usd_to_cents(usd numeric) RETURNS bigint
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF usd IS NULL OR usd <= 0 OR usd * 100 <> trunc(usd * 100) OR usd * 100 > 1e15 THEN
    RAISE EXCEPTION 'period_usd_cap must be a positive amount of whole cents up to 10000000000000, got %',
                    coalesce(usd::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN (usd * 100)::bigint;
END $$;

-- What a vault key may call: 1..20 Stripe API paths such as
-- /v1/payment_intents (a key for it also reaches /v1/payment_intents/<id>
-- and /v1/payment_intents/search).
CREATE FUNCTION billguard.are_vault_endpoints(endpoints text[]) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN coalesce(cardinality(endpoints) BETWEEN 1 AND 20
                  AND array_position(endpoints, NULL) IS NULL
                  AND array_to_string(endpoints, ' ') ~ '^(/v1(/[a-z_]+)+)( /v1(/[a-z_]+)+)*$', false);

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
  PRIMARY KEY (vendor, billing_period, currency),
  CONSTRAINT vault_budgets_vendor_valid CHECK (vendor ~ '^[a-z][a-z0-9_]{0,39}$'),
  CONSTRAINT vault_budgets_period_valid CHECK (billguard.is_billing_period(billing_period)),
  CONSTRAINT vault_budgets_cap_valid CHECK (cap_cents > 0 AND cap_cents <= 1000000000000000),
  CONSTRAINT vault_budgets_committed_valid CHECK (committed_cents >= 0)
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

-- One reservation per (budget, Idempotency-Key): every request carrying the
-- key, through any key of the budget, shares it, so a retry is counted once.
-- reserved: counted against the cap, outcome unknown or in flight;
-- settled: a success, still counted, its answer kept to be replayed for ever;
-- released: refused by Stripe, no longer counted.
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
  reserved_at         timestamptz NOT NULL DEFAULT now(),
  settled_at          timestamptz,
  PRIMARY KEY (vendor, billing_period, currency, idempotency_key),
  FOREIGN KEY (vendor, billing_period, currency) REFERENCES billguard.vault_budgets,
  CONSTRAINT vault_reservations_status_valid CHECK (status IN ('reserved', 'settled', 'released')),
  CONSTRAINT vault_reservations_amount_positive CHECK (amount_cents > 0),
  CONSTRAINT vault_reservations_settled_answer CHECK (status <> 'settled' OR response_body IS NOT NULL)
);
COMMENT ON TABLE billguard.vault_reservations IS
  'Amounts reserved against a budget per Idempotency-Key, and the answers of settled successes.';

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
  CONSTRAINT vault_audit_decision_valid CHECK (decision IN (
    'forwarded', 'reserved', 'reused', 'replayed', 'refused',   -- vault_authorize
    'settled', 'released', 'unknown',                           -- vault_settle
    'issued', 'revoked', 'cap_raised'))                         -- keys and caps
);
COMMENT ON TABLE billguard.vault_audit IS
  'Every decision of the spend-cap proxy: time, key, period, request, decision, HTTP status, reason.';

CREATE FUNCTION billguard.refuse_vault_audit_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  RAISE EXCEPTION 'billguard.vault_audit is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER vault_audit_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON billguard.vault_audit
  FOR EACH STATEMENT EXECUTE FUNCTION billguard.refuse_vault_audit_change();

-- Spend against cap per budget. settled + reserved = committed in every
-- snapshot, as each decision changes a reservation and the committed sum
-- in one transaction.
CREATE VIEW billguard.vault_spend AS
  SELECT b.vendor, b.billing_period, b.currency, b.cap_cents,
         b.committed_cents - r.reserved_cents AS settled_cents, r.reserved_cents,
         b.cap_cents - b.committed_cents AS remaining_cents,
         (SELECT count(*) FROM billguard.vault_keys k
           WHERE (k.vendor, k.billing_period, k.currency) = (b.vendor, b.billing_period, b.currency)
             AND k.revoked_at IS NULL AND k.expires_at > now()) AS usable_keys,
         b.committed_cents
    FROM billguard.vault_budgets b,
         LATERAL (SELECT coalesce(sum(v.amount_cents), 0)::bigint AS reserved_cents
                    FROM billguard.vault_reservations v
                   WHERE (v.vendor, v.billing_period, v.currency) = (b.vendor, b.billing_period, b.currency)
                     AND v.status = 'reserved') r;

-- pg_dump carries the ledger with its rows: a restored database must still
-- know what each period has spent and which answers it replays.
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_budgets', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_keys', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_reservations', '');
SELECT pg_catalog.pg_extension_config_dump('billguard.vault_audit', '');

-- Vault keys: issuing one (joining its period's budget), reading its budget,
-- revoking it, and raising a budget's cap (the proxy's admin only).

-- The work of issue_vault_key(); PL/pgSQL cannot name an input and an
-- output column alike, as issue_vault_key's public signature does.
CREATE FUNCTION billguard.vault_issue_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean)
  RETURNS TABLE (secret text, new_key_id text, cap_cents bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  cap     bigint := billguard.usd_to_cents(period_usd_cap);
  budget  billguard.vault_budgets;
BEGIN
  IF vendor IS NULL OR vendor !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION 'vendor must be 1..40 lower-case letters, digits or _ (e.g. stripe), got %',
                    coalesce(quote_literal(left(vendor, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(billing_period);
  IF NOT billguard.are_vault_endpoints(allowed_endpoints) THEN
    RAISE EXCEPTION 'allowed_endpoints must be 1..20 API paths such as /v1/payment_intents, got %',
                    coalesce(left(allowed_endpoints::text, 200), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF expires_at IS NULL OR expires_at <= now() THEN
    RAISE EXCEPTION 'expires_at must be in the future, got %', coalesce(expires_at::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF livemode IS NULL THEN
    RAISE EXCEPTION 'livemode must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  INSERT INTO billguard.vault_budgets AS b (vendor, billing_period, currency, cap_cents)
  VALUES (vendor, billing_period, 'usd', cap)
  ON CONFLICT DO NOTHING;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency)
       = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')
     FOR UPDATE;
  IF budget.cap_cents <> cap THEN
    RAISE EXCEPTION 'billing_period % of % already has a cap of % USD', billing_period, vendor,
                    to_char(budget.cap_cents / 100.0, 'FM999999999999990.00')
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A second key of a period joins its budget and never changes its cap.',
            HINT = 'Ask with the same period_usd_cap, or have an admin raise the cap.';
  END IF;

  secret := CASE WHEN livemode THEN 'vk_live_' ELSE 'vk_test_' END || billguard.random_base62(32);
  new_key_id := 'vkey_' || billguard.random_base62(16);
  cap_cents := cap;
  INSERT INTO billguard.vault_keys (key_id, secret_sha256, vendor, billing_period, currency,
                                    allowed_endpoints, livemode, expires_at)
  VALUES (new_key_id, sha256(convert_to(secret, 'UTF8')), vendor, billing_period, 'usd',
          allowed_endpoints, livemode, expires_at);

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (new_key_id, vendor, billing_period, 'usd', 'issued',
          format('cap %s USD, endpoints %s, expires %s',
                 to_char(cap / 100.0, 'FM999999999999990.00'),
                 array_to_string(allowed_endpoints, ' '), expires_at));

  -- The scheduler entity records every key issued; the advisory lock
  -- serialises appends to it, as bill_period's do.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'VaultKeyIssued',
                                 jsonb_build_object('billing_period', billing_period,
                                                    'key_id', new_key_id,
                                                    'cap_usd', round(cap / 100.0, 2),
                                                    'vendor', vendor));
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.issue_vault_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean DEFAULT true)
  RETURNS TABLE (vault_key text, key_id text, cap_usd numeric, vendor text)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT k.secret, k.new_key_id, round(k.cap_cents / 100.0, 2), issue_vault_key.vendor
      FROM billguard.vault_issue_key(issue_vault_key.vendor, issue_vault_key.billing_period,
                                     issue_vault_key.period_usd_cap, issue_vault_key.allowed_endpoints,
                                     issue_vault_key.expires_at, issue_vault_key.livemode) k;
  END;
COMMENT ON FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean) IS
  'A new vault key (vk_live_/vk_test_ + 32 base62, returned once) spending the period''s budget; 23505 when the budget has another cap.';

-- A key and its budget, for the proxy's admin.
CREATE FUNCTION billguard.vault_key_status(key_id text)
  RETURNS TABLE (vendor text, billing_period text, currency text, cap_usd numeric,
                 cap_cents bigint, settled_cents bigint, reserved_cents bigint,
                 remaining_cents bigint, allowed_endpoints text[], livemode boolean,
                 expires_at timestamptz, revoked_at timestamptz, created_at timestamptz)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
    SELECT k.vendor, k.billing_period, k.currency, round(b.cap_cents / 100.0, 2), b.cap_cents,
           b.settled_cents, b.reserved_cents, b.cap_cents - b.settled_cents - b.reserved_cents,
           k.allowed_endpoints, k.livemode, k.expires_at, k.revoked_at, k.created_at
      FROM billguard.vault_keys k
      JOIN billguard.vault_budgets b USING (vendor, billing_period, currency)
     WHERE k.key_id = vault_key_status.key_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(vault_key_status.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
END $$;

-- Revokes a key: its very next request is refused (401). Revoking again
-- changes nothing and answers the first revocation's time.
CREATE FUNCTION billguard.revoke_vault_key(key_id text) RETURNS timestamptz
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k billguard.vault_keys;
BEGIN
  UPDATE billguard.vault_keys v SET revoked_at = coalesce(v.revoked_at, now())
   WHERE v.key_id = revoke_vault_key.key_id
  RETURNING * INTO k;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(revoke_vault_key.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (k.key_id, k.vendor, k.billing_period, k.currency, 'revoked',
          format('revoked at %s', k.revoked_at));
  RETURN k.revoked_at;
END $$;

-- Raises the cap of the budget a key spends. A cap is never lowered below
-- what it is (22023): revoke keys instead.
CREATE FUNCTION billguard.raise_vault_cap(key_id text, period_usd_cap numeric) RETURNS numeric
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  cap    bigint := billguard.usd_to_cents(period_usd_cap);
  k      billguard.vault_keys;
  budget billguard.vault_budgets;
BEGIN
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = raise_vault_cap.key_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(raise_vault_cap.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
     FOR UPDATE;
  IF cap < budget.cap_cents THEN
    RAISE EXCEPTION 'a cap is only ever raised: billing_period % has % USD, asked %',
                    k.billing_period, to_char(budget.cap_cents / 100.0, 'FM999999999999990.00'),
                    period_usd_cap
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF cap > budget.cap_cents THEN
    UPDATE billguard.vault_budgets b SET cap_cents = cap, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
    INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
    VALUES (k.key_id, k.vendor, k.billing_period, k.currency, 'cap_raised',
            format('cap raised from %s to %s USD', to_char(budget.cap_cents / 100.0, 'FM999999999999990.00'),
                   to_char(cap / 100.0, 'FM999999999999990.00')));
  END IF;
  RETURN round(cap / 100.0, 2);
END $$;

-- The proxy's two decisions per forwarded request: vault_authorize before
-- it forwards (may this key make this call, and does the budget have room),
-- vault_settle after Stripe answered. Both take the budget's row lock, so
-- every decision of one budget is serialised: no concurrency overspends a
-- cap, and a retry is counted once. Each writes one vault_audit row.

-- Refusal bodies as Stripe shapes its errors, so every Stripe client
-- surfaces them as Stripe errors.
CREATE FUNCTION billguard.stripe_error_body(error_type text, code text, message text) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN jsonb_build_object('error', jsonb_strip_nulls(jsonb_build_object(
           'type', error_type, 'code', code, 'message', message)))::text;

-- secret_sha256: SHA-256 of the vault key the caller presented (the proxy
-- never passes the secret). request_digest: SHA-256 (hex) of the method,
-- path and parameters. amount_cents NULL: a request that moves no money
-- (reads, search), allowed by scope alone and never counted.
-- Answers decision: forwarded (not counted), reserved (counted now), reused
-- (the key's reservation, counted once already), replayed (a settled
-- success: answer with http_status and body, and forward nothing) or refused
-- (answer with http_status and body). key_id names the key for vault_settle.
CREATE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  amount    bigint := vault_authorize.amount_cents;
  idem      text := vault_authorize.idempotency_key;
  k         billguard.vault_keys;
  budget    billguard.vault_budgets;
  held      billguard.vault_reservations;
  known_key boolean;   -- a reservation exists for the Idempotency-Key
  verdict   text;
  status    integer;
  error_type text := 'invalid_request_error';
  code      text;
  reason    text;
  answer    text;
  replay_request_id text;
BEGIN
  IF octet_length(vault_authorize.secret_sha256) IS DISTINCT FROM 32 THEN
    RAISE EXCEPTION 'secret_sha256 must be 32 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.method IS NULL OR vault_authorize.method !~ '^[A-Z]{1,16}$' THEN
    RAISE EXCEPTION 'method must be an HTTP method in upper case' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.endpoint IS NULL OR vault_authorize.endpoint !~ '^/v1(/[A-Za-z0-9_]+)+$' THEN
    RAISE EXCEPTION 'endpoint must be an API path such as /v1/payment_intents, got %',
                    coalesce(quote_literal(left(vault_authorize.endpoint, 80)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.request_digest IS NULL OR vault_authorize.request_digest !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'request_digest must be 64 lower-case hex characters' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(idem) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'idempotency_key must be 1..255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount NOT BETWEEN 1 AND 99999999 THEN
    RAISE EXCEPTION 'amount must be a positive integer of at most 99999999, got %', amount
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.customer) > 255 OR octet_length(vault_authorize.currency) > 16 THEN
    RAISE EXCEPTION 'customer or currency too long' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  <<decide>>
  BEGIN
    SELECT * INTO k FROM billguard.vault_keys v WHERE v.secret_sha256 = vault_authorize.secret_sha256;
    IF NOT FOUND THEN
      status := 401; code := 'vault_key_unknown'; reason := 'unknown vault key';
      EXIT decide;
    ELSIF k.revoked_at IS NOT NULL THEN
      status := 401; code := 'vault_key_revoked'; reason := format('vault key %s was revoked', k.key_id);
      EXIT decide;
    ELSIF k.expires_at <= now() THEN
      status := 401; code := 'vault_key_expired'; reason := format('vault key %s expired', k.key_id);
      EXIT decide;
    END IF;
    IF vault_authorize.method NOT IN ('GET', 'POST')
       OR NOT EXISTS (SELECT FROM unnest(k.allowed_endpoints) e
                       WHERE vault_authorize.endpoint = e OR starts_with(vault_authorize.endpoint, e || '/')) THEN
      status := 403; code := 'endpoint_not_allowed';
      reason := format('vault key %s may call GET and POST on %s only, not %s %s', k.key_id,
                       array_to_string(k.allowed_endpoints, ', '), vault_authorize.method,
                       vault_authorize.endpoint);
      EXIT decide;
    END IF;
    IF amount IS NULL THEN
      verdict := 'forwarded';
      EXIT decide;
    END IF;
    IF vault_authorize.currency IS NULL THEN
      status := 400; code := 'parameter_missing'; reason := 'Missing required param: currency.';
      EXIT decide;
    ELSIF lower(vault_authorize.currency) <> k.currency THEN
      status := 403; code := 'currency_not_allowed';
      reason := format('the budget of vault key %s is in %s, not %s', k.key_id, k.currency,
                       lower(vault_authorize.currency));
      EXIT decide;
    END IF;
    IF idem IS NULL THEN
      -- Without a key a retry is a second charge, which the cap exists to stop.
      status := 400; code := 'idempotency_key_required';
      reason := 'a request with an amount needs an Idempotency-Key';
      EXIT decide;
    END IF;

    -- The one row lock of the decision.
    SELECT * INTO STRICT budget FROM billguard.vault_budgets b
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
       FOR UPDATE;
    SELECT * INTO held FROM billguard.vault_reservations r
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, idem);
    known_key := FOUND;
    IF known_key AND held.request_digest <> vault_authorize.request_digest THEN
      status := 400; error_type := 'idempotency_error'; code := NULL;
      reason := format('Keys for idempotent requests can only be used with the same parameters they '
                       'were first used with. Try using a key other than ''%s'' if you meant to '
                       'execute a different request.', idem);
      EXIT decide;
    ELSIF known_key AND held.status = 'settled' THEN
      verdict := 'replayed'; status := held.response_status; answer := held.response_body;
      replay_request_id := held.response_request_id;
      reason := format('settled as %s at %s', held.charge_id, held.settled_at);
      EXIT decide;
    ELSIF known_key AND held.status = 'reserved' THEN
      verdict := 'reused';
      EXIT decide;
    END IF;
    IF budget.settled_cents + budget.reserved_cents + amount > budget.cap_cents THEN
      status := 429; code := 'spend_cap_exceeded';
      reason := format('spend cap exceeded for billing_period %s', k.billing_period);
      EXIT decide;
    END IF;
    IF known_key THEN   -- released earlier: counted again while it is retried
      UPDATE billguard.vault_reservations r SET status = 'reserved', key_id = k.key_id
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem);
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount);
    END IF;
    UPDATE billguard.vault_budgets b SET reserved_cents = b.reserved_cents + amount, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';

-- Stripe's answer to a request vault_authorize reserved or reused.
-- 2xx: settled, its answer kept for replays. 402, or 400/404 of type
-- invalid_request_error: Stripe refused it, released. Anything else (500,
-- 409, 429, timeouts and dropped connections as upstream_status 0): the
-- outcome is unknown, and the amount stays reserved until a later request
-- with the same Idempotency-Key settles it. Answers settled, released or unknown.
CREATE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k       billguard.vault_keys;
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = vault_settle.key_id;
  PERFORM FROM billguard.vault_budgets b
    WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
      FOR UPDATE;
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(vault_settle.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(vault_settle.idempotency_key, 255)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;

  outcome := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'settled' AND held.status <> 'settled' THEN
    -- A success after a release (Stripe answering a key it refused before)
    -- is still money spent: it is counted, whatever the cap says.
    UPDATE billguard.vault_budgets b
       SET settled_cents = b.settled_cents + held.amount_cents,
           reserved_cents = b.reserved_cents
                            - CASE held.status WHEN 'reserved' THEN held.amount_cents ELSE 0 END,
           updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = vault_settle.upstream_status,
           charge_id = vault_settle.charge_id, response_status = vault_settle.upstream_status,
           response_body = coalesce(vault_settle.response_body, ''),
           response_request_id = vault_settle.request_id, settled_at = now()
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_budgets b
       SET reserved_cents = b.reserved_cents - held.amount_cents, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
    UPDATE billguard.vault_reservations r
       SET status = 'released', upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r SET upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_settle.key_id, k.vendor, k.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, k.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text) IS
  'Records Stripe''s answer to a reserved request: settled, released or unknown (still reserved); audited.';

REVOKE ALL ON FUNCTION billguard.random_base62(integer), billguard.usd_to_cents(numeric),
  billguard.are_vault_endpoints(text[]), billguard.refuse_vault_audit_change(),
  billguard.vault_issue_key(text, text, numeric, text[], timestamptz, boolean),
  billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean),
  billguard.vault_key_status(text), billguard.revoke_vault_key(text),
  billguard.raise_vault_cap(text, numeric), billguard.stripe_error_body(text, text, text),
  billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text),
  billguard.vault_settle(text, text, integer, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON TABLE billguard.vault_budgets, billguard.vault_keys, billguard.vault_reservations,
  billguard.vault_audit, billguard.vault_spend FROM PUBLIC;

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
-- Only the functions this section creates: a REVOKE on every function would
-- record the grants users hold on the others (bill_period, say) as the
-- extension's own initial privileges, and pg_dump would then leave them out.
REVOKE ALL ON FUNCTION
  billguard.charge_request_body(text, text, text, text, bigint, text, text, text),
  billguard.claim_due_records(integer, interval, interval, text),
  billguard.missed_attempt(text, integer),
  billguard.record_charge_response(text, integer, text, integer, text, boolean, text, text, text,
                                   text, text, text, interval),
  billguard.record_search_result(text, integer, text, integer, text, text, text),
  billguard.requeue_record(billguard.billing_records),
  billguard.retry_period(text, text)
FROM PUBLIC;

-- ==== Dispatch storage and WAL (issue 6, item 23) ====

-- The dispatch queue is keyed and filtered on next_attempt_at alone: a claim
-- leaves it as it is (the lease is lease_expires_at) and so is a HOT update,
-- and a settled record (completed, failed, needs_review, cancelled) has none.
-- The records 0.1.0 settled leave the queue here, each rewritten once.
DROP INDEX billguard.billing_records_due;
ALTER TABLE billguard.billing_records ALTER COLUMN next_attempt_at DROP NOT NULL;
UPDATE billguard.billing_records SET next_attempt_at = NULL
 WHERE status NOT IN ('pending', 'dispatching', 'unknown');
CREATE INDEX billing_records_due ON billguard.billing_records (next_attempt_at)
  WHERE next_attempt_at IS NOT NULL;
-- Room on each page for a record's claim and answer to stay on it.
ALTER TABLE billguard.billing_records SET (fillfactor = 50);

CREATE OR REPLACE FUNCTION billguard.requeue_abandoned() RETURNS bigint
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  AS $$
  WITH requeued AS (
    UPDATE billguard.billing_records
       SET next_attempt_at = now(), lease_expires_at = NULL, updated_at = now()
     WHERE status = 'dispatching' AND next_attempt_at IS NOT NULL
    RETURNING 1)
  SELECT count(*) FROM requeued;
$$;

CREATE OR REPLACE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text)
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
    SELECT r.idempotency_key, r.status, r.created_at, r.first_dispatched_at
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

-- Records a batch of answers the dispatcher read and judged
-- (common/stripe_response.cpp), in one statement: answers is a JSON array of
-- {key, attempt, search, outcome, http_status, charge_id, replayed,
-- request_id, error_type, error_code, decline_code, message, body_excerpt}.
-- What each outcome does to its record, and the event it journals (every
-- event that records an answer carries Stripe's Request-Id, what Stripe
-- support asks for):
--   an answer to a charge:
--     completed     charged: charge_id                      BillingCompleted
--     failed        not charged (a decline, a 4xx)           BillingFailed, terminal
--     retry         again after retry_delay(attempt)         BillingFailed, not terminal
--     throttled     a 429 or 409: the same, backoff capped at a minute
--     unknown       a cached 500: search after settle_delay  ChargeUnknown
--     needs_review  a person must look; never re-sent        NeedsReview
--     paused        the API key was refused: not counted     -
--     not_sent      never left: not counted, due again (the
--                   dispatcher holds off while Stripe is
--                   unreachable)                             ChargeNotSent
--   an answer to a search for the record's charge:
--     completed     found charged: charge_id                 ChargeReconciled
--     absent        not found: nothing changes, the dispatcher sends the
--                   charge now with the same key and lease
--     retry         the search told nothing: unknown, again after retry_delay
--     paused        the API key was refused: unknown, not counted
--     not_sent      never left: the same
-- A settled record (completed, failed, needs_review) leaves the dispatch
-- queue: its next_attempt_at becomes NULL. One result per answer, in
-- order: 'recorded', or 'stale' when the record is no longer that attempt's
-- (its lease was taken over, an operator requeued it: a late answer must not
-- overwrite a newer state), or 'locked' when another session holds its row:
-- the dispatcher never waits for a row, so one held lock cannot halt all
-- billing (see missed_attempt). Rows are found by their primary key alone,
-- the one plan whatever the statistics say (after a crash they say the
-- table is empty): the planner is held to index lookups in nested loops.
CREATE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
  RETURNS TABLE (recorded text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
DECLARE
  unknown_outcome text;
BEGIN
  SELECT a.search || '/' || a.outcome INTO unknown_outcome
    FROM jsonb_to_recordset(answers) AS a(search boolean, outcome text)
   WHERE NOT coalesce(a.search IS NOT NULL AND a.outcome IN ('completed', 'retry', 'paused', 'not_sent')
                       OR a.search = false AND a.outcome IN ('failed', 'throttled', 'unknown', 'needs_review')
                       OR a.search AND a.outcome = 'absent', false)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no such outcome of an answer (search/outcome): %', unknown_outcome
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH answer AS (
    SELECT *
      FROM ROWS FROM (jsonb_to_recordset(answers) AS (
             key text, attempt integer, search boolean, outcome text, http_status integer,
             charge_id text, replayed boolean, request_id text, error_type text, error_code text,
             decline_code text, message text, body_excerpt text))
           WITH ORDINALITY AS a(key, attempt, search, outcome, http_status, charge_id, replayed,
                                request_id, error_type, error_code, decline_code, message,
                                body_excerpt, position)
  ), locked AS (
    SELECT r.idempotency_key, r.customer_id, r.billing_period, r.status, r.attempts
      FROM billguard.billing_records r
     WHERE r.idempotency_key IN (SELECT a.key FROM answer a)
       FOR UPDATE SKIP LOCKED
  ), mine AS (   -- the answers whose attempt is still their record's
    SELECT a.*, l.customer_id, l.billing_period,
           CASE WHEN a.search THEN 'search ' ELSE '' END || a.outcome AS what,
           jsonb_strip_nulls(jsonb_build_object(
             'http_status', nullif(a.http_status, 0), 'type', a.error_type, 'code', a.error_code,
             'decline_code', a.decline_code, 'message', a.message, 'body', a.body_excerpt,
             'request_id', a.request_id, 'attempt', a.attempt)) AS detail
      FROM answer a
      JOIN locked l ON l.idempotency_key = a.key AND l.status = 'dispatching' AND l.attempts = a.attempt
  ), effect AS (
    SELECT m.key, m.customer_id, m.billing_period,
           CASE WHEN m.what IN ('completed', 'search completed') THEN m.charge_id END AS charge_id,
           CASE m.what
             WHEN 'completed' THEN 'completed' WHEN 'search completed' THEN 'completed'
             WHEN 'failed' THEN 'failed' WHEN 'needs_review' THEN 'needs_review'
             WHEN 'retry' THEN 'pending' WHEN 'throttled' THEN 'pending'
             WHEN 'paused' THEN 'pending' WHEN 'not_sent' THEN 'pending'
             WHEN 'search absent' THEN NULL   -- nothing changes
             ELSE 'unknown'                   -- unknown, search retry, search paused, search not_sent
           END AS status,
           -- an attempt that provably charged nothing and told nothing does not count
           CASE WHEN m.outcome IN ('paused', 'not_sent') THEN -1 ELSE 0 END AS attempts_delta,
           CASE m.what
             WHEN 'retry' THEN now() + billguard.retry_delay(m.attempt, 900)
             -- a rate limit or a key still in use backs off a minute at most
             WHEN 'throttled' THEN now() + billguard.retry_delay(m.attempt, 60)
             -- search is eventually consistent: "absent" only after the settle delay
             WHEN 'unknown' THEN now() + settle_delay
             WHEN 'search retry' THEN now() + billguard.retry_delay(m.attempt)
             WHEN 'paused' THEN now() WHEN 'not_sent' THEN now()
             WHEN 'search paused' THEN now() WHEN 'search not_sent' THEN now()
           END AS next_attempt_at,   -- NULL: settled, out of the queue
           m.what IN ('paused', 'search paused', 'search not_sent') AS keeps_error,
           CASE
             WHEN m.what IN ('completed', 'search completed') THEN NULL
             WHEN m.what = 'not_sent' THEN 'not sent: ' || m.message
             WHEN m.what = 'search retry' THEN m.message
             ELSE billguard.error_text(m.detail)
           END AS last_error,
           CASE m.what
             WHEN 'completed' THEN 'BillingCompleted' WHEN 'search completed' THEN 'ChargeReconciled'
             WHEN 'failed' THEN 'BillingFailed' WHEN 'retry' THEN 'BillingFailed'
             WHEN 'throttled' THEN 'BillingFailed' WHEN 'unknown' THEN 'ChargeUnknown'
             WHEN 'needs_review' THEN 'NeedsReview' WHEN 'not_sent' THEN 'ChargeNotSent'
           END AS event_type,
           CASE m.what
             WHEN 'completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'replayed', coalesce(m.replayed, false),
               'http_status', m.http_status, 'attempt', m.attempt, 'request_id', m.request_id))
             WHEN 'search completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'via', 'search', 'attempt', m.attempt,
               'request_id', m.request_id))
             WHEN 'failed' THEN m.detail || jsonb_build_object('terminal', true)
             WHEN 'retry' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'throttled' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'unknown' THEN m.detail
             WHEN 'needs_review' THEN m.detail
             WHEN 'not_sent' THEN jsonb_build_object('attempt', m.attempt, 'message', m.message)
           END AS event
      FROM mine m
  ), updated AS (
    UPDATE billguard.billing_records r
       SET status = e.status,
           attempts = r.attempts + e.attempts_delta,
           next_attempt_at = e.next_attempt_at,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.keeps_error THEN r.last_error ELSE e.last_error END,
           charge_id = coalesce(e.charge_id, r.charge_id),
           completed_at = CASE WHEN e.status = 'completed' THEN now() ELSE r.completed_at END,
           updated_at = now()
      FROM effect e
     WHERE r.idempotency_key = e.key AND e.status IS NOT NULL
  ), journaled AS (
    -- The record's row lock serialises all writers of its entity, so
    -- max + 1 cannot race.
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           e.customer_id, e.event_type, e.event
      FROM effect e
     CROSS JOIN LATERAL (SELECT 'billing-' || e.customer_id || '-' || e.billing_period AS id) p
     WHERE e.event_type IS NOT NULL
  )
  SELECT CASE WHEN a.position IN (SELECT m.position FROM mine m) THEN 'recorded'
              WHEN a.key IN (SELECT l.idempotency_key FROM locked l) THEN 'stale'
              ELSE billguard.missed_attempt(a.key, a.attempt)
         END
    FROM answer a
   ORDER BY a.position;
END $$;

-- One answer to a charge (see record_answers).
CREATE OR REPLACE FUNCTION billguard.record_charge_response(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    replayed boolean, request_id text, error_type text, error_code text, decline_code text,
    message text, body_excerpt text, settle_delay interval)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', false, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'replayed', replayed,
            'request_id', request_id, 'error_type', error_type, 'error_code', error_code,
            'decline_code', decline_code, 'message', message, 'body_excerpt', body_excerpt)),
          settle_delay) a);

-- One answer to a search for the record's charge (see record_answers).
CREATE OR REPLACE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', true, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'request_id', request_id,
            'message', message)),
          NULL) a);

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
       d.not_served_reason
  FROM billguard.dispatcher_state() d;

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
         last_error = NULL, next_attempt_at = NULL, updated_at = now()
   WHERE r.idempotency_key = rec.idempotency_key;
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'ReviewResolved',
    jsonb_build_object('charge_id', resolve_record.charge_id, 'previous_status', rec.status,
                       'by', session_user));
  RETURN 'completed';
END $$;

CREATE OR REPLACE FUNCTION billguard.cancel_unsent(customer_id text, billing_period text, reason text)
  RETURNS bigint
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  rec record;
  cancelled bigint := 0;
BEGIN
  FOR rec IN
    UPDATE billguard.billing_records r SET status = 'cancelled', next_attempt_at = NULL, updated_at = now()
     WHERE r.customer_id = cancel_unsent.customer_id
       AND (cancel_unsent.billing_period IS NULL OR r.billing_period = cancel_unsent.billing_period)
       AND r.status = 'pending' AND r.first_dispatched_at IS NULL
    RETURNING r.customer_id, r.billing_period
  LOOP
    PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'BillingCancelled',
      jsonb_build_object('previous_status', 'pending', 'reason', reason, 'by', session_user));
    cancelled := cancelled + 1;
  END LOOP;
  RETURN cancelled;
END $$;

-- As in a fresh install, the function this section creates is not granted
-- to PUBLIC.
REVOKE ALL ON FUNCTION billguard.record_answers(jsonb, interval) FROM PUBLIC;

-- ==== The scheduler, and snapshots upcast from older state versions (issue 7) ====

-- The shape of the state apply_event folds; every snapshot records the
-- version it was saved with. Bumped whenever the shape changes, with a step
-- in upcast_state that brings older snapshots to it: retention deletes the
-- events a snapshot covers, so an older snapshot cannot be skipped.
--   1  0.1.0
--   2  the scheduler entity keeps last_issued_period and last_issued_at
CREATE OR REPLACE FUNCTION billguard.state_version() RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN 2;

CREATE OR REPLACE FUNCTION billguard.initial_state(persistence_id text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN persistence_id = 'billing-scheduler'
      THEN jsonb_build_object('entity', 'billing-scheduler', 'issued_periods', '[]'::jsonb,
                              'last_issued_period', NULL, 'last_issued_at', NULL)
    WHEN persistence_id LIKE 'billing-%'
      THEN jsonb_build_object('entity', 'billing', 'status', 'new', 'attempts', 0)
    ELSE jsonb_build_object('entity', 'unknown')
  END;

-- One step of the fold. Pure: the same events always give the same state.
CREATE OR REPLACE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
      || CASE WHEN event ->> 'billing_period' >= coalesce(state ->> 'last_issued_period', '')
              THEN jsonb_build_object('last_issued_period', event -> 'billing_period',
                                      'last_issued_at', event -> 'issued_at')
              ELSE '{}'::jsonb
         END
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

-- A snapshot's state of an older state_version in the current shape, one
-- step per version:
--   1 -> 2  the scheduler entity's last_issued_period is the greatest of its
--           issued_periods, last_issued_at unknown. A state without
--           issued_periods (a malformed or hand-made snapshot) gets none:
--           billing_records, not the state, keeps those periods from being
--           billed twice.
CREATE FUNCTION billguard.upcast_state(state jsonb, state_version integer) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN state_version >= 2 OR state ->> 'entity' IS DISTINCT FROM 'billing-scheduler' THEN state
    ELSE state || jsonb_build_object(
      'issued_periods', coalesce(state -> 'issued_periods', '[]'::jsonb),
      'last_issued_period',
        (SELECT max(p.period) FROM jsonb_array_elements_text(
           coalesce(state -> 'issued_periods', '[]'::jsonb)) AS p(period)),
      'last_issued_at', NULL)
  END;

CREATE OR REPLACE FUNCTION billguard.entity_state(persistence_id text) RETURNS jsonb
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pid    text := entity_state.persistence_id;
  state  jsonb;
  seq    bigint := 0;
  ev     record;
BEGIN
  IF pid IS NULL THEN
    RAISE EXCEPTION 'persistence_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT billguard.upcast_state(s.state, s.state_version), s.seq_nr INTO state, seq
    FROM billguard.snapshots s
   WHERE s.persistence_id = pid AND s.state_version <= billguard.state_version()
   ORDER BY s.seq_nr DESC LIMIT 1;
  IF NOT FOUND THEN
    state := billguard.initial_state(pid);
    seq := 0;
  END IF;
  FOR ev IN SELECT j.seq_nr, j.event_type, j.event FROM billguard.journal j
             WHERE j.persistence_id = pid AND j.seq_nr > seq ORDER BY j.seq_nr LOOP
    state := billguard.apply_event(state, ev.event_type, ev.event);
    seq := ev.seq_nr;
  END LOOP;
  RETURN state || jsonb_build_object('persistence_id', pid, 'seq_nr', seq);
END $$;
COMMENT ON FUNCTION billguard.entity_state(text) IS
  'Folded state of an entity: its latest snapshot, upcast to the current state_version, plus the events after it.';

-- Retention: keep the newest keep_snapshots snapshots, delete older ones
-- and every event the oldest kept snapshot covers.
CREATE OR REPLACE FUNCTION billguard.apply_retention(persistence_id text, keep_snapshots integer DEFAULT 2)
  RETURNS TABLE (snapshots_deleted bigint, events_deleted bigint)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  pid        text := apply_retention.persistence_id;
  covered_to bigint;
BEGIN
  IF pid IS NULL THEN
    RAISE EXCEPTION 'persistence_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF keep_snapshots IS NULL OR keep_snapshots < 1 THEN
    RAISE EXCEPTION 'keep_snapshots must be >= 1' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT min(k.seq_nr) INTO covered_to FROM (
    SELECT s.seq_nr FROM billguard.snapshots s
     WHERE s.persistence_id = pid AND s.state_version <= billguard.state_version()
     ORDER BY s.seq_nr DESC LIMIT keep_snapshots) k;
  IF covered_to IS NULL THEN
    snapshots_deleted := 0; events_deleted := 0;
    RETURN NEXT;
    RETURN;
  END IF;
  DELETE FROM billguard.snapshots s WHERE s.persistence_id = pid AND s.seq_nr < covered_to;
  GET DIAGNOSTICS snapshots_deleted = ROW_COUNT;
  PERFORM set_config('billguard_internal.retention', 'on', true);
  -- The newest event always stays: it alone keeps the entity's highest
  -- seq_nr if every snapshot is lost later, so seq_nr never goes back.
  DELETE FROM billguard.journal j
   WHERE j.persistence_id = pid AND j.seq_nr <= covered_to
     AND j.seq_nr < (SELECT max(h.seq_nr) FROM billguard.journal h WHERE h.persistence_id = pid);
  GET DIAGNOSTICS events_deleted = ROW_COUNT;
  PERFORM set_config('billguard_internal.retention', 'off', true);
  RETURN NEXT;
END $$;
COMMENT ON FUNCTION billguard.apply_retention(text, integer) IS
  'Deletes snapshots older than the newest keep_snapshots and the events the oldest kept one covers.';

-- The scheduler: with billguard.auto_bill = monthly, each database's
-- dispatcher bills the previous calendar month once the UTC calendar passes
-- bill_day at bill_hour_utc (extension/scheduler.cpp calls scheduler_tick()).
-- Which period is due follows from the calendar alone, never from when a
-- worker started. The guard is the period's BillingTickIssued on
-- billing-scheduler; billing_records stays the authority when the journal
-- or a snapshot is wrong.

-- The settings and the scheduler's notion of now: billguard.scheduler_now
-- (test-only, superuser-only) or the transaction's start.
CREATE FUNCTION billguard.scheduler_settings(OUT auto_bill text, OUT bill_day integer,
                                             OUT bill_hour_utc integer, OUT now timestamptz)
  LANGUAGE c STABLE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_scheduler_settings';

-- The instant a period YYYY-MM becomes due: bill_hour_utc on bill_day of
-- the month after it, in UTC.
CREATE FUNCTION billguard.bill_instant(billing_period text, bill_day integer,
                                       bill_hour_utc integer)
  RETURNS timestamptz
  LANGUAGE sql STABLE
  SET search_path = pg_catalog, pg_temp
  RETURN (to_date(billing_period, 'YYYY-MM') + interval '1 month'
          + make_interval(days => bill_day - 1, hours => bill_hour_utc)) AT TIME ZONE 'UTC';

-- The calendar at instant `at`: the most recent period due (last month's
-- once this month's bill instant has passed, else the month before), the
-- instant it became due, and the instant the next one does.
CREATE FUNCTION billguard.scheduler_calendar(at timestamptz, bill_day integer,
                                             bill_hour_utc integer,
                                             OUT due_period text, OUT due_at timestamptz,
                                             OUT next_due_at timestamptz)
  LANGUAGE plpgsql STABLE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  this_month timestamp := date_trunc('month', at AT TIME ZONE 'UTC');
BEGIN
  IF bill_day NOT BETWEEN 1 AND 28 OR bill_hour_utc NOT BETWEEN 0 AND 23 THEN
    RAISE EXCEPTION 'bill_day must be 1..28 and bill_hour_utc 0..23, got % and %',
                    bill_day, bill_hour_utc
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  due_period := to_char(this_month - interval '1 month', 'YYYY-MM');
  IF at < billguard.bill_instant(due_period, bill_day, bill_hour_utc) THEN
    due_period := to_char(this_month - interval '2 months', 'YYYY-MM');
  END IF;
  due_at := billguard.bill_instant(due_period, bill_day, bill_hour_utc);
  next_due_at := billguard.bill_instant(to_char(to_date(due_period, 'YYYY-MM') + interval '1 month',
                                                'YYYY-MM'),
                                        bill_day, bill_hour_utc);
END $$;

-- The schedule at the scheduler's now: its settings, the most recent period
-- due, the instant it became due and the instant the next one does.
CREATE FUNCTION billguard.current_schedule(OUT auto_bill text, OUT bill_day integer,
                                           OUT bill_hour_utc integer, OUT due_period text,
                                           OUT due_at timestamptz, OUT next_due_at timestamptz)
  LANGUAGE sql STABLE
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT s.auto_bill, s.bill_day, s.bill_hour_utc, c.due_period, c.due_at, c.next_due_at
      FROM billguard.scheduler_settings() s,
           LATERAL billguard.scheduler_calendar(s.now, s.bill_day, s.bill_hour_utc) c;
  END;

-- One tick of the scheduler, in the dispatcher's transaction: bills the most
-- recent due period unless billing-scheduler has issued it. outcome:
--   billed          bill_period claimed the accounts without a record
--   already_issued  BillingTickIssued is in the scheduler's state: nothing
--   already_billed  the state did not list the period, yet billing_records
--                   held every record it would claim (a stale or older
--                   snapshot; or bill_customer for every account): nothing
--                   was claimed, and the worker logs the inconsistency
--   busy            a session bills this period right now; the worker tries
--                   again shortly rather than wait for its lock
-- existing counts the period's records from before this tick.
CREATE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  -- bill_period takes the same lock: the check and the claim are one step.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period)) THEN
    outcome := 'busy';
  ELSIF (billguard.entity_state('billing-scheduler') -> 'issued_periods') ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSE
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
  END IF;
  RETURN NEXT;
END $$;

-- The due periods never issued, oldest first: every period from the first
-- one issued (or, with none, due_period) up to due_period, the most recent
-- one due.
CREATE FUNCTION billguard.never_issued(due_period text, issued jsonb)
  RETURNS text[]
  LANGUAGE sql STABLE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(to_char(m, 'YYYY-MM') ORDER BY m), '{}')
            FROM generate_series(
                   to_date(least(due_period,
                                 (SELECT min(i.p) FROM jsonb_array_elements_text(issued) AS i(p))),
                           'YYYY-MM'),
                   to_date(due_period, 'YYYY-MM'), interval '1 month') AS m
           WHERE NOT issued ? to_char(m, 'YYYY-MM'));

-- The due periods never issued, with the instant each became due. scheduled:
-- the scheduler bills it by itself (the most recent, with auto_bill =
-- monthly); it never bills the others: bill each deliberately with
-- bill_period. records counts what bill_customer claimed of it already.
CREATE FUNCTION billguard.due_periods()
  RETURNS TABLE (billing_period text, due_at timestamptz, records bigint, scheduled boolean)
  LANGUAGE plpgsql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  missed   text[];
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  missed := billguard.never_issued(schedule.due_period,
              coalesce(billguard.entity_state('billing-scheduler') -> 'issued_periods', '[]'::jsonb));
  IF cardinality(missed) = 0 THEN
    RETURN;    -- no reason to read billing_records
  END IF;
  RETURN QUERY
    SELECT p.period,
           billguard.bill_instant(p.period, schedule.bill_day, schedule.bill_hour_utc),
           coalesce(r.records, 0),
           p.period = schedule.due_period AND schedule.auto_bill = 'monthly'
      FROM unnest(missed) AS p(period)
      LEFT JOIN (SELECT br.billing_period, count(*) AS records
                   FROM billguard.billing_records br
                  WHERE br.billing_period = ANY (missed)
                  GROUP BY br.billing_period) r ON r.billing_period = p.period
     ORDER BY p.period;
END $$;
COMMENT ON FUNCTION billguard.due_periods() IS
  'Due periods never issued; the scheduler bills only the most recent (scheduled), the rest only bill_period does.';

-- The scheduler as billguard.scheduler_status shows it: enabled, the next
-- instant it bills (in the past while the most recent due period waits to be
-- issued), the last period issued and when, and how many due periods the
-- scheduler will not bill by itself (see due_periods()).
CREATE FUNCTION billguard.scheduler_state(
    OUT enabled boolean, OUT bill_day integer, OUT bill_hour_utc integer,
    OUT next_bill_at timestamptz, OUT last_period_issued text,
    OUT last_period_issued_at timestamptz, OUT missed_periods bigint)
  LANGUAGE plpgsql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  enabled := schedule.auto_bill = 'monthly';
  bill_day := schedule.bill_day;
  bill_hour_utc := schedule.bill_hour_utc;
  next_bill_at := CASE WHEN NOT enabled THEN NULL
                       WHEN (state -> 'issued_periods') ? schedule.due_period THEN schedule.next_due_at
                       ELSE schedule.due_at END;
  last_period_issued := state ->> 'last_issued_period';
  last_period_issued_at := (state ->> 'last_issued_at')::timestamptz;
  -- Without reading billing_records: the view may be polled.
  missed_periods := cardinality(array_remove(
    billguard.never_issued(schedule.due_period,
                           coalesce(state -> 'issued_periods', '[]'::jsonb)),
    CASE WHEN enabled THEN schedule.due_period END));
END $$;

CREATE VIEW billguard.scheduler_status AS
SELECT s.enabled, s.bill_day, s.bill_hour_utc, s.next_bill_at, s.last_period_issued,
       s.last_period_issued_at, s.missed_periods
  FROM billguard.scheduler_state() s;
COMMENT ON VIEW billguard.scheduler_status IS
  'The scheduler of this database: enabled, when it bills next, the last period issued, older due periods never issued.';

-- As in a fresh install, nothing of the above is granted to PUBLIC (only
-- what this section creates).
REVOKE ALL ON FUNCTION
  billguard.upcast_state(jsonb, integer),
  billguard.scheduler_settings(),
  billguard.bill_instant(text, integer, integer),
  billguard.scheduler_calendar(timestamptz, integer, integer),
  billguard.current_schedule(),
  billguard.scheduler_tick(),
  billguard.never_issued(text, jsonb),
  billguard.due_periods(),
  billguard.scheduler_state()
FROM PUBLIC;
REVOKE ALL ON billguard.scheduler_status FROM PUBLIC;

-- ==== Answers for callers and Stripe webhooks (issue 7) ====

-- The statuses a record leaves only by a person's decision (retry_record,
-- resolve_record): what await_billing waits for.
CREATE FUNCTION billguard.is_terminal_status(status text) RETURNS boolean
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN status IN ('completed', 'failed', 'blocked', 'needs_review', 'cancelled');

-- Remembers the record's wake-up slot; the transaction's COMMIT wakes the
-- callers waiting on it. A C function, fired only on a move to a terminal
-- status, so the dispatcher's claims and retries never call it. BEFORE, not
-- AFTER: it shares the old row that billing_records_frozen_identity has
-- fetched already, where an AFTER trigger would fetch it again for every
-- update of the dispatcher's, and queue an event for each move it announces.
-- Triggers fire in name order, so it comes after that check; what it arms
-- happens only at COMMIT, and a row that is not written after all only
-- makes waiters read again. The WHEN clause spells out is_terminal_status():
-- a function with SET search_path is never inlined, and this clause is
-- evaluated for every update of the dispatcher's.
CREATE FUNCTION billguard.announce_terminal_status() RETURNS trigger
  LANGUAGE c
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_announce_terminal_status';

CREATE TRIGGER billing_records_terminal_wakeup BEFORE UPDATE OF status ON billguard.billing_records
  FOR EACH ROW
  WHEN (OLD.status IS DISTINCT FROM NEW.status
        AND NEW.status IN ('completed', 'failed', 'blocked', 'needs_review', 'cancelled'))
  EXECUTE FUNCTION billguard.announce_terminal_status();

-- The count of announcing commits for the record's wake-up slot, read before
-- the record; NULL when billguard is not preloaded.
CREATE FUNCTION billguard.terminal_commits(customer_id text, billing_period text) RETURNS bigint
  LANGUAGE c VOLATILE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_terminal_commits';

-- Sleeps until a commit beyond `seen` is announced for the record's slot
-- (true) or the deadline passes (false); cancellable.
CREATE FUNCTION billguard.await_terminal_commit(customer_id text, billing_period text, seen bigint,
                                                deadline timestamptz)
  RETURNS boolean
  LANGUAGE c VOLATILE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_await_terminal_commit';

-- Whether the caller's open transaction wrote this row version.
CREATE FUNCTION billguard.written_by_this_transaction(row_xmin xid) RETURNS boolean
  LANGUAGE c STABLE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_written_by_this_transaction';

-- The outcome of (customer_id, billing_period): its status and charge id as
-- soon as the record is terminal, or ('in_progress', NULL) once `timeout`
-- has passed. Each pass reads the record with a fresh snapshot (READ
-- COMMITTED) after reading its wake-up count, so the commit that makes it
-- terminal is never missed. Where no commit could ever show this caller a
-- change, it refuses to wait rather than sleep for nothing: in a REPEATABLE
-- READ or SERIALIZABLE transaction (its snapshot is fixed), when the caller's
-- own open transaction wrote the record (no one else can finish it before it
-- commits), and without shared_preload_libraries (no dispatcher runs and no
-- commit is announced). A terminal record, or timeout 0, is answered in all
-- of these.
CREATE FUNCTION billguard.await_billing(customer_id text, billing_period text,
                                        timeout interval DEFAULT '30 s')
  RETURNS TABLE (status text, charge_id text)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
  customer text := await_billing.customer_id;
  period   text := await_billing.billing_period;
  deadline timestamptz;
  seen     bigint;
  rec      record;
BEGIN
  IF customer IS NULL THEN
    RAISE EXCEPTION 'customer_id must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(period);
  IF await_billing.timeout IS NULL OR await_billing.timeout < interval '0' THEN
    RAISE EXCEPTION 'timeout must be an interval of zero or more, got %',
                    coalesce(await_billing.timeout::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  deadline := clock_timestamp() + await_billing.timeout;
  LOOP
    seen := billguard.terminal_commits(customer, period);
    SELECT r.status, r.charge_id, r.xmin AS row_xmin INTO rec
      FROM billguard.billing_records r
     WHERE r.customer_id = customer AND r.billing_period = period;
    IF NOT FOUND THEN
      RAISE EXCEPTION 'no billing record for % in %', quote_literal(left(customer, 64)), period
        USING ERRCODE = 'no_data_found',
              HINT = 'bill_customer() or bill_period() claims it; await_billing() only waits.';
    END IF;
    IF billguard.is_terminal_status(rec.status) THEN
      RETURN QUERY SELECT rec.status, rec.charge_id;
      RETURN;
    END IF;
    IF clock_timestamp() >= deadline THEN
      RETURN QUERY SELECT 'in_progress'::text, NULL::text;
      RETURN;
    END IF;
    IF seen IS NULL THEN
      RAISE EXCEPTION 'await_billing cannot wait: billguard is not in shared_preload_libraries'
        USING ERRCODE = 'object_not_in_prerequisite_state',
              HINT = 'Without it no dispatcher runs; timeout 0 reads the status without waiting.';
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
      RAISE EXCEPTION 'await_billing cannot wait in a % transaction: its snapshot never shows the record change',
                      upper(current_setting('transaction_isolation'))
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Call it in READ COMMITTED, or with timeout 0 to read the status this snapshot shows.';
    END IF;
    IF billguard.written_by_this_transaction(rec.row_xmin) THEN
      RAISE EXCEPTION 'await_billing cannot wait: this transaction wrote the billing record of % in % and has not committed',
                      quote_literal(left(customer, 64)), period
        USING ERRCODE = 'invalid_transaction_state',
              HINT = 'Commit the bill_customer() call first, then await_billing() in a new transaction.';
    END IF;
    PERFORM billguard.await_terminal_commit(customer, period, seen, deadline);
  END LOOP;
END $$;
COMMENT ON FUNCTION billguard.await_billing(text, text, interval) IS
  'Waits for the billing of (customer_id, billing_period) to end: (status, charge_id) once terminal, (in_progress, NULL) at the timeout.';

-- Stripe webhooks: Stripe's own word on the charges billguard made. A
-- delivery is verified (Stripe-Signature), applied once per Stripe event id
-- to the record its object's metadata.billguard_key names, journaled as
-- WebhookApplied and kept in stripe_events. It can settle a record billguard
-- does not know the outcome of (unknown, needs_review), and it records
-- refunds; it never turns a completed record into anything else.

-- 22023 unless Stripe signed `payload` with the secret of
-- billguard.webhook_secret_file within the last five minutes; 55000 when
-- that setting names no usable secret (extension/stripe_webhook_signature.cpp).
CREATE FUNCTION billguard.verify_stripe_signature(payload text, signature_header text)
  RETURNS void
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_verify_stripe_signature';

-- Every event applied, by Stripe's event id: what makes a delivery that
-- comes again (Stripe delivers at least once) change nothing. What the
-- event did to its record is `effect`:
--   completed     the record became completed with the event's charge
--   failed        an unknown or needs_review record: Stripe declined it
--   refunded      a refund of the record's charge (the record stays, or
--                 first becomes, completed; the period is not billed again)
--   confirmed     the event says what the record says already
--   unchanged     a failure while the dispatcher still has the record: it
--                 hears the same from Stripe under the same key
--   kept          the event contradicts a settled record, which keeps its
--                 status (a failure of a completed record's own charge, a
--                 decline of a cancelled or blocked one): a person should look
--   other_charge  a success or refund of another charge than the completed
--                 record's: a second charge with one key, for a person
--   mismatch      the object's amount or currency differ from the record's
-- The payload itself is not kept (a PaymentIntent carries its client_secret).
CREATE TABLE billguard.stripe_events (
  event_id              text NOT NULL,
  event_type            text NOT NULL,
  object_id             text NOT NULL,  -- the PaymentIntent or Charge
  customer_id           text NOT NULL,
  billing_period        text NOT NULL,
  idempotency_key       text NOT NULL,
  effect                text NOT NULL,
  detail                text,           -- the decline, or why nothing changed
  amount_refunded_cents bigint,         -- charge.refunded: refunded so far
  stripe_created_at     timestamptz NOT NULL,
  received_at           timestamptz NOT NULL DEFAULT now(),
  CONSTRAINT stripe_events_pk PRIMARY KEY (event_id),
  CONSTRAINT stripe_events_effect_valid CHECK (effect IN
    ('completed', 'failed', 'refunded', 'confirmed', 'unchanged', 'kept', 'other_charge', 'mismatch'))
);
COMMENT ON TABLE billguard.stripe_events IS
  'Stripe webhook events applied to billing records, once per event id, with what each did.';
CREATE INDEX stripe_events_billing ON billguard.stripe_events (customer_id, billing_period);

-- The webhook event types billguard applies, and what each says happened.
CREATE FUNCTION billguard.stripe_event_outcome(event_type text) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'payment_intent.succeeded' THEN 'charged'
    WHEN 'charge.succeeded' THEN 'charged'
    WHEN 'payment_intent.payment_failed' THEN 'declined'
    WHEN 'charge.failed' THEN 'declined'
    WHEN 'charge.refunded' THEN 'refunded'
  END;

-- The payload as jsonb, or 22023 naming what keeps it from being a Stripe
-- event billguard can apply.
CREATE FUNCTION billguard.stripe_event_json(payload text) RETURNS jsonb
  LANGUAGE plpgsql IMMUTABLE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  event   jsonb;
  object  jsonb;
  problem text;
BEGIN
  BEGIN
    event := payload::jsonb;
  EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
    RAISE EXCEPTION 'the webhook payload is not JSON: %', SQLERRM
      USING ERRCODE = 'invalid_parameter_value';
  END;
  object := event -> 'data' -> 'object';
  problem := CASE
    WHEN jsonb_typeof(event) IS DISTINCT FROM 'object' THEN 'it is not a JSON object'
    WHEN coalesce(event ->> 'id', '') !~ '^evt_[A-Za-z0-9_]{1,250}$' THEN 'id is not an event id (evt_...)'
    WHEN jsonb_typeof(event -> 'type') IS DISTINCT FROM 'string' THEN 'type is missing'
    WHEN jsonb_typeof(event -> 'created') IS DISTINCT FROM 'number'
      OR (event ->> 'created') !~ '^[0-9]{1,12}$' THEN 'created is not a unix time'
    WHEN jsonb_typeof(object) IS DISTINCT FROM 'object' THEN 'data.object is missing'
  END;
  IF problem IS NULL AND billguard.stripe_event_outcome(event ->> 'type') IS NOT NULL THEN
    problem := CASE
      WHEN object ->> 'object' IS DISTINCT FROM split_part(event ->> 'type', '.', 1)
        THEN format('data.object is not a %s', split_part(event ->> 'type', '.', 1))
      WHEN coalesce(object ->> 'id', '') !~ '^(pi|ch)_[A-Za-z0-9_]{1,250}$'
        THEN 'data.object.id is not a PaymentIntent or Charge id'
      WHEN jsonb_typeof(object -> 'amount') IS DISTINCT FROM 'number'
        OR (object ->> 'amount') !~ '^[0-9]{1,15}$' THEN 'data.object.amount is not an amount in cents'
      WHEN jsonb_typeof(object -> 'currency') IS DISTINCT FROM 'string' THEN 'data.object.currency is missing'
      WHEN jsonb_typeof(object -> 'metadata') IS DISTINCT FROM 'object' THEN 'data.object.metadata is missing'
      WHEN object -> 'metadata' ? 'billguard_key'
       AND coalesce(object -> 'metadata' ->> 'billguard_key', '') !~ '^[0-9a-f]{32}$'
        THEN 'data.object.metadata.billguard_key is not a billguard key'
      WHEN event ->> 'type' = 'charge.refunded'
       AND (jsonb_typeof(object -> 'amount_refunded') IS DISTINCT FROM 'number'
            OR (object ->> 'amount_refunded') !~ '^[0-9]{1,15}$')
        THEN 'data.object.amount_refunded is not an amount in cents'
    END;
  END IF;
  IF problem IS NOT NULL THEN
    RAISE EXCEPTION 'the webhook payload is not a Stripe event billguard can apply: %', problem
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN event;
END $$;

-- The charge id a record holds for the event's object: the PaymentIntent's
-- id for a record sent to /v1/payment_intents (a Charge names it in
-- payment_intent), the Charge's own id for one sent to /v1/charges.
CREATE FUNCTION billguard.stripe_event_charge_id(object jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE WHEN object ->> 'object' = 'charge'
              THEN coalesce(object ->> 'payment_intent', object ->> 'id')
              ELSE object ->> 'id' END;

-- Why Stripe declined, in one line like last_error's, e.g.
-- "card_declined/generic_decline: Your card was declined."
CREATE FUNCTION billguard.stripe_event_decline(object jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(': ',
    nullif(concat_ws('/', coalesce(object -> 'last_payment_error' ->> 'code', object ->> 'failure_code'),
                     object -> 'last_payment_error' ->> 'decline_code'), ''),
    coalesce(object -> 'last_payment_error' ->> 'message', object ->> 'failure_message'));

-- Applies a verified event to its record, which the caller holds locked;
-- returns the effect (see stripe_events).
CREATE FUNCTION billguard.apply_stripe_event(rec billguard.billing_records, event jsonb)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  object   jsonb := event -> 'data' -> 'object';
  outcome  text := billguard.stripe_event_outcome(event ->> 'type');
  charge   text := billguard.stripe_event_charge_id(object);
  refunded bigint := CASE WHEN outcome = 'refunded' THEN (object ->> 'amount_refunded')::bigint END;
  effect   text;
  detail   text;
BEGIN
  IF (object ->> 'amount')::bigint <> rec.amount_cents OR object ->> 'currency' <> rec.currency THEN
    effect := 'mismatch';
    detail := format('the event is about %s %s, the record about %s %s',
                     object ->> 'amount', object ->> 'currency', rec.amount_cents, rec.currency);
  ELSIF outcome IN ('charged', 'refunded') AND rec.status = 'completed' THEN
    effect := CASE WHEN charge <> rec.charge_id THEN 'other_charge'
                   WHEN outcome = 'refunded' THEN 'refunded' ELSE 'confirmed' END;
    IF effect = 'other_charge' THEN
      detail := format('charge %s, while the record completed with %s', charge, rec.charge_id);
    END IF;
  ELSIF outcome IN ('charged', 'refunded') THEN
    -- Stripe charged the customer under this key: the record says so, whatever
    -- billguard believed (a cached 500, a review, a backup restored from
    -- before the charge was recorded).
    UPDATE billguard.billing_records r
       SET status = 'completed', charge_id = charge, completed_at = now(), next_attempt_at = NULL,
           lease_expires_at = NULL, last_error = NULL, updated_at = now()
     WHERE r.idempotency_key = rec.idempotency_key;
    effect := CASE WHEN outcome = 'refunded' THEN 'refunded' ELSE 'completed' END;
  ELSIF rec.status IN ('unknown', 'needs_review') THEN
    detail := billguard.stripe_event_decline(object);
    UPDATE billguard.billing_records r
       SET status = 'failed', next_attempt_at = NULL, lease_expires_at = NULL, updated_at = now(),
           last_error = concat_ws(' ', 'webhook', event ->> 'type', nullif(detail, ''))
     WHERE r.idempotency_key = rec.idempotency_key;
    effect := 'failed';
  ELSIF rec.status = 'failed' THEN
    effect := 'confirmed';
  ELSIF rec.status IN ('pending', 'dispatching') THEN
    effect := 'unchanged';
  ELSE
    effect := 'kept';
    detail := format('a %s for a %s record', event ->> 'type', rec.status);
  END IF;
  IF effect IN ('kept', 'other_charge', 'mismatch') THEN
    RAISE WARNING 'billguard webhook: % (%) for %/% changed nothing: %', event ->> 'id',
                  event ->> 'type', rec.customer_id, rec.billing_period, detail
      USING HINT = 'A person should compare the record with Stripe''s dashboard.';
  END IF;

  INSERT INTO billguard.stripe_events (event_id, event_type, object_id, customer_id, billing_period,
                                       idempotency_key, effect, detail, amount_refunded_cents,
                                       stripe_created_at)
  VALUES (event ->> 'id', event ->> 'type', object ->> 'id', rec.customer_id, rec.billing_period,
          rec.idempotency_key, effect, nullif(detail, ''), refunded,
          to_timestamp((event ->> 'created')::bigint));
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'WebhookApplied',
    jsonb_strip_nulls(jsonb_build_object(
      'event_id', event ->> 'id', 'event_type', event ->> 'type', 'object_id', object ->> 'id',
      'effect', effect, 'previous_status', rec.status,
      'charge_id', CASE WHEN outcome IN ('charged', 'refunded') THEN charge END,
      'amount_refunded_cents', refunded,
      'fully_refunded', CASE WHEN outcome = 'refunded' THEN refunded >= rec.amount_cents END,
      'detail', nullif(detail, ''))));
  RETURN effect;
END $$;

-- A delivery of Stripe's webhook endpoint, as billguard-proxy passes it on
-- (POST /webhooks/stripe): the raw body and the Stripe-Signature header.
-- Returns the effect on the record (see stripe_events), 'already_seen' for
-- an event applied before, or 'ignored' for an event about something
-- billguard did not charge (another type, an object without
-- metadata.billguard_key). A bad signature, a stale timestamp or a payload
-- that is not such an event is 22023, a key no record holds P0002; nothing
-- changes then.
CREATE FUNCTION billguard.ingest_stripe_event(payload text, signature_header text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  event jsonb;
  key   text;
  rec   billguard.billing_records;
BEGIN
  PERFORM billguard.verify_stripe_signature(payload, signature_header);
  event := billguard.stripe_event_json(payload);
  key := event -> 'data' -> 'object' -> 'metadata' ->> 'billguard_key';
  IF billguard.stripe_event_outcome(event ->> 'type') IS NULL OR key IS NULL THEN
    RETURN 'ignored';
  END IF;
  -- The record's lock serialises every event of one billing, and the
  -- dispatcher's answers with them; a second delivery of the same event
  -- finds the first one's row once it holds the lock.
  SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key FOR UPDATE;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no billing record has the key % that event % names', key, event ->> 'id'
      USING ERRCODE = 'no_data_found',
            HINT = 'The event is for another database or key namespace billing through this Stripe account.';
  END IF;
  IF EXISTS (SELECT FROM billguard.stripe_events e WHERE e.event_id = event ->> 'id') THEN
    RETURN 'already_seen';
  END IF;
  RETURN billguard.apply_stripe_event(rec, event);
END $$;
COMMENT ON FUNCTION billguard.ingest_stripe_event(text, text) IS
  'Verifies a Stripe webhook delivery and applies its event once to the billing record it names.';

SELECT pg_catalog.pg_extension_config_dump('billguard.stripe_events', '');

-- The fold knows WebhookApplied (and, as the section before made it, the
-- scheduler's last issued period).
-- One step of the fold. Pure: the same events always give the same state.
CREATE OR REPLACE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'WebhookApplied' THEN state || jsonb_strip_nulls(jsonb_build_object(
      'status', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN 'completed'
                     WHEN event ->> 'effect' = 'failed' THEN 'failed' END,
      'charge_id', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN event -> 'charge_id' END,
      'refunded_cents', CASE WHEN event ->> 'effect' = 'refunded' THEN event -> 'amount_refunded_cents' END))
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
      || CASE WHEN event ->> 'billing_period' >= coalesce(state ->> 'last_issued_period', '')
              THEN jsonb_build_object('last_issued_period', event -> 'billing_period',
                                      'last_issued_at', event -> 'issued_at')
              ELSE '{}'::jsonb
         END
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

-- As in a fresh install, nothing of the above is granted to PUBLIC (only the
-- objects this section creates; see the dispatch path's section).
REVOKE ALL ON FUNCTION
  billguard.is_terminal_status(text),
  billguard.announce_terminal_status(),
  billguard.terminal_commits(text, text),
  billguard.await_terminal_commit(text, text, bigint, timestamptz),
  billguard.written_by_this_transaction(xid),
  billguard.await_billing(text, text, interval),
  billguard.verify_stripe_signature(text, text),
  billguard.stripe_event_outcome(text),
  billguard.stripe_event_json(text),
  billguard.stripe_event_charge_id(jsonb),
  billguard.stripe_event_decline(jsonb),
  billguard.apply_stripe_event(billguard.billing_records, jsonb),
  billguard.ingest_stripe_event(text, text)
FROM PUBLIC;
REVOKE ALL ON TABLE billguard.stripe_events FROM PUBLIC;

-- ==== Loose ends from the dispatcher (issue 7) ====

-- period_status: amounts per currency, never a sum across currencies. Its
-- result gains a currency column, so the function is dropped and created
-- again; renamed first, so that the grants users gave on it (README,
-- Privileges) are carried over to the new one, as in the section of items
-- 19 and 21.
ALTER FUNCTION billguard.period_status(text) RENAME TO period_status_before_currency;

CREATE FUNCTION billguard.period_status(billing_period text)
  RETURNS TABLE (status text, count bigint, amount_cents numeric, currency text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
BEGIN
  PERFORM billguard.check_billing_period(period_status.billing_period);
  RETURN QUERY
    -- sum(bigint) is numeric: no total overflows, whatever amounts records
    -- claimed before amounts were capped hold.
    SELECT st.status, count(r.status), coalesce(sum(r.amount_cents), 0), r.currency
      FROM unnest(ARRAY['pending', 'dispatching', 'unknown', 'needs_review', 'completed',
                        'failed', 'blocked', 'cancelled']) WITH ORDINALITY AS st (status, position)
      LEFT JOIN billguard.billing_records r
        ON r.status = st.status AND r.billing_period = period_status.billing_period
     GROUP BY st.status, st.position, r.currency
     ORDER BY st.position, r.currency;
END $$;
COMMENT ON FUNCTION billguard.period_status(text) IS
  'One row per record status and currency for the period: how many records, and their amount in minor units of that currency (never a sum across currencies). A status without records has one row with count 0, amount 0 and currency NULL.';

-- As in a fresh install: nothing granted to PUBLIC.
REVOKE ALL ON FUNCTION billguard.period_status(text) FROM PUBLIC;

-- The users' grants on the old function, carried over; the extension's
-- initial privileges set back to a fresh install's, so they stay users'
-- grants and are dumped.
DO $$
DECLARE
  old_oid oid := 'billguard.period_status_before_currency(text)'::regprocedure;
  new_oid oid := 'billguard.period_status(text)'::regprocedure;
  fresh aclitem[];
  grant_of record;
BEGIN
  SELECT p.proacl INTO fresh FROM pg_proc p WHERE p.oid = new_oid;
  FOR grant_of IN
    SELECT pg_get_userbyid(a.grantee) AS grantee, a.is_grantable
      FROM pg_proc p, aclexplode(p.proacl) a
     WHERE p.oid = old_oid AND a.privilege_type = 'EXECUTE' AND a.grantee NOT IN (0, p.proowner)
  LOOP
    EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I%s', new_oid::regprocedure,
                   grant_of.grantee, CASE WHEN grant_of.is_grantable THEN ' WITH GRANT OPTION' END);
  END LOOP;
  UPDATE pg_init_privs i SET initprivs = fresh
   WHERE i.objoid = new_oid AND i.classoid = 'pg_proc'::regclass AND i.objsubid = 0;
END $$;
DROP FUNCTION billguard.period_status_before_currency(text);

-- A 500 that created nothing is replayed by Stripe for the key to every
-- re-send: after billguard.max_unknown_cycles indeterminate answers, each
-- followed by a search that found nothing, the record needs review. The
-- count is a column that stays NULL until a record has one (no default: no
-- row is rewritten and none widened). The claim returns it, so its result
-- type changes: dropped and created again (the dispatcher is its only
-- caller; nothing is granted on it).
ALTER TABLE billguard.billing_records ADD COLUMN unknown_cycles smallint;

DROP FUNCTION billguard.claim_due_records(integer, interval, interval, text);
CREATE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text,
                 unknown_cycles integer)
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
    SELECT r.idempotency_key, r.status, r.created_at, r.first_dispatched_at
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
                                           r.stripe_customer, r.payment_method))
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period,
              r.stripe_endpoint, r.request_body, r.unknown_cycles,
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
         c.stripe_endpoint, c.request_body, coalesce(c.unknown_cycles, 0)::integer
    FROM claimed c;
END $$;

CREATE OR REPLACE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
  RETURNS TABLE (recorded text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
DECLARE
  unknown_outcome text;
BEGIN
  SELECT a.search || '/' || a.outcome INTO unknown_outcome
    FROM jsonb_to_recordset(answers) AS a(search boolean, outcome text)
   WHERE NOT coalesce(a.search IS NOT NULL AND a.outcome IN ('completed', 'retry', 'paused', 'not_sent')
                       OR a.search = false AND a.outcome IN ('failed', 'throttled', 'unknown', 'needs_review')
                       OR a.search AND a.outcome IN ('absent', 'needs_review'), false)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no such outcome of an answer (search/outcome): %', unknown_outcome
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH answer AS (
    SELECT *
      FROM ROWS FROM (jsonb_to_recordset(answers) AS (
             key text, attempt integer, search boolean, outcome text, http_status integer,
             charge_id text, replayed boolean, request_id text, error_type text, error_code text,
             decline_code text, message text, body_excerpt text))
           WITH ORDINALITY AS a(key, attempt, search, outcome, http_status, charge_id, replayed,
                                request_id, error_type, error_code, decline_code, message,
                                body_excerpt, position)
  ), locked AS (
    SELECT r.idempotency_key, r.customer_id, r.billing_period, r.status, r.attempts
      FROM billguard.billing_records r
     WHERE r.idempotency_key IN (SELECT a.key FROM answer a)
       FOR UPDATE SKIP LOCKED
  ), mine AS (   -- the answers whose attempt is still their record's
    SELECT a.*, l.customer_id, l.billing_period,
           CASE WHEN a.search THEN 'search ' ELSE '' END || a.outcome AS what,
           jsonb_strip_nulls(jsonb_build_object(
             'http_status', nullif(a.http_status, 0), 'type', a.error_type, 'code', a.error_code,
             'decline_code', a.decline_code, 'message', a.message, 'body', a.body_excerpt,
             'request_id', a.request_id, 'attempt', a.attempt)) AS detail
      FROM answer a
      JOIN locked l ON l.idempotency_key = a.key AND l.status = 'dispatching' AND l.attempts = a.attempt
  ), effect AS (
    SELECT m.key, m.customer_id, m.billing_period, m.what,
           CASE WHEN m.what IN ('completed', 'search completed') THEN m.charge_id END AS charge_id,
           CASE m.what
             WHEN 'completed' THEN 'completed' WHEN 'search completed' THEN 'completed'
             WHEN 'failed' THEN 'failed' WHEN 'needs_review' THEN 'needs_review'
             WHEN 'search needs_review' THEN 'needs_review'
             WHEN 'retry' THEN 'pending' WHEN 'throttled' THEN 'pending'
             WHEN 'paused' THEN 'pending' WHEN 'not_sent' THEN 'pending'
             WHEN 'search absent' THEN NULL   -- nothing changes
             ELSE 'unknown'                   -- unknown, search retry, search paused, search not_sent
           END AS status,
           -- an attempt that provably charged nothing and told nothing does not count
           CASE WHEN m.outcome IN ('paused', 'not_sent') THEN -1 ELSE 0 END AS attempts_delta,
           CASE m.what
             WHEN 'retry' THEN now() + billguard.retry_delay(m.attempt, 900)
             -- a rate limit or a key still in use backs off a minute at most
             WHEN 'throttled' THEN now() + billguard.retry_delay(m.attempt, 60)
             -- search is eventually consistent: "absent" only after the settle delay
             WHEN 'unknown' THEN now() + settle_delay
             WHEN 'search retry' THEN now() + billguard.retry_delay(m.attempt)
             WHEN 'paused' THEN now() WHEN 'not_sent' THEN now()
             WHEN 'search paused' THEN now() WHEN 'search not_sent' THEN now()
           END AS next_attempt_at,   -- NULL: settled, out of the queue
           m.what IN ('paused', 'search paused', 'search not_sent') AS keeps_error,
           CASE
             WHEN m.what IN ('completed', 'search completed') THEN NULL
             WHEN m.what = 'not_sent' THEN 'not sent: ' || m.message
             WHEN m.what IN ('search retry', 'search needs_review') THEN m.message
             ELSE billguard.error_text(m.detail)
           END AS last_error,
           CASE m.what
             WHEN 'completed' THEN 'BillingCompleted' WHEN 'search completed' THEN 'ChargeReconciled'
             WHEN 'failed' THEN 'BillingFailed' WHEN 'retry' THEN 'BillingFailed'
             WHEN 'throttled' THEN 'BillingFailed' WHEN 'unknown' THEN 'ChargeUnknown'
             WHEN 'needs_review' THEN 'NeedsReview' WHEN 'not_sent' THEN 'ChargeNotSent'
             WHEN 'search needs_review' THEN 'NeedsReview'
           END AS event_type,
           CASE m.what
             WHEN 'completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'replayed', coalesce(m.replayed, false),
               'http_status', m.http_status, 'attempt', m.attempt, 'request_id', m.request_id))
             WHEN 'search completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'via', 'search', 'attempt', m.attempt,
               'request_id', m.request_id))
             WHEN 'failed' THEN m.detail || jsonb_build_object('terminal', true)
             WHEN 'retry' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'throttled' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'unknown' THEN m.detail
             WHEN 'needs_review' THEN m.detail
             WHEN 'search needs_review' THEN m.detail || jsonb_build_object('via', 'search')
             WHEN 'not_sent' THEN jsonb_build_object('attempt', m.attempt, 'message', m.message)
           END AS event
      FROM mine m
  ), updated AS (
    UPDATE billguard.billing_records r
       SET status = e.status,
           attempts = r.attempts + e.attempts_delta,
           unknown_cycles = CASE WHEN e.what = 'unknown'
                                 THEN least(coalesce(r.unknown_cycles, 0) + 1, 32767)
                                 ELSE r.unknown_cycles END,
           next_attempt_at = e.next_attempt_at,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.keeps_error THEN r.last_error ELSE e.last_error END,
           charge_id = coalesce(e.charge_id, r.charge_id),
           completed_at = CASE WHEN e.status = 'completed' THEN now() ELSE r.completed_at END,
           updated_at = now()
      FROM effect e
     WHERE r.idempotency_key = e.key AND e.status IS NOT NULL
  ), journaled AS (
    -- The record's row lock serialises all writers of its entity, so
    -- max + 1 cannot race.
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           e.customer_id, e.event_type, e.event
      FROM effect e
     CROSS JOIN LATERAL (SELECT 'billing-' || e.customer_id || '-' || e.billing_period AS id) p
     WHERE e.event_type IS NOT NULL
  )
  SELECT CASE WHEN a.position IN (SELECT m.position FROM mine m) THEN 'recorded'
              WHEN a.key IN (SELECT l.idempotency_key FROM locked l) THEN 'stale'
              ELSE billguard.missed_attempt(a.key, a.attempt)
         END
    FROM answer a
   ORDER BY a.position;
END $$;

CREATE OR REPLACE FUNCTION billguard.requeue_record(rec billguard.billing_records) RETURNS void
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

-- As in a fresh install: nothing granted to PUBLIC (only the function this
-- section creates anew).
REVOKE ALL ON FUNCTION billguard.claim_due_records(integer, interval, interval, text) FROM PUBLIC;

-- A PaymentIntent says how it may be paid (automatic payment methods without
-- redirects), so that it does not depend on the account's dashboard settings
-- or API version. Only records first claimed from now on get that body: the
-- records 0.1.0 had sent got 0.1.0's body earlier in this script, from the C
-- symbol billguard_charge_request_body, which still builds exactly that.
CREATE OR REPLACE FUNCTION billguard.charge_request_body(endpoint text, idempotency_key text,
                                              customer_id text, billing_period text,
                                              amount_cents bigint, currency text,
                                              stripe_customer text, payment_method text)
  RETURNS text
  LANGUAGE c IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_charge_request_body_v2';

-- ==== Billing through the proxy (issue 8) ====

-- A refusal by billguard-proxy's spend cap makes its record blocked.
-- Records a batch of answers the dispatcher read and judged
-- (common/stripe_response.cpp), in one statement: answers is a JSON array of
-- {key, attempt, search, outcome, http_status, charge_id, replayed,
-- request_id, error_type, error_code, decline_code, message, body_excerpt}.
-- What each outcome does to its record, and the event it journals (every
-- event that records an answer carries Stripe's Request-Id, what Stripe
-- support asks for):
--   an answer to a charge:
--     completed     charged: charge_id                      BillingCompleted
--     failed        not charged (a decline, a 4xx)           BillingFailed, terminal
--     retry         again after retry_delay(attempt)         BillingFailed, not terminal
--     throttled     a 429 or 409: the same, backoff capped at a minute
--     unknown       a cached 500: search after settle_delay  ChargeUnknown
--     needs_review  a person must look; never re-sent        NeedsReview
--     blocked       refused by billguard-proxy's spend cap (nothing was
--                   sent upstream); terminal, never re-sent   BillingBlocked
--     paused        the API key was refused: not counted     -
--     not_sent      never left: not counted, due again (the
--                   dispatcher holds off while Stripe is
--                   unreachable)                             ChargeNotSent
--   an answer to a search for the record's charge:
--     completed     found charged: charge_id                 ChargeReconciled
--     absent        not found: nothing changes, the dispatcher sends the
--                   charge now with the same key and lease
--     retry         the search told nothing: unknown, again after retry_delay
--     paused        the API key was refused: unknown, not counted
--     not_sent      never left: the same
-- A settled record (completed, failed, needs_review, blocked) leaves the dispatch
-- queue: its next_attempt_at becomes NULL. One result per answer, in
-- order: 'recorded', or 'stale' when the record is no longer that attempt's
-- (its lease was taken over, an operator requeued it: a late answer must not
-- overwrite a newer state), or 'locked' when another session holds its row:
-- the dispatcher never waits for a row, so one held lock cannot halt all
-- billing (see missed_attempt). Rows are found by their primary key alone,
-- the one plan whatever the statistics say (after a crash they say the
-- table is empty): the planner is held to index lookups in nested loops.
CREATE OR REPLACE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
  RETURNS TABLE (recorded text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
DECLARE
  unknown_outcome text;
BEGIN
  SELECT a.search || '/' || a.outcome INTO unknown_outcome
    FROM jsonb_to_recordset(answers) AS a(search boolean, outcome text)
   WHERE NOT coalesce(a.search IS NOT NULL AND a.outcome IN ('completed', 'retry', 'paused', 'not_sent')
                       OR a.search = false AND a.outcome IN ('failed', 'throttled', 'unknown', 'needs_review', 'blocked')
                       OR a.search AND a.outcome IN ('absent', 'needs_review'), false)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no such outcome of an answer (search/outcome): %', unknown_outcome
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH answer AS (
    SELECT *
      FROM ROWS FROM (jsonb_to_recordset(answers) AS (
             key text, attempt integer, search boolean, outcome text, http_status integer,
             charge_id text, replayed boolean, request_id text, error_type text, error_code text,
             decline_code text, message text, body_excerpt text))
           WITH ORDINALITY AS a(key, attempt, search, outcome, http_status, charge_id, replayed,
                                request_id, error_type, error_code, decline_code, message,
                                body_excerpt, position)
  ), locked AS (
    SELECT r.idempotency_key, r.customer_id, r.billing_period, r.status, r.attempts
      FROM billguard.billing_records r
     WHERE r.idempotency_key IN (SELECT a.key FROM answer a)
       FOR UPDATE SKIP LOCKED
  ), mine AS (   -- the answers whose attempt is still their record's
    SELECT a.*, l.customer_id, l.billing_period,
           CASE WHEN a.search THEN 'search ' ELSE '' END || a.outcome AS what,
           jsonb_strip_nulls(jsonb_build_object(
             'http_status', nullif(a.http_status, 0), 'type', a.error_type, 'code', a.error_code,
             'decline_code', a.decline_code, 'message', a.message, 'body', a.body_excerpt,
             'request_id', a.request_id, 'attempt', a.attempt)) AS detail
      FROM answer a
      JOIN locked l ON l.idempotency_key = a.key AND l.status = 'dispatching' AND l.attempts = a.attempt
  ), effect AS (
    SELECT m.key, m.customer_id, m.billing_period, m.what,
           CASE WHEN m.what IN ('completed', 'search completed') THEN m.charge_id END AS charge_id,
           CASE m.what
             WHEN 'completed' THEN 'completed' WHEN 'search completed' THEN 'completed'
             WHEN 'failed' THEN 'failed' WHEN 'needs_review' THEN 'needs_review'
             WHEN 'search needs_review' THEN 'needs_review'
             WHEN 'blocked' THEN 'blocked'
             WHEN 'retry' THEN 'pending' WHEN 'throttled' THEN 'pending'
             WHEN 'paused' THEN 'pending' WHEN 'not_sent' THEN 'pending'
             WHEN 'search absent' THEN NULL   -- nothing changes
             ELSE 'unknown'                   -- unknown, search retry, search paused, search not_sent
           END AS status,
           -- an attempt that provably charged nothing and told nothing does not count
           CASE WHEN m.outcome IN ('paused', 'not_sent') THEN -1 ELSE 0 END AS attempts_delta,
           CASE m.what
             WHEN 'retry' THEN now() + billguard.retry_delay(m.attempt, 900)
             -- a rate limit or a key still in use backs off a minute at most
             WHEN 'throttled' THEN now() + billguard.retry_delay(m.attempt, 60)
             -- search is eventually consistent: "absent" only after the settle delay
             WHEN 'unknown' THEN now() + settle_delay
             WHEN 'search retry' THEN now() + billguard.retry_delay(m.attempt)
             WHEN 'paused' THEN now() WHEN 'not_sent' THEN now()
             WHEN 'search paused' THEN now() WHEN 'search not_sent' THEN now()
           END AS next_attempt_at,   -- NULL: settled, out of the queue
           m.what IN ('paused', 'search paused', 'search not_sent') AS keeps_error,
           CASE
             WHEN m.what IN ('completed', 'search completed') THEN NULL
             WHEN m.what = 'not_sent' THEN 'not sent: ' || m.message
             WHEN m.what IN ('search retry', 'search needs_review') THEN m.message
             ELSE billguard.error_text(m.detail)
           END AS last_error,
           CASE m.what
             WHEN 'completed' THEN 'BillingCompleted' WHEN 'search completed' THEN 'ChargeReconciled'
             WHEN 'failed' THEN 'BillingFailed' WHEN 'retry' THEN 'BillingFailed'
             WHEN 'throttled' THEN 'BillingFailed' WHEN 'unknown' THEN 'ChargeUnknown'
             WHEN 'needs_review' THEN 'NeedsReview' WHEN 'not_sent' THEN 'ChargeNotSent'
             WHEN 'search needs_review' THEN 'NeedsReview'
             WHEN 'blocked' THEN 'BillingBlocked'
           END AS event_type,
           CASE m.what
             WHEN 'completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'replayed', coalesce(m.replayed, false),
               'http_status', m.http_status, 'attempt', m.attempt, 'request_id', m.request_id))
             WHEN 'search completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'via', 'search', 'attempt', m.attempt,
               'request_id', m.request_id))
             WHEN 'failed' THEN m.detail || jsonb_build_object('terminal', true)
             WHEN 'retry' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'throttled' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'unknown' THEN m.detail
             WHEN 'needs_review' THEN m.detail
             WHEN 'search needs_review' THEN m.detail || jsonb_build_object('via', 'search')
             WHEN 'blocked' THEN m.detail
             WHEN 'not_sent' THEN jsonb_build_object('attempt', m.attempt, 'message', m.message)
           END AS event
      FROM mine m
  ), updated AS (
    UPDATE billguard.billing_records r
       SET status = e.status,
           attempts = r.attempts + e.attempts_delta,
           unknown_cycles = CASE WHEN e.what = 'unknown'
                                 THEN least(coalesce(r.unknown_cycles, 0) + 1, 32767)
                                 ELSE r.unknown_cycles END,
           next_attempt_at = e.next_attempt_at,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.keeps_error THEN r.last_error ELSE e.last_error END,
           charge_id = coalesce(e.charge_id, r.charge_id),
           completed_at = CASE WHEN e.status = 'completed' THEN now() ELSE r.completed_at END,
           updated_at = now()
      FROM effect e
     WHERE r.idempotency_key = e.key AND e.status IS NOT NULL
  ), journaled AS (
    -- The record's row lock serialises all writers of its entity, so
    -- max + 1 cannot race.
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           e.customer_id, e.event_type, e.event
      FROM effect e
     CROSS JOIN LATERAL (SELECT 'billing-' || e.customer_id || '-' || e.billing_period AS id) p
     WHERE e.event_type IS NOT NULL
  )
  SELECT CASE WHEN a.position IN (SELECT m.position FROM mine m) THEN 'recorded'
              WHEN a.key IN (SELECT l.idempotency_key FROM locked l) THEN 'stale'
              ELSE billguard.missed_attempt(a.key, a.attempt)
         END
    FROM answer a
   ORDER BY a.position;
END $$;

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

-- The POST /keys body for the period's USD budget (the proxy's budgets are
-- in USD): vendor stripe; a cap of the period's claimed total (every record
-- of the period in USD but the cancelled, at least Stripe's 50-cent
-- minimum) times headroom, rounded up to whole cents in numeric, never
-- floating point; the endpoints the period's records use (as stored by
-- their first claim, else `endpoint`) and their search; and an expiry 35
-- days past the later of the period's end and now, long enough for the
-- period's retries and reconciliation (hours), short enough that a leaked
-- key dies by itself. A record still sending after that meets an expired
-- key, and the dispatcher obtains a new one for the same budget.
-- existing_cap_cents, when given, is asked instead: the cap of the period's existing
-- budget, which a key must name to join it (the proxy's 409).
CREATE FUNCTION billguard.vault_key_request(billing_period text, endpoint text, headroom numeric,
                                            existing_cap_cents bigint DEFAULT NULL)
  RETURNS TABLE (body jsonb, cap_cents bigint)
  LANGUAGE plpgsql STABLE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  total     numeric;
  endpoints text[];
  asked     bigint := vault_key_request.existing_cap_cents;
BEGIN
  PERFORM billguard.check_billing_period(vault_key_request.billing_period);
  IF headroom IS NULL OR headroom < 1 OR headroom > 10 THEN
    RAISE EXCEPTION 'headroom must be between 1 and 10, got %', coalesce(headroom::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT coalesce(sum(r.amount_cents), 0),
         array_agg(DISTINCT coalesce(r.stripe_endpoint, vault_key_request.endpoint))
    INTO total, endpoints
    FROM billguard.billing_records r
   WHERE r.billing_period = vault_key_request.billing_period AND r.currency = 'usd'
     AND r.status <> 'cancelled';
  endpoints := coalesce(endpoints, ARRAY[vault_key_request.endpoint]);
  cap_cents := coalesce(asked, ceil(greatest(total, 50) * headroom)::bigint);
  IF cap_cents <= 0 THEN
    RAISE EXCEPTION 'cap_cents must be positive, got %', cap_cents
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  body := jsonb_build_object(
    'vendor', 'stripe',
    'billing_period', vault_key_request.billing_period,
    'period_usd_cap', round(cap_cents / 100.0, 2),
    'allowed_endpoints', (SELECT jsonb_agg(e ORDER BY e)
                            FROM unnest(endpoints || ARRAY(SELECT x || '/search' FROM unnest(endpoints) x)) e),
    'expires_at', to_char((greatest((vault_key_request.billing_period || '-01')::date + interval '1 month',
                                    now()) + interval '35 days') AT TIME ZONE 'UTC',
                          'YYYY-MM-DD"T"HH24:MI:SS"Z"'));
  RETURN NEXT;
END $$;

-- Keeps the key the proxy answered; a newer key of the period replaces the
-- one it had (an expired one, say).
CREATE FUNCTION billguard.store_vault_credential(api_base text, billing_period text, currency text,
                                                 key_id text, vault_key text, cap_cents bigint)
  RETURNS void
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    INSERT INTO billguard.vault_credentials AS c
           (api_base, billing_period, currency, key_id, vault_key, cap_cents)
    VALUES (store_vault_credential.api_base, store_vault_credential.billing_period,
            store_vault_credential.currency, store_vault_credential.key_id,
            store_vault_credential.vault_key, store_vault_credential.cap_cents)
    ON CONFLICT (api_base, billing_period, currency) DO UPDATE
       SET key_id = excluded.key_id, vault_key = excluded.vault_key,
           cap_cents = excluded.cap_cents, obtained_at = now();
  END;

-- Forgets a key the proxy no longer accepts (expired), unless a newer one
-- replaced it already.
CREATE FUNCTION billguard.forget_vault_credential(api_base text, billing_period text,
                                                  currency text, key_id text)
  RETURNS void
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    DELETE FROM billguard.vault_credentials c
     WHERE (c.api_base, c.billing_period, c.currency, c.key_id)
         = (forget_vault_credential.api_base, forget_vault_credential.billing_period,
            forget_vault_credential.currency, forget_vault_credential.key_id);
  END;

REVOKE ALL ON TABLE billguard.vault_credentials FROM PUBLIC;
REVOKE ALL ON FUNCTION billguard.vault_key_request(text, text, numeric, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION billguard.store_vault_credential(text, text, text, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION billguard.forget_vault_credential(text, text, text, text) FROM PUBLIC;

-- ==== Pure C functions called once per row run without a search_path setting (issue 6, item 1) ====
-- They run no SQL and look no name up; the setting tripled their cost
-- (see sql/install/10_c_functions.sql).
ALTER FUNCTION billguard.key_namespace() RESET search_path;
ALTER FUNCTION billguard.idempotency_key(text, text, text) RESET search_path;
ALTER FUNCTION billguard.is_billing_period(text) RESET search_path;
ALTER FUNCTION billguard.billing_initiated_event(text, text, text, bigint, text, timestamptz, text) RESET search_path;
ALTER FUNCTION billguard.is_valid_customer_id(text) RESET search_path;
ALTER FUNCTION billguard.charge_request_body(text, text, text, text, bigint, text, text, text) RESET search_path;

-- ==== The ledger holds the budget's lock briefly (issue 8) ====
-- Decisions on one Idempotency-Key are serialised by an advisory lock of
-- that key; the budget's row is locked last, for the cap check and its sums
-- only (see sql/install/82_vault_decisions.sql).
CREATE FUNCTION billguard.lock_vault_idempotency_key(vendor text, billing_period text,
                                                     currency text, idempotency_key text)
  RETURNS void
  LANGUAGE sql VOLATILE
  SET search_path = pg_catalog, pg_temp
  -- A class of its own for the first key: 'bg' 0x0003.
  AS $$ SELECT pg_advisory_xact_lock(1651068163, hashtext(concat_ws('/', vendor, billing_period,
                                                                    currency, idempotency_key))) $$;
REVOKE ALL ON FUNCTION billguard.lock_vault_idempotency_key(text, text, text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  amount    bigint := vault_authorize.amount_cents;
  idem      text := vault_authorize.idempotency_key;
  k         billguard.vault_keys;
  held      billguard.vault_reservations;
  known_key boolean;   -- a reservation exists for the Idempotency-Key
  verdict   text;
  status    integer;
  error_type text := 'invalid_request_error';
  code      text;
  reason    text;
  answer    text;
  replay_request_id text;
BEGIN
  IF octet_length(vault_authorize.secret_sha256) IS DISTINCT FROM 32 THEN
    RAISE EXCEPTION 'secret_sha256 must be 32 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.method IS NULL OR vault_authorize.method !~ '^[A-Z]{1,16}$' THEN
    RAISE EXCEPTION 'method must be an HTTP method in upper case' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.endpoint IS NULL OR vault_authorize.endpoint !~ '^/v1(/[A-Za-z0-9_]+)+$' THEN
    RAISE EXCEPTION 'endpoint must be an API path such as /v1/payment_intents, got %',
                    coalesce(quote_literal(left(vault_authorize.endpoint, 80)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.request_digest IS NULL OR vault_authorize.request_digest !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'request_digest must be 64 lower-case hex characters' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(idem) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'idempotency_key must be 1..255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount NOT BETWEEN 1 AND 99999999 THEN
    RAISE EXCEPTION 'amount must be a positive integer of at most 99999999, got %', amount
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.customer) > 255 OR octet_length(vault_authorize.currency) > 16 THEN
    RAISE EXCEPTION 'customer or currency too long' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  <<decide>>
  BEGIN
    SELECT * INTO k FROM billguard.vault_keys v WHERE v.secret_sha256 = vault_authorize.secret_sha256;
    IF NOT FOUND THEN
      status := 401; code := 'vault_key_unknown'; reason := 'unknown vault key';
      EXIT decide;
    ELSIF k.revoked_at IS NOT NULL THEN
      status := 401; code := 'vault_key_revoked'; reason := format('vault key %s was revoked', k.key_id);
      EXIT decide;
    ELSIF k.expires_at <= now() THEN
      status := 401; code := 'vault_key_expired'; reason := format('vault key %s expired', k.key_id);
      EXIT decide;
    END IF;
    IF vault_authorize.method NOT IN ('GET', 'POST')
       OR NOT EXISTS (SELECT FROM unnest(k.allowed_endpoints) e
                       WHERE vault_authorize.endpoint = e OR starts_with(vault_authorize.endpoint, e || '/')) THEN
      status := 403; code := 'endpoint_not_allowed';
      reason := format('vault key %s may call GET and POST on %s only, not %s %s', k.key_id,
                       array_to_string(k.allowed_endpoints, ', '), vault_authorize.method,
                       vault_authorize.endpoint);
      EXIT decide;
    END IF;
    IF amount IS NULL THEN
      verdict := 'forwarded';
      EXIT decide;
    END IF;
    IF vault_authorize.currency IS NULL THEN
      status := 400; code := 'parameter_missing'; reason := 'Missing required param: currency.';
      EXIT decide;
    ELSIF lower(vault_authorize.currency) <> k.currency THEN
      status := 403; code := 'currency_not_allowed';
      reason := format('the budget of vault key %s is in %s, not %s', k.key_id, k.currency,
                       lower(vault_authorize.currency));
      EXIT decide;
    END IF;
    IF idem IS NULL THEN
      -- Without a key a retry is a second charge, which the cap exists to stop.
      status := 400; code := 'idempotency_key_required';
      reason := 'a request with an amount needs an Idempotency-Key';
      EXIT decide;
    END IF;

    -- Decisions on one Idempotency-Key are serialised by its own lock,
    -- taken before the reservation exists; the budget's row is locked last.
    PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency, idem);
    SELECT * INTO held FROM billguard.vault_reservations r
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, idem);
    known_key := FOUND;
    IF known_key AND held.request_digest <> vault_authorize.request_digest THEN
      status := 400; error_type := 'idempotency_error'; code := NULL;
      reason := format('Keys for idempotent requests can only be used with the same parameters they '
                       'were first used with. Try using a key other than ''%s'' if you meant to '
                       'execute a different request.', idem);
      EXIT decide;
    ELSIF known_key AND held.status = 'settled' THEN
      verdict := 'replayed'; status := held.response_status; answer := held.response_body;
      replay_request_id := held.response_request_id;
      reason := format('settled as %s at %s', held.charge_id, held.settled_at);
      EXIT decide;
    ELSIF known_key AND held.status = 'reserved' THEN
      verdict := 'reused';
      EXIT decide;
    END IF;
    -- The cap check and the reservation in one UPDATE: the budget's row lock
    -- is held from here to the commit. Once a concurrent holder commits, the
    -- UPDATE checks the cap again against the row it left.
    UPDATE billguard.vault_budgets b SET reserved_cents = b.reserved_cents + amount, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
       AND b.settled_cents + b.reserved_cents + amount <= b.cap_cents;
    IF NOT FOUND THEN
      status := 429; code := 'spend_cap_exceeded';
      reason := format('spend cap exceeded for billing_period %s', k.billing_period);
      EXIT decide;
    END IF;
    -- Written under the budget's lock, so that concurrent reservations never
    -- share the key lock their foreign keys take on the budget and key rows.
    IF known_key THEN   -- released earlier: counted again while it is retried
      UPDATE billguard.vault_reservations r SET status = 'reserved', key_id = k.key_id
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem);
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount);
    END IF;
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';

CREATE OR REPLACE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k       billguard.vault_keys;
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = vault_settle.key_id;
  -- The Idempotency-Key's lock (as vault_authorize takes it); the budget's
  -- row lock, when the budget changes at all, comes last.
  PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency,
                                               vault_settle.idempotency_key);
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(vault_settle.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(vault_settle.idempotency_key, 255)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;

  outcome := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'settled' AND held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = vault_settle.upstream_status,
           charge_id = vault_settle.charge_id, response_status = vault_settle.upstream_status,
           response_body = coalesce(vault_settle.response_body, ''),
           response_request_id = vault_settle.request_id, settled_at = now()
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'released', upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r SET upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_settle.key_id, k.vendor, k.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, k.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END);

  -- The budget last, held to the commit only.
  IF outcome = 'settled' AND held.status <> 'settled' THEN
    -- A success after a release (Stripe answering a key it refused before)
    -- is still money spent: it is counted, whatever the cap says.
    UPDATE billguard.vault_budgets b
       SET settled_cents = b.settled_cents + held.amount_cents,
           reserved_cents = b.reserved_cents
                            - CASE held.status WHEN 'reserved' THEN held.amount_cents ELSE 0 END,
           updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_budgets b
       SET reserved_cents = b.reserved_cents - held.amount_cents, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
  END IF;
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text) IS
  'Records Stripe''s answer to a reserved request: settled, released or unknown (still reserved); audited.';

-- ==== A successful settle leaves the budget alone (issue 8) ====
-- The budget keeps one committed sum (reserved + settled) under its cap
-- check, changed only when a reservation starts or stops being counted; a
-- success settling a reservation no longer locks or updates the budget's
-- row. The settled and reserved sums are read from the reservations (see
-- sql/install/80_vault_ledger.sql and 82_vault_decisions.sql). The table
-- vault_budgets and the view vault_spend are created in their final shape
-- by the spend-cap ledger's section above (0.2.0 is unreleased): columns
-- dropped here would stay in the catalog, unlike a fresh install's.
CREATE INDEX vault_reservations_reserved ON billguard.vault_reservations
  (vendor, billing_period, currency) INCLUDE (amount_cents) WHERE status = 'reserved';

CREATE OR REPLACE FUNCTION billguard.vault_key_status(key_id text)
  RETURNS TABLE (vendor text, billing_period text, currency text, cap_usd numeric,
                 cap_cents bigint, settled_cents bigint, reserved_cents bigint,
                 remaining_cents bigint, allowed_endpoints text[], livemode boolean,
                 expires_at timestamptz, revoked_at timestamptz, created_at timestamptz)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  RETURN QUERY
    SELECT k.vendor, k.billing_period, k.currency, round(s.cap_cents / 100.0, 2), s.cap_cents,
           s.settled_cents, s.reserved_cents, s.remaining_cents,
           k.allowed_endpoints, k.livemode, k.expires_at, k.revoked_at, k.created_at
      FROM billguard.vault_keys k
      JOIN billguard.vault_spend s USING (vendor, billing_period, currency)
     WHERE k.key_id = vault_key_status.key_id;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no vault key %', coalesce(quote_literal(left(vault_key_status.key_id, 40)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
END $$;

CREATE OR REPLACE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  amount    bigint := vault_authorize.amount_cents;
  idem      text := vault_authorize.idempotency_key;
  k         billguard.vault_keys;
  held      billguard.vault_reservations;
  known_key boolean;   -- a reservation exists for the Idempotency-Key
  verdict   text;
  status    integer;
  error_type text := 'invalid_request_error';
  code      text;
  reason    text;
  answer    text;
  replay_request_id text;
BEGIN
  IF octet_length(vault_authorize.secret_sha256) IS DISTINCT FROM 32 THEN
    RAISE EXCEPTION 'secret_sha256 must be 32 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.method IS NULL OR vault_authorize.method !~ '^[A-Z]{1,16}$' THEN
    RAISE EXCEPTION 'method must be an HTTP method in upper case' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.endpoint IS NULL OR vault_authorize.endpoint !~ '^/v1(/[A-Za-z0-9_]+)+$' THEN
    RAISE EXCEPTION 'endpoint must be an API path such as /v1/payment_intents, got %',
                    coalesce(quote_literal(left(vault_authorize.endpoint, 80)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.request_digest IS NULL OR vault_authorize.request_digest !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'request_digest must be 64 lower-case hex characters' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(idem) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'idempotency_key must be 1..255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount NOT BETWEEN 1 AND 99999999 THEN
    RAISE EXCEPTION 'amount must be a positive integer of at most 99999999, got %', amount
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.customer) > 255 OR octet_length(vault_authorize.currency) > 16 THEN
    RAISE EXCEPTION 'customer or currency too long' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  <<decide>>
  BEGIN
    SELECT * INTO k FROM billguard.vault_keys v WHERE v.secret_sha256 = vault_authorize.secret_sha256;
    IF NOT FOUND THEN
      status := 401; code := 'vault_key_unknown'; reason := 'unknown vault key';
      EXIT decide;
    ELSIF k.revoked_at IS NOT NULL THEN
      status := 401; code := 'vault_key_revoked'; reason := format('vault key %s was revoked', k.key_id);
      EXIT decide;
    ELSIF k.expires_at <= now() THEN
      status := 401; code := 'vault_key_expired'; reason := format('vault key %s expired', k.key_id);
      EXIT decide;
    END IF;
    IF vault_authorize.method NOT IN ('GET', 'POST')
       OR NOT EXISTS (SELECT FROM unnest(k.allowed_endpoints) e
                       WHERE vault_authorize.endpoint = e OR starts_with(vault_authorize.endpoint, e || '/')) THEN
      status := 403; code := 'endpoint_not_allowed';
      reason := format('vault key %s may call GET and POST on %s only, not %s %s', k.key_id,
                       array_to_string(k.allowed_endpoints, ', '), vault_authorize.method,
                       vault_authorize.endpoint);
      EXIT decide;
    END IF;
    IF amount IS NULL THEN
      verdict := 'forwarded';
      EXIT decide;
    END IF;
    IF vault_authorize.currency IS NULL THEN
      status := 400; code := 'parameter_missing'; reason := 'Missing required param: currency.';
      EXIT decide;
    ELSIF lower(vault_authorize.currency) <> k.currency THEN
      status := 403; code := 'currency_not_allowed';
      reason := format('the budget of vault key %s is in %s, not %s', k.key_id, k.currency,
                       lower(vault_authorize.currency));
      EXIT decide;
    END IF;
    IF idem IS NULL THEN
      -- Without a key a retry is a second charge, which the cap exists to stop.
      status := 400; code := 'idempotency_key_required';
      reason := 'a request with an amount needs an Idempotency-Key';
      EXIT decide;
    END IF;

    -- Decisions on one Idempotency-Key are serialised by its own lock,
    -- taken before the reservation exists; the budget's row is locked last.
    PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency, idem);
    SELECT * INTO held FROM billguard.vault_reservations r
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, idem);
    known_key := FOUND;
    IF known_key AND held.request_digest <> vault_authorize.request_digest THEN
      status := 400; error_type := 'idempotency_error'; code := NULL;
      reason := format('Keys for idempotent requests can only be used with the same parameters they '
                       'were first used with. Try using a key other than ''%s'' if you meant to '
                       'execute a different request.', idem);
      EXIT decide;
    ELSIF known_key AND held.status = 'settled' THEN
      verdict := 'replayed'; status := held.response_status; answer := held.response_body;
      replay_request_id := held.response_request_id;
      reason := format('settled as %s at %s', held.charge_id, held.settled_at);
      EXIT decide;
    ELSIF known_key AND held.status = 'reserved' THEN
      verdict := 'reused';
      EXIT decide;
    END IF;
    -- The cap check and the reservation in one UPDATE: the budget's row lock
    -- is held from here to the commit. Once a concurrent holder commits, the
    -- UPDATE checks the cap again against the row it left.
    UPDATE billguard.vault_budgets b SET committed_cents = b.committed_cents + amount, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
       AND b.committed_cents + amount <= b.cap_cents;
    IF NOT FOUND THEN
      status := 429; code := 'spend_cap_exceeded';
      reason := format('spend cap exceeded for billing_period %s', k.billing_period);
      EXIT decide;
    END IF;
    -- Written under the budget's lock, so that concurrent reservations never
    -- share the key lock their foreign keys take on the budget and key rows.
    IF known_key THEN   -- released earlier: counted again while it is retried
      UPDATE billguard.vault_reservations r SET status = 'reserved', key_id = k.key_id
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem);
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount);
    END IF;
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';

CREATE OR REPLACE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  k       billguard.vault_keys;
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = vault_settle.key_id;
  -- The Idempotency-Key's lock (as vault_authorize takes it); the budget's
  -- row lock, when its committed sum changes at all, comes last.
  PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency,
                                               vault_settle.idempotency_key);
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(vault_settle.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(vault_settle.idempotency_key, 255)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;

  outcome := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'settled' AND held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = vault_settle.upstream_status,
           charge_id = vault_settle.charge_id, response_status = vault_settle.upstream_status,
           response_body = coalesce(vault_settle.response_body, ''),
           response_request_id = vault_settle.request_id, settled_at = now()
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'released', upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  ELSIF held.status <> 'settled' THEN
    UPDATE billguard.vault_reservations r SET upstream_status = vault_settle.upstream_status
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, vault_settle.idempotency_key);
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_settle.key_id, k.vendor, k.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, k.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END);

  -- The budget last, held to the commit only, and only when its committed
  -- sum changes: a success settling a reservation was counted when it was
  -- reserved, and leaves the budget alone.
  IF outcome = 'settled' AND held.status = 'released' THEN
    -- A success after a release (Stripe answering a key it refused before)
    -- is still money spent: it is counted again, whatever the cap says.
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents + held.amount_cents, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
  ELSIF outcome = 'released' AND held.status = 'reserved' THEN
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents - held.amount_cents, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
  END IF;
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text) IS
  'Records Stripe''s answer to a reserved request: settled, released or unknown (still reserved); audited.';

-- ==== Stripe webhooks from an adversary's side (issue 7) ====
-- A webhook whose object is another Stripe customer's, or whose event is a
-- connected account's, is a mismatch: the key in metadata is not enough.
-- A decline of an object created a day or more before the record's last
-- attempt leaves an unknown or needs_review record to the dispatcher.
-- entity_state's refunded_cents never shrinks when refund events arrive
-- out of order. A delivery for a record another session keeps locked gives
-- up after 5 s (55P03; Stripe delivers it again) instead of holding one of
-- the proxy's connections for as long as the lock is held.
CREATE OR REPLACE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'WebhookApplied' THEN state || jsonb_strip_nulls(jsonb_build_object(
      'status', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN 'completed'
                     WHEN event ->> 'effect' = 'failed' THEN 'failed' END,
      'charge_id', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN event -> 'charge_id' END,
      -- Stripe's amount refunded so far only grows; its events come in any order.
      'refunded_cents', CASE WHEN event ->> 'effect' = 'refunded'
                             THEN to_jsonb(greatest((state ->> 'refunded_cents')::bigint,
                                                    (event ->> 'amount_refunded_cents')::bigint)) END))
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
      || CASE WHEN event ->> 'billing_period' >= coalesce(state ->> 'last_issued_period', '')
              THEN jsonb_build_object('last_issued_period', event -> 'billing_period',
                                      'last_issued_at', event -> 'issued_at')
              ELSE '{}'::jsonb
         END
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

CREATE OR REPLACE FUNCTION billguard.apply_stripe_event(rec billguard.billing_records, event jsonb)
  RETURNS text
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  object   jsonb := event -> 'data' -> 'object';
  outcome  text := billguard.stripe_event_outcome(event ->> 'type');
  charge   text := billguard.stripe_event_charge_id(object);
  refunded bigint := CASE WHEN outcome = 'refunded' THEN (object ->> 'amount_refunded')::bigint END;
  created  timestamptz := CASE WHEN object ->> 'created' ~ '^[0-9]{1,12}$'
                               THEN to_timestamp((object ->> 'created')::bigint) END;
  effect   text;
  detail   text;
BEGIN
  -- The key in metadata is not proof enough: anyone who can write metadata
  -- (a connected account's owner, another system on this account) can copy
  -- a record's key, so what billguard sends must match too.
  IF event ->> 'account' IS NOT NULL THEN
    effect := 'mismatch';
    detail := format('the event comes from connected account %s, not from this Stripe account',
                     event ->> 'account');
  ELSIF (object ->> 'amount')::bigint <> rec.amount_cents OR object ->> 'currency' <> rec.currency
     OR object ->> 'customer' IS DISTINCT FROM rec.stripe_customer THEN
    effect := 'mismatch';
    detail := format('the event is about %s %s of customer %s, the record about %s %s of %s',
                     object ->> 'amount', object ->> 'currency', coalesce(object ->> 'customer', 'none'),
                     rec.amount_cents, rec.currency, rec.stripe_customer);
  ELSIF outcome IN ('charged', 'refunded') AND rec.status = 'completed' THEN
    effect := CASE WHEN charge <> rec.charge_id THEN 'other_charge'
                   WHEN outcome = 'refunded' THEN 'refunded' ELSE 'confirmed' END;
    IF effect = 'other_charge' THEN
      detail := format('charge %s, while the record completed with %s', charge, rec.charge_id);
    END IF;
  ELSIF outcome IN ('charged', 'refunded') THEN
    -- Stripe charged the customer under this key: the record says so, whatever
    -- billguard believed (a cached 500, a review, a backup restored from
    -- before the charge was recorded).
    UPDATE billguard.billing_records r
       SET status = 'completed', charge_id = charge, completed_at = now(), next_attempt_at = NULL,
           lease_expires_at = NULL, last_error = NULL, updated_at = now()
     WHERE r.idempotency_key = rec.idempotency_key;
    effect := CASE WHEN outcome = 'refunded' THEN 'refunded' ELSE 'completed' END;
  ELSIF rec.status IN ('unknown', 'needs_review') AND EXISTS (
          SELECT FROM billguard.journal j
           WHERE j.persistence_id = 'billing-' || rec.customer_id || '-' || rec.billing_period
             AND j.event_type = 'ChargeAttempted'
             AND (j.event ->> 'at')::timestamptz >= created + interval '24 hours') THEN
    -- Stripe may have forgotten the key by then (after a day at the
    -- earliest) and made another PaymentIntent with it: a decline of this
    -- older object, delivered late, says nothing about that one.
    effect := 'unchanged';
    detail := format('%s was created at %s, a day or more before the record''s last attempt',
                     object ->> 'id', created);
  ELSIF rec.status IN ('unknown', 'needs_review') THEN
    detail := billguard.stripe_event_decline(object);
    UPDATE billguard.billing_records r
       SET status = 'failed', next_attempt_at = NULL, lease_expires_at = NULL, updated_at = now(),
           last_error = concat_ws(' ', 'webhook', event ->> 'type', nullif(detail, ''))
     WHERE r.idempotency_key = rec.idempotency_key;
    effect := 'failed';
  ELSIF rec.status = 'failed' THEN
    effect := 'confirmed';
  ELSIF rec.status IN ('pending', 'dispatching') THEN
    effect := 'unchanged';
  ELSE
    effect := 'kept';
    detail := format('a %s for a %s record', event ->> 'type', rec.status);
  END IF;
  IF effect IN ('kept', 'other_charge', 'mismatch') THEN
    RAISE WARNING 'billguard webhook: % (%) for %/% changed nothing: %', event ->> 'id',
                  event ->> 'type', rec.customer_id, rec.billing_period, detail
      USING HINT = 'A person should compare the record with Stripe''s dashboard.';
  END IF;

  INSERT INTO billguard.stripe_events (event_id, event_type, object_id, customer_id, billing_period,
                                       idempotency_key, effect, detail, amount_refunded_cents,
                                       stripe_created_at)
  VALUES (event ->> 'id', event ->> 'type', object ->> 'id', rec.customer_id, rec.billing_period,
          rec.idempotency_key, effect, nullif(detail, ''), refunded,
          to_timestamp((event ->> 'created')::bigint));
  PERFORM billguard.append_billing_event(rec.customer_id, rec.billing_period, 'WebhookApplied',
    jsonb_strip_nulls(jsonb_build_object(
      'event_id', event ->> 'id', 'event_type', event ->> 'type', 'object_id', object ->> 'id',
      'effect', effect, 'previous_status', rec.status,
      'charge_id', CASE WHEN outcome IN ('charged', 'refunded') THEN charge END,
      'amount_refunded_cents', refunded,
      'fully_refunded', CASE WHEN outcome = 'refunded' THEN refunded >= rec.amount_cents END,
      'detail', nullif(detail, ''))));
  RETURN effect;
END $$;

CREATE OR REPLACE FUNCTION billguard.ingest_stripe_event(payload text, signature_header text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  -- A session that keeps a record locked must not hold every delivery (and
  -- the proxy's connections) with it: Stripe delivers a refused one again.
  SET lock_timeout = '5s'
  AS $$
DECLARE
  event jsonb;
  key   text;
  rec   billguard.billing_records;
BEGIN
  PERFORM billguard.verify_stripe_signature(payload, signature_header);
  event := billguard.stripe_event_json(payload);
  key := event -> 'data' -> 'object' -> 'metadata' ->> 'billguard_key';
  IF billguard.stripe_event_outcome(event ->> 'type') IS NULL OR key IS NULL THEN
    RETURN 'ignored';
  END IF;
  -- The record's lock serialises every event of one billing, and the
  -- dispatcher's answers with them; a second delivery of the same event
  -- finds the first one's row once it holds the lock.
  BEGIN
    SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key FOR UPDATE;
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'billing record % is locked by another session: event % was not applied',
                    key, event ->> 'id'
      USING ERRCODE = 'lock_not_available',
            HINT = 'Stripe delivers it again later; a transaction left open on the record holds it.';
  END;
  IF rec.idempotency_key IS NULL THEN
    RAISE EXCEPTION 'no billing record has the key % that event % names', key, event ->> 'id'
      USING ERRCODE = 'no_data_found',
            HINT = 'The event is for another database or key namespace billing through this Stripe account.';
  END IF;
  IF EXISTS (SELECT FROM billguard.stripe_events e WHERE e.event_id = event ->> 'id') THEN
    RETURN 'already_seen';
  END IF;
  RETURN billguard.apply_stripe_event(rec, event);
END $$;

-- ==== The scheduler never goes back to a period it passed (issue 7) ====
-- bill_day or bill_hour_utc moved later takes the calendar's due period back
-- a month; the tick billed that older period, never issued, as if it were
-- due. It now answers 'passed' while a later period whose month has ended
-- is issued (issued_after()), due_periods() no longer schedules it,
-- never_issued() starts at the first period issued, and scheduler_state()
-- counts such a period as missed (see sql/install/57_scheduler.sql).
CREATE FUNCTION billguard.issued_after(due_period text, issued jsonb, at timestamptz)
  RETURNS text
  LANGUAGE sql STABLE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT max(i.period COLLATE "C")
            FROM jsonb_array_elements_text(coalesce(issued, '[]'::jsonb)) AS i(period)
           WHERE i.period COLLATE "C" > due_period
             AND i.period COLLATE "C" < to_char(at AT TIME ZONE 'UTC', 'YYYY-MM'));

CREATE OR REPLACE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  issued   jsonb;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  -- bill_period takes the same lock: the check and the claim are one step.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period)) THEN
    outcome := 'busy';
    RETURN NEXT;
    RETURN;
  END IF;
  issued := billguard.entity_state('billing-scheduler') -> 'issued_periods';
  IF issued ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSIF billguard.issued_after(schedule.due_period, issued,
                               (SELECT s.now FROM billguard.scheduler_settings() s)) IS NOT NULL THEN
    outcome := 'passed';
  ELSE
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
  END IF;
  RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION billguard.never_issued(due_period text, issued jsonb)
  RETURNS text[]
  LANGUAGE sql STABLE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(to_char(m, 'YYYY-MM') ORDER BY m), '{}')
            FROM generate_series(
                   to_date(coalesce((SELECT min(i.p) FROM jsonb_array_elements_text(issued) AS i(p)),
                                    due_period),
                           'YYYY-MM'),
                   to_date(due_period, 'YYYY-MM'), interval '1 month') AS m
           WHERE NOT issued ? to_char(m, 'YYYY-MM'));

CREATE OR REPLACE FUNCTION billguard.due_periods()
  RETURNS TABLE (billing_period text, due_at timestamptz, records bigint, scheduled boolean)
  LANGUAGE plpgsql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  issued   jsonb;
  missed   text[];
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  issued := coalesce(billguard.entity_state('billing-scheduler') -> 'issued_periods', '[]'::jsonb);
  missed := billguard.never_issued(schedule.due_period, issued);
  IF cardinality(missed) = 0 THEN
    RETURN;    -- no reason to read billing_records
  END IF;
  RETURN QUERY
    SELECT p.period,
           billguard.bill_instant(p.period, schedule.bill_day, schedule.bill_hour_utc),
           coalesce(r.records, 0),
           p.period = schedule.due_period AND schedule.auto_bill = 'monthly'
             AND billguard.issued_after(p.period, issued,
                                        (SELECT s.now FROM billguard.scheduler_settings() s)) IS NULL
      FROM unnest(missed) AS p(period)
      LEFT JOIN (SELECT br.billing_period, count(*) AS records
                   FROM billguard.billing_records br
                  WHERE br.billing_period = ANY (missed)
                  GROUP BY br.billing_period) r ON r.billing_period = p.period
     ORDER BY p.period;
END $$;
COMMENT ON FUNCTION billguard.due_periods() IS
  'Due periods never issued; the scheduler bills only the most recent (scheduled), the rest only bill_period does.';

CREATE OR REPLACE FUNCTION billguard.scheduler_state(
    OUT enabled boolean, OUT bill_day integer, OUT bill_hour_utc integer,
    OUT next_bill_at timestamptz, OUT last_period_issued text,
    OUT last_period_issued_at timestamptz, OUT missed_periods bigint)
  LANGUAGE plpgsql STABLE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  -- The tick would bill the most recent due period (see scheduler_tick()).
  scheduled boolean;
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  enabled := schedule.auto_bill = 'monthly';
  bill_day := schedule.bill_day;
  bill_hour_utc := schedule.bill_hour_utc;
  scheduled := enabled AND NOT (state -> 'issued_periods') ? schedule.due_period
               AND billguard.issued_after(schedule.due_period, state -> 'issued_periods',
                                          (SELECT s.now FROM billguard.scheduler_settings() s)) IS NULL;
  next_bill_at := CASE WHEN NOT enabled THEN NULL
                       WHEN scheduled THEN schedule.due_at
                       ELSE schedule.next_due_at END;
  last_period_issued := state ->> 'last_issued_period';
  last_period_issued_at := (state ->> 'last_issued_at')::timestamptz;
  -- Without reading billing_records: the view may be polled.
  missed_periods := cardinality(array_remove(
    billguard.never_issued(schedule.due_period,
                           coalesce(state -> 'issued_periods', '[]'::jsonb)),
    CASE WHEN scheduled THEN schedule.due_period END));
END $$;

-- As in a fresh install, nothing of the above is granted to PUBLIC (only
-- what this section creates).
REVOKE ALL ON FUNCTION billguard.issued_after(text, jsonb, timestamptz) FROM PUBLIC;

-- ==== The scheduler's tick waits for no lock (issue 7) ====
-- A session that billed a period in a transaction still open holds
-- billing-scheduler's lock, and the tick of another period waited for it
-- after its claims: the dispatcher, and all sending of the database, stood
-- still. The tick now tries that lock as it tries the period's, and answers
-- 'busy' (see sql/install/57_scheduler.sql).
CREATE OR REPLACE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  issued   jsonb;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  -- bill_period takes the same locks: the check and the claim are one step.
  -- The dispatcher waits for no lock: a session's open transaction must not
  -- halt all sending of this database.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period))
     OR NOT pg_try_advisory_xact_lock(billguard.scheduler_lock_class(), 0) THEN
    outcome := 'busy';
    RETURN NEXT;
    RETURN;
  END IF;
  issued := billguard.entity_state('billing-scheduler') -> 'issued_periods';
  IF issued ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSIF billguard.issued_after(schedule.due_period, issued,
                               (SELECT s.now FROM billguard.scheduler_settings() s)) IS NOT NULL THEN
    outcome := 'passed';
  ELSE
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
  END IF;
  RETURN NEXT;
END $$;

-- ==== The proxy POSTs only on objects the key's budget created (issue 8) ====

CREATE OR REPLACE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  amount    bigint := vault_authorize.amount_cents;
  idem      text := vault_authorize.idempotency_key;
  k         billguard.vault_keys;
  held      billguard.vault_reservations;
  known_key boolean;   -- a reservation exists for the Idempotency-Key
  verdict   text;
  status    integer;
  error_type text := 'invalid_request_error';
  code      text;
  reason    text;
  answer    text;
  replay_request_id text;
  object_id text;      -- of a POST on an object: /v1/payment_intents/<id>/...
BEGIN
  IF octet_length(vault_authorize.secret_sha256) IS DISTINCT FROM 32 THEN
    RAISE EXCEPTION 'secret_sha256 must be 32 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.method IS NULL OR vault_authorize.method !~ '^[A-Z]{1,16}$' THEN
    RAISE EXCEPTION 'method must be an HTTP method in upper case' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.endpoint IS NULL OR vault_authorize.endpoint !~ '^/v1(/[A-Za-z0-9_]+)+$' THEN
    RAISE EXCEPTION 'endpoint must be an API path such as /v1/payment_intents, got %',
                    coalesce(quote_literal(left(vault_authorize.endpoint, 80)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.request_digest IS NULL OR vault_authorize.request_digest !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'request_digest must be 64 lower-case hex characters' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(idem) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'idempotency_key must be 1..255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount NOT BETWEEN 1 AND 99999999 THEN
    RAISE EXCEPTION 'amount must be a positive integer of at most 99999999, got %', amount
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.customer) > 255 OR octet_length(vault_authorize.currency) > 16 THEN
    RAISE EXCEPTION 'customer or currency too long' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  <<decide>>
  BEGIN
    SELECT * INTO k FROM billguard.vault_keys v WHERE v.secret_sha256 = vault_authorize.secret_sha256;
    IF NOT FOUND THEN
      status := 401; code := 'vault_key_unknown'; reason := 'unknown vault key';
      EXIT decide;
    ELSIF k.revoked_at IS NOT NULL THEN
      status := 401; code := 'vault_key_revoked'; reason := format('vault key %s was revoked', k.key_id);
      EXIT decide;
    ELSIF k.expires_at <= now() THEN
      status := 401; code := 'vault_key_expired'; reason := format('vault key %s expired', k.key_id);
      EXIT decide;
    END IF;
    IF vault_authorize.method NOT IN ('GET', 'POST')
       OR NOT EXISTS (SELECT FROM unnest(k.allowed_endpoints) e
                       WHERE vault_authorize.endpoint = e OR starts_with(vault_authorize.endpoint, e || '/')) THEN
      status := 403; code := 'endpoint_not_allowed';
      reason := format('vault key %s may call GET and POST on %s only, not %s %s', k.key_id,
                       array_to_string(k.allowed_endpoints, ', '), vault_authorize.method,
                       vault_authorize.endpoint);
      EXIT decide;
    END IF;
    -- A POST on an object (confirm, capture, update) may move money its
    -- creation counted: only one this budget created, never an object made
    -- with the real key or another budget's key, which was never counted here.
    SELECT split_part(substr(vault_authorize.endpoint, length(e) + 2), '/', 1) INTO object_id
      FROM unnest(k.allowed_endpoints) e
     WHERE vault_authorize.method = 'POST' AND starts_with(vault_authorize.endpoint, e || '/')
     ORDER BY length(e) DESC LIMIT 1;
    IF object_id IS NOT NULL
       AND NOT EXISTS (SELECT FROM billguard.vault_reservations r
                        WHERE (r.vendor, r.billing_period, r.currency) = (k.vendor, k.billing_period, k.currency)
                          AND r.status = 'settled' AND r.charge_id = object_id) THEN
      status := 403; code := 'object_not_in_budget';
      reason := format('vault key %s may POST only on objects the budget of billing_period %s created, not %s',
                       k.key_id, k.billing_period, object_id);
      EXIT decide;
    END IF;
    IF amount IS NULL THEN
      verdict := 'forwarded';
      EXIT decide;
    END IF;
    IF vault_authorize.currency IS NULL THEN
      status := 400; code := 'parameter_missing'; reason := 'Missing required param: currency.';
      EXIT decide;
    ELSIF lower(vault_authorize.currency) <> k.currency THEN
      status := 403; code := 'currency_not_allowed';
      reason := format('the budget of vault key %s is in %s, not %s', k.key_id, k.currency,
                       lower(vault_authorize.currency));
      EXIT decide;
    END IF;
    IF idem IS NULL THEN
      -- Without a key a retry is a second charge, which the cap exists to stop.
      status := 400; code := 'idempotency_key_required';
      reason := 'a request with an amount needs an Idempotency-Key';
      EXIT decide;
    END IF;

    -- Decisions on one Idempotency-Key are serialised by its own lock,
    -- taken before the reservation exists; the budget's row is locked last.
    PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency, idem);
    SELECT * INTO held FROM billguard.vault_reservations r
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, idem);
    known_key := FOUND;
    IF known_key AND held.request_digest <> vault_authorize.request_digest THEN
      status := 400; error_type := 'idempotency_error'; code := NULL;
      reason := format('Keys for idempotent requests can only be used with the same parameters they '
                       'were first used with. Try using a key other than ''%s'' if you meant to '
                       'execute a different request.', idem);
      EXIT decide;
    ELSIF known_key AND held.status = 'settled' THEN
      verdict := 'replayed'; status := held.response_status; answer := held.response_body;
      replay_request_id := held.response_request_id;
      reason := format('settled as %s at %s', held.charge_id, held.settled_at);
      EXIT decide;
    ELSIF known_key AND held.status = 'reserved' THEN
      verdict := 'reused';
      EXIT decide;
    END IF;
    -- The cap check and the reservation in one UPDATE: the budget's row lock
    -- is held from here to the commit. Once a concurrent holder commits, the
    -- UPDATE checks the cap again against the row it left.
    UPDATE billguard.vault_budgets b SET committed_cents = b.committed_cents + amount, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
       AND b.committed_cents + amount <= b.cap_cents;
    IF NOT FOUND THEN
      status := 429; code := 'spend_cap_exceeded';
      reason := format('spend cap exceeded for billing_period %s', k.billing_period);
      EXIT decide;
    END IF;
    -- Written under the budget's lock, so that concurrent reservations never
    -- share the key lock their foreign keys take on the budget and key rows.
    IF known_key THEN   -- released earlier: counted again while it is retried
      UPDATE billguard.vault_reservations r SET status = 'reserved', key_id = k.key_id
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem);
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount);
    END IF;
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id;
END $$;

-- ==== The scheduler searches first when it claims late (failure mode 3) ====
-- A database restored from a backup that lost a period's tick (or a
-- reinstall with the accounts imported again, or auto_bill switched on for
-- a period billed elsewhere) ticked for that period long after it became
-- due; its records were new, so the dispatcher sent them as plain charges
-- with keys Stripe had pruned, and every customer was charged twice. A tick
-- more than billguard.idempotency_window after the period became due now
-- marks each record it claims (billing_records.search_first_reason), and
-- the dispatcher searches for its charge before sending one, on every claim
-- (see sql/install/57_scheduler.sql and 70_dispatch_queue.sql).
ALTER TABLE billguard.billing_records ADD COLUMN search_first_reason text;

-- bill_period's body is bound to claim_period(text): it moves to the new
-- claim_period before the old one goes.
ALTER FUNCTION billguard.claim_period(text) RENAME TO claim_period_before_search_first;
CREATE FUNCTION billguard.claim_period(period text, search_first_reason text DEFAULT NULL)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint,
                 cancelled bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  -- The anti-join below reads billing_records while the same statement
  -- inserts into it; planned as a nested loop over a seq scan (likely while
  -- the table is new and unanalysed) it would rescan the growing table per
  -- account. Hash and merge joins keep a large period linear.
  SET enable_nestloop = off
  AS $$
#variable_conflict use_column
DECLARE
  ns        text := billguard.key_namespace();
  scheduler_state jsonb;
BEGIN
  PERFORM billguard.check_billing_period(period);

  -- Claims of one period are serialised: bill_period holds the period's
  -- lock exclusively, bill_customer holds it shared. Once we have it, every
  -- earlier claim is committed and visible to the next statement, so a plain
  -- set-based INSERT of the accounts without a record claims each exactly
  -- once; no per-row speculative insertion, no row-order deadlocks.
  PERFORM pg_advisory_xact_lock(billguard.period_lock_class(), hashtext(period));
  BEGIN
    WITH claimed AS (
      INSERT INTO billguard.billing_records AS r
             (customer_id, billing_period, idempotency_key, amount_cents, currency,
              stripe_customer, payment_method, search_first_reason)
      SELECT a.customer_id, period, billguard.idempotency_key(a.customer_id, period, ns),
             a.amount_cents, a.currency, a.stripe_customer, a.payment_method,
             claim_period.search_first_reason
        FROM billguard.accounts a
       WHERE a.active
         AND NOT EXISTS (SELECT FROM billguard.billing_records e
                          WHERE e.customer_id = a.customer_id AND e.billing_period = period)
      RETURNING r.customer_id, r.idempotency_key, r.amount_cents, r.currency, r.created_at
    ), journaled AS (
      INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
      SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
             billguard.billing_initiated_event(c.customer_id, period, c.idempotency_key,
                                               c.amount_cents, c.currency, c.created_at)
        FROM claimed c
      RETURNING 1
    )
    SELECT count(*) INTO initiated FROM journaled;
  EXCEPTION WHEN unique_violation THEN
    -- Only a REPEATABLE READ / SERIALIZABLE caller whose snapshot predates
    -- another claim gets here; nothing of this call is kept.
    RAISE EXCEPTION 'billing records of % were claimed concurrently; retry the transaction', period
      USING ERRCODE = 'serialization_failure';
  END;

  -- Every record of the period (others' claims committed before we took the
  -- lock), whatever its account has become since: period_status's counts.
  SELECT count(*) FILTER (WHERE r.status = 'completed'),
         count(*) FILTER (WHERE r.status IN ('pending', 'dispatching', 'unknown', 'needs_review')),
         count(*) FILTER (WHERE r.status IN ('failed', 'blocked')),
         count(*) FILTER (WHERE r.status = 'cancelled')
    INTO already_completed, in_progress, failed, cancelled
    FROM billguard.billing_records r
   WHERE r.billing_period = period;
  in_progress := in_progress - initiated;   -- our own claims are pending too

  -- The first time a period is billed, the scheduler entity records it.
  -- The advisory lock serialises appends to that one entity.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  scheduler_state := billguard.entity_state('billing-scheduler');
  IF NOT (scheduler_state -> 'issued_periods') ? period THEN
    PERFORM billguard.append_event('billing-scheduler', (scheduler_state ->> 'seq_nr')::bigint,
                                   'BillingTickIssued',
                                   jsonb_build_object('billing_period', period,
                                                      'issued_at', clock_timestamp()));
  END IF;

  IF initiated > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN NEXT;
END $$;

CREATE OR REPLACE FUNCTION billguard.bill_period(billing_period text)
  RETURNS TABLE (billing_period text, initiated bigint, already_completed bigint,
                 in_progress bigint, failed bigint, cancelled bigint)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT bill_period.billing_period, c.initiated, c.already_completed, c.in_progress, c.failed,
           c.cancelled
      FROM billguard.claim_period(bill_period.billing_period) c;
  END;
DROP FUNCTION billguard.claim_period_before_search_first(text);
REVOKE ALL ON FUNCTION billguard.claim_period(text, text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION billguard.claim_due_records(max_rows integer, lease interval,
                                            idempotency_window interval, endpoint text)
  RETURNS TABLE (idempotency_key text, attempt integer, action text, customer_id text,
                 billing_period text, stripe_endpoint text, request_body text,
                 unknown_cycles integer)
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
                                           r.stripe_customer, r.payment_method))
      FROM due
     WHERE r.idempotency_key = due.idempotency_key
    RETURNING r.idempotency_key, r.attempts, r.customer_id, r.billing_period,
              r.stripe_endpoint, r.request_body, r.unknown_cycles,
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
         c.stripe_endpoint, c.request_body, coalesce(c.unknown_cycles, 0)::integer
    FROM claimed c;
END $$;

-- The tick answers search_first_reason too: a new result type.
DROP FUNCTION billguard.scheduler_tick();
CREATE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz, search_first_reason text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  issued   jsonb;
  tick_at  timestamptz := (SELECT s.now FROM billguard.scheduler_settings() s);
  trusted  interval := current_setting('billguard.idempotency_window')::interval;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  -- bill_period takes the same locks: the check and the claim are one step.
  -- The dispatcher waits for no lock: a session's open transaction must not
  -- halt all sending of this database.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period))
     OR NOT pg_try_advisory_xact_lock(billguard.scheduler_lock_class(), 0) THEN
    outcome := 'busy';
    RETURN NEXT;
    RETURN;
  END IF;
  issued := billguard.entity_state('billing-scheduler') -> 'issued_periods';
  IF issued ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSIF billguard.issued_after(schedule.due_period, issued, tick_at) IS NOT NULL THEN
    outcome := 'passed';
  ELSE
    IF tick_at > schedule.due_at + trusted THEN
      search_first_reason := format(
        'the scheduler claimed %s %s after it became due (%s), past billguard.idempotency_window '
        '(%s): a charge made for it before (a restored backup that lost the tick) may have a key '
        'Stripe has forgotten',
        schedule.due_period, justify_hours(date_trunc('second', tick_at - schedule.due_at)),
        to_char(schedule.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
        current_setting('billguard.idempotency_window'));
    END IF;
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period, search_first_reason);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
    IF initiated = 0 THEN
      search_first_reason := NULL;   -- no record carries it
    END IF;
  END IF;
  RETURN NEXT;
END $$;
REVOKE ALL ON FUNCTION billguard.scheduler_tick() FROM PUBLIC;


-- ==== The issuer token obtains the dispatcher's key only, within the operator's ceiling (issue 8) ====

DROP FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean);
DROP FUNCTION billguard.vault_issue_key(text, text, numeric, text[], timestamptz, boolean);

-- The work of issue_vault_key(); PL/pgSQL cannot name an input and an
-- output column alike, as issue_vault_key's public signature does.
CREATE FUNCTION billguard.vault_issue_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean, issuer_max_period_usd numeric)
  RETURNS TABLE (secret text, new_key_id text, cap_cents bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  cap     bigint := billguard.usd_to_cents(period_usd_cap);
  budget  billguard.vault_budgets;
BEGIN
  IF vendor IS NULL OR vendor !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION 'vendor must be 1..40 lower-case letters, digits or _ (e.g. stripe), got %',
                    coalesce(quote_literal(left(vendor, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(billing_period);
  IF NOT billguard.are_vault_endpoints(allowed_endpoints) THEN
    RAISE EXCEPTION 'allowed_endpoints must be 1..20 API paths such as /v1/payment_intents, got %',
                    coalesce(left(allowed_endpoints::text, 200), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF expires_at IS NULL OR expires_at <= now() THEN
    RAISE EXCEPTION 'expires_at must be in the future, got %', coalesce(expires_at::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF livemode IS NULL THEN
    RAISE EXCEPTION 'livemode must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The issuer token's request (issuer_max_period_usd given; the admin's is
  -- NULL): the dispatcher's, never more. Its key (vault_key_request) is for
  -- vendor stripe and the charge endpoints and their search, and it creates
  -- a budget only up to the operator's ceiling. Where the period's budget
  -- exists, the cap check below applies as to the admin: another cap is 409
  -- naming the budget's, and joining at it raises nothing, so a budget an
  -- admin made larger than the ceiling is still joined. The issuer is who
  -- the cap guards against (billing software, a compromised billing
  -- database): another vendor name, other endpoints or a larger new budget
  -- are the admin's.
  IF issuer_max_period_usd IS NOT NULL THEN
    IF vendor <> 'stripe' THEN
      RAISE EXCEPTION 'the issuer token may ask for vendor stripe only, not %', quote_literal(vendor)
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key.';
    END IF;
    IF NOT allowed_endpoints <@ ARRAY['/v1/payment_intents', '/v1/payment_intents/search',
                                      '/v1/charges', '/v1/charges/search'] THEN
      RAISE EXCEPTION 'the issuer token may ask for /v1/payment_intents, /v1/charges and their /search only, not %',
                      array_to_string(allowed_endpoints, ', ')
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key.';
    END IF;
    IF cap > billguard.usd_to_cents(issuer_max_period_usd)
       AND NOT EXISTS (SELECT FROM billguard.vault_budgets b
                        WHERE (b.vendor, b.billing_period, b.currency)
                            = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')) THEN
      RAISE EXCEPTION 'the issuer token may create a budget of at most % USD (--issuer-max-period-usd), not % USD for billing_period %',
                      to_char(billguard.usd_to_cents(issuer_max_period_usd) / 100.0, 'FM999999999999990.00'),
                      to_char(cap / 100.0, 'FM999999999999990.00'), billing_period
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Have an admin create the period''s budget (POST /keys with the admin token), or raise the ceiling.';
    END IF;
  END IF;

  INSERT INTO billguard.vault_budgets AS b (vendor, billing_period, currency, cap_cents)
  VALUES (vendor, billing_period, 'usd', cap)
  ON CONFLICT DO NOTHING;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency)
       = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')
     FOR UPDATE;
  IF budget.cap_cents <> cap THEN
    RAISE EXCEPTION 'billing_period % of % already has a cap of % USD', billing_period, vendor,
                    to_char(budget.cap_cents / 100.0, 'FM999999999999990.00')
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A second key of a period joins its budget and never changes its cap.',
            HINT = 'Ask with the same period_usd_cap, or have an admin raise the cap.';
  END IF;

  secret := CASE WHEN livemode THEN 'vk_live_' ELSE 'vk_test_' END || billguard.random_base62(32);
  new_key_id := 'vkey_' || billguard.random_base62(16);
  cap_cents := cap;
  INSERT INTO billguard.vault_keys (key_id, secret_sha256, vendor, billing_period, currency,
                                    allowed_endpoints, livemode, expires_at)
  VALUES (new_key_id, sha256(convert_to(secret, 'UTF8')), vendor, billing_period, 'usd',
          allowed_endpoints, livemode, expires_at);

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (new_key_id, vendor, billing_period, 'usd', 'issued',
          format('cap %s USD, endpoints %s, expires %s',
                 to_char(cap / 100.0, 'FM999999999999990.00'),
                 array_to_string(allowed_endpoints, ' '), expires_at));

  -- The scheduler entity records every key issued; the advisory lock
  -- serialises appends to it, as bill_period's do.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'VaultKeyIssued',
                                 jsonb_build_object('billing_period', billing_period,
                                                    'key_id', new_key_id,
                                                    'cap_usd', round(cap / 100.0, 2),
                                                    'vendor', vendor));
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.issue_vault_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean DEFAULT true,
                                          issuer_max_period_usd numeric DEFAULT NULL)
  RETURNS TABLE (vault_key text, key_id text, cap_usd numeric, vendor text)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT k.secret, k.new_key_id, round(k.cap_cents / 100.0, 2), issue_vault_key.vendor
      FROM billguard.vault_issue_key(issue_vault_key.vendor, issue_vault_key.billing_period,
                                     issue_vault_key.period_usd_cap, issue_vault_key.allowed_endpoints,
                                     issue_vault_key.expires_at, issue_vault_key.livemode,
                                     issue_vault_key.issuer_max_period_usd) k;
  END;
COMMENT ON FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric) IS
  'A new vault key (vk_live_/vk_test_ + 32 base62, returned once) spending the period''s budget; 23505 when the budget has another cap; with issuer_max_period_usd (the issuer token''s request) 42501 beyond vendor stripe, the charge endpoints and that ceiling for a new budget.';

REVOKE ALL ON FUNCTION
  billguard.vault_issue_key(text, text, numeric, text[], timestamptz, boolean, numeric),
  billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric) FROM PUBLIC;

-- ==== Every function is labelled as its body earns: IMMUTABLE and STABLE functions are PARALLEL SAFE ====
-- PostgreSQL's own rule (opr_sanity) is that an IMMUTABLE function is never
-- PARALLEL UNSAFE. stripe_event_json loses its EXCEPTION block (a
-- subtransaction is an error in a parallel query): ingest_stripe_event
-- reports a payload that is not JSON, with the same 22023 as before.
ALTER FUNCTION billguard.error_text(jsonb) PARALLEL SAFE;
ALTER FUNCTION billguard.events(text, bigint, bigint, bigint) PARALLEL SAFE;
ALTER FUNCTION billguard.entity_state(text) PARALLEL SAFE;
ALTER FUNCTION billguard.scheduler_settings() PARALLEL SAFE;
ALTER FUNCTION billguard.bill_instant(text, integer, integer) PARALLEL SAFE;
ALTER FUNCTION billguard.scheduler_calendar(timestamptz, integer, integer) PARALLEL SAFE;
ALTER FUNCTION billguard.current_schedule() PARALLEL SAFE;
ALTER FUNCTION billguard.issued_after(text, jsonb, timestamptz) PARALLEL SAFE;
ALTER FUNCTION billguard.never_issued(text, jsonb) PARALLEL SAFE;
ALTER FUNCTION billguard.due_periods() PARALLEL SAFE;
ALTER FUNCTION billguard.scheduler_state() PARALLEL SAFE;
ALTER FUNCTION billguard.written_by_this_transaction(xid) PARALLEL SAFE;
ALTER FUNCTION billguard.period_status(text) PARALLEL SAFE;
ALTER FUNCTION billguard.vault_key_status(text) PARALLEL SAFE;
ALTER FUNCTION billguard.vault_key_request(text, text, numeric, bigint) PARALLEL SAFE;

-- The payload as jsonb, or 22023 naming what keeps it from being a Stripe
-- event billguard can apply; a payload that is not JSON at all raises the
-- cast's own error (ingest_stripe_event reports it as 22023). No EXCEPTION
-- block: a subtransaction would make it unsafe in a parallel query.
CREATE OR REPLACE FUNCTION billguard.stripe_event_json(payload text) RETURNS jsonb
  LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  event   jsonb := payload::jsonb;
  object  jsonb;
  problem text;
BEGIN
  object := event -> 'data' -> 'object';
  problem := CASE
    WHEN jsonb_typeof(event) IS DISTINCT FROM 'object' THEN 'it is not a JSON object'
    WHEN coalesce(event ->> 'id', '') !~ '^evt_[A-Za-z0-9_]{1,250}$' THEN 'id is not an event id (evt_...)'
    WHEN jsonb_typeof(event -> 'type') IS DISTINCT FROM 'string' THEN 'type is missing'
    WHEN jsonb_typeof(event -> 'created') IS DISTINCT FROM 'number'
      OR (event ->> 'created') !~ '^[0-9]{1,12}$' THEN 'created is not a unix time'
    WHEN jsonb_typeof(object) IS DISTINCT FROM 'object' THEN 'data.object is missing'
  END;
  IF problem IS NULL AND billguard.stripe_event_outcome(event ->> 'type') IS NOT NULL THEN
    problem := CASE
      WHEN object ->> 'object' IS DISTINCT FROM split_part(event ->> 'type', '.', 1)
        THEN format('data.object is not a %s', split_part(event ->> 'type', '.', 1))
      WHEN coalesce(object ->> 'id', '') !~ '^(pi|ch)_[A-Za-z0-9_]{1,250}$'
        THEN 'data.object.id is not a PaymentIntent or Charge id'
      WHEN jsonb_typeof(object -> 'amount') IS DISTINCT FROM 'number'
        OR (object ->> 'amount') !~ '^[0-9]{1,15}$' THEN 'data.object.amount is not an amount in cents'
      WHEN jsonb_typeof(object -> 'currency') IS DISTINCT FROM 'string' THEN 'data.object.currency is missing'
      WHEN jsonb_typeof(object -> 'metadata') IS DISTINCT FROM 'object' THEN 'data.object.metadata is missing'
      WHEN object -> 'metadata' ? 'billguard_key'
       AND coalesce(object -> 'metadata' ->> 'billguard_key', '') !~ '^[0-9a-f]{32}$'
        THEN 'data.object.metadata.billguard_key is not a billguard key'
      WHEN event ->> 'type' = 'charge.refunded'
       AND (jsonb_typeof(object -> 'amount_refunded') IS DISTINCT FROM 'number'
            OR (object ->> 'amount_refunded') !~ '^[0-9]{1,15}$')
        THEN 'data.object.amount_refunded is not an amount in cents'
    END;
  END IF;
  IF problem IS NOT NULL THEN
    RAISE EXCEPTION 'the webhook payload is not a Stripe event billguard can apply: %', problem
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN event;
END $$;

-- A delivery of Stripe's webhook endpoint, as billguard-proxy passes it on
-- (POST /webhooks/stripe): the raw body and the Stripe-Signature header.
-- Returns the effect on the record (see stripe_events), 'already_seen' for
-- an event applied before, or 'ignored' for an event about something
-- billguard did not charge (another type, an object without
-- metadata.billguard_key). A bad signature, a stale timestamp or a payload
-- that is not such an event is 22023, a key no record holds P0002, a record
-- another session keeps locked for 5 s 55P03; nothing changes then.
CREATE OR REPLACE FUNCTION billguard.ingest_stripe_event(payload text, signature_header text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  -- A session that keeps a record locked must not hold every delivery (and
  -- the proxy's connections) with it: Stripe delivers a refused one again.
  SET lock_timeout = '5s'
  AS $$
DECLARE
  event jsonb;
  key   text;
  rec   billguard.billing_records;
BEGIN
  PERFORM billguard.verify_stripe_signature(payload, signature_header);
  BEGIN
    event := billguard.stripe_event_json(payload);
  EXCEPTION WHEN invalid_text_representation OR untranslatable_character THEN
    RAISE EXCEPTION 'the webhook payload is not JSON: %', SQLERRM
      USING ERRCODE = 'invalid_parameter_value';
  END;
  key := event -> 'data' -> 'object' -> 'metadata' ->> 'billguard_key';
  IF billguard.stripe_event_outcome(event ->> 'type') IS NULL OR key IS NULL THEN
    RETURN 'ignored';
  END IF;
  -- The record's lock serialises every event of one billing, and the
  -- dispatcher's answers with them; a second delivery of the same event
  -- finds the first one's row once it holds the lock.
  BEGIN
    SELECT * INTO rec FROM billguard.billing_records r WHERE r.idempotency_key = key FOR UPDATE;
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'billing record % is locked by another session: event % was not applied',
                    key, event ->> 'id'
      USING ERRCODE = 'lock_not_available',
            HINT = 'Stripe delivers it again later; a transaction left open on the record holds it.';
  END;
  IF rec.idempotency_key IS NULL THEN
    RAISE EXCEPTION 'no billing record has the key % that event % names', key, event ->> 'id'
      USING ERRCODE = 'no_data_found',
            HINT = 'The event is for another database or key namespace billing through this Stripe account.';
  END IF;
  IF EXISTS (SELECT FROM billguard.stripe_events e WHERE e.event_id = event ->> 'id') THEN
    RETURN 'already_seen';
  END IF;
  RETURN billguard.apply_stripe_event(rec, event);
END $$;

-- ==== The archive goes only into a schema the extension's owner owns ====
-- archive_history() refused nothing about its schema: one a non-superuser
-- had created beforehand received the billing history, and that role could
-- then drop it. Such a schema is now refused (42501); a new one is created
-- owned by the extension's owner.
-- Retiring billguard and keeping its history: every table that holds users'
-- data (the tables pg_dump carries) leaves the extension for archive_schema,
-- read-only, and DROP EXTENSION billguard is then allowed. Refused while a
-- record may still be sent (pending, dispatching, unknown): let those settle,
-- or cancel the never-sent ones, first. Only the extension's owner can run it.
-- The archive goes only into a schema it creates (owned by the extension's
-- owner) or one that owner owns already: whoever owns a schema may drop
-- every table in it, so a schema another role created beforehand would hand
-- that role the billing history.
CREATE OR REPLACE FUNCTION billguard.archive_history(archive_schema text)
  RETURNS TABLE (archived_table text, row_count bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  extension oid := (SELECT e.oid FROM pg_extension e WHERE e.extname = 'billguard');
  history regclass[] := (SELECT e.extconfig FROM pg_extension e WHERE e.oid = extension);
  extension_owner oid := (SELECT e.extowner FROM pg_extension e WHERE e.oid = extension);
  schema_owner oid := (SELECT n.nspowner FROM pg_namespace n WHERE n.nspname = archive_schema);
  unsettled bigint;
  dependent record;
  history_table regclass;
BEGIN
  IF archive_schema IS NULL OR archive_schema IN ('', 'billguard') THEN
    RAISE EXCEPTION 'archive_schema must name a schema other than billguard'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF schema_owner <> extension_owner THEN
    RAISE EXCEPTION 'schema % is owned by %, not by %, the owner of billguard: its owner could drop the archived history',
                    quote_ident(archive_schema), schema_owner::regrole, extension_owner::regrole
      USING ERRCODE = 'insufficient_privilege',
            HINT = format('Name a schema that does not exist: archive_history creates it, owned by %s.',
                          extension_owner::regrole);
  END IF;
  -- Nothing claims or records while the tables move.
  EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', array_to_string(history, ', '));
  SELECT count(*) INTO unsettled FROM billguard.billing_records r
   WHERE r.status IN ('pending', 'dispatching', 'unknown');
  IF unsettled > 0 THEN
    RAISE EXCEPTION '% billing records may still be sent to Stripe (pending, dispatching or unknown)',
                    unsettled
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Let the dispatcher settle them, or cancel the never-sent ones with '
                   'billguard.cancel_record(), then archive.';
  END IF;

  IF schema_owner IS NULL THEN
    -- Not IF NOT EXISTS: a schema created since the check above is refused.
    EXECUTE format('CREATE SCHEMA %I AUTHORIZATION %I', archive_schema,
                   pg_get_userbyid(extension_owner));
  END IF;
  EXECUTE format($f$
    CREATE FUNCTION %I.refuse_change() RETURNS trigger LANGUAGE plpgsql AS $body$
    BEGIN
      RAISE EXCEPTION '%%.%% is archived billing history: %% refused', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
    END $body$ $f$, archive_schema);

  -- Triggers and CHECK constraints that call the extension's functions would
  -- keep DROP EXTENSION from dropping those; the archive is read-only instead.
  FOR dependent IN
    SELECT DISTINCT coalesce(t.tgrelid, c.conrelid)::regclass AS history_table,
                    coalesce(t.tgname, c.conname) AS name, t.oid IS NOT NULL AS is_trigger
      FROM pg_depend d
      JOIN pg_depend member ON member.classid = 'pg_proc'::regclass AND member.objid = d.refobjid
                           AND member.refclassid = 'pg_extension'::regclass
                           AND member.refobjid = extension AND member.deptype = 'e'
      LEFT JOIN pg_trigger t ON d.classid = 'pg_trigger'::regclass AND t.oid = d.objid
      LEFT JOIN pg_constraint c ON d.classid = 'pg_constraint'::regclass AND c.oid = d.objid
     WHERE d.refclassid = 'pg_proc'::regclass AND coalesce(t.tgrelid, c.conrelid) = ANY (history)
  LOOP
    EXECUTE CASE WHEN dependent.is_trigger
                 THEN format('DROP TRIGGER %I ON %s', dependent.name, dependent.history_table)
                 ELSE format('ALTER TABLE %s DROP CONSTRAINT %I', dependent.history_table, dependent.name)
            END;
  END LOOP;

  FOREACH history_table IN ARRAY history LOOP
    EXECUTE format('ALTER EXTENSION billguard DROP TABLE %s', history_table);
    EXECUTE format('ALTER TABLE %s SET SCHEMA %I', history_table, archive_schema);
    EXECUTE format('CREATE TRIGGER archived_read_only BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE '
                   'ON %s FOR EACH STATEMENT EXECUTE FUNCTION %I.refuse_change()',
                   history_table, archive_schema);
    archived_table := history_table::text;
    EXECUTE format('SELECT count(*) FROM %s', history_table) INTO row_count;
    RETURN NEXT;
  END LOOP;
END $$;

-- ==== Schema billguard is no one's but a superuser's, and every call passes exact types ====
-- CREATE EXTENSION billguard now refuses a schema billguard that exists
-- already unless a superuser owns it, it is empty and it grants CREATE to
-- superusers only (05_schema_guard.sql). A database updated here was
-- installed before that check: the update refuses one whose schema another
-- role owns or may create in, or that holds functions the extension did not
-- create (one could be called in place of billguard's, by the dispatcher, as
-- a superuser). billguard's calls of retry_delay pass its exact types.
DO $guard$
DECLARE
  schema_oid oid := 'billguard'::regnamespace;
  owner      oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.oid = schema_oid);
  may_create text;
  strangers  text;
BEGIN
  IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = owner) THEN
    RAISE EXCEPTION 'schema billguard is owned by %, who is not a superuser', owner::regrole
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'The owner of a schema can drop what it holds, and add functions to it that billguard''s calls could resolve to.',
            HINT = 'ALTER SCHEMA billguard OWNER TO a superuser (look at what its owner added to it first), then ALTER EXTENSION billguard UPDATE again.';
  END IF;
  SELECT string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, ', ')
    INTO may_create
    FROM pg_catalog.pg_namespace n, LATERAL pg_catalog.aclexplode(n.nspacl) a
   WHERE n.oid = schema_oid AND a.privilege_type = 'CREATE'
     AND NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = a.grantee), false);
  IF may_create IS NOT NULL THEN
    RAISE EXCEPTION 'schema billguard grants CREATE to %', may_create
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'A role that can create functions in schema billguard could have one of them called in place of billguard''s.',
            HINT = 'REVOKE CREATE ON SCHEMA billguard FROM those roles, then ALTER EXTENSION billguard UPDATE again.';
  END IF;
  SELECT string_agg(format('billguard.%I(%s)', p.proname, pg_catalog.pg_get_function_identity_arguments(p.oid)),
                    ', ' ORDER BY p.proname, p.oid)
    INTO strangers
    FROM pg_catalog.pg_proc p
   WHERE p.pronamespace = schema_oid
     AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d
                      WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
                        AND d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e');
  IF strangers IS NOT NULL THEN
    RAISE EXCEPTION 'schema billguard holds functions billguard did not create: %', strangers
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'One of them could be called in place of billguard''s own.',
            HINT = 'Look at them and drop them, then ALTER EXTENSION billguard UPDATE again.';
  END IF;
END $guard$;

-- Records a batch of answers the dispatcher read and judged
-- (common/stripe_response.cpp), in one statement: answers is a JSON array of
-- {key, attempt, search, outcome, http_status, charge_id, replayed,
-- request_id, error_type, error_code, decline_code, message, body_excerpt}.
-- What each outcome does to its record, and the event it journals (every
-- event that records an answer carries Stripe's Request-Id, what Stripe
-- support asks for):
--   an answer to a charge:
--     completed     charged: charge_id                      BillingCompleted
--     failed        not charged (a decline, a 4xx)           BillingFailed, terminal
--     retry         again after retry_delay(attempt)         BillingFailed, not terminal
--     throttled     a 429 or 409: the same, backoff capped at a minute
--     unknown       a cached 500: search after settle_delay,
--                   unknown_cycles + 1                       ChargeUnknown
--     needs_review  a person must look; never re-sent        NeedsReview
--     blocked       refused by billguard-proxy's spend cap (nothing was
--                   sent upstream); terminal, never re-sent   BillingBlocked
--     paused        the API key was refused: not counted     -
--     not_sent      never left: not counted, due again (the
--                   dispatcher holds off while Stripe is
--                   unreachable)                             ChargeNotSent
--   an answer to a search for the record's charge:
--     completed     found charged: charge_id                 ChargeReconciled
--     absent        not found: nothing changes, the dispatcher sends the
--                   charge now with the same key and lease
--     needs_review  not found after max_unknown_cycles indeterminate
--                   answers: re-sending would only get the cached 500
--                   replayed; never re-sent                  NeedsReview
--     retry         the search told nothing: unknown, again after retry_delay
--     paused        the API key was refused: unknown, not counted
--     not_sent      never left: the same
-- A settled record (completed, failed, needs_review, blocked) leaves the dispatch
-- queue: its next_attempt_at becomes NULL. One result per answer, in
-- order: 'recorded', or 'stale' when the record is no longer that attempt's
-- (its lease was taken over, an operator requeued it: a late answer must not
-- overwrite a newer state), or 'locked' when another session holds its row:
-- the dispatcher never waits for a row, so one held lock cannot halt all
-- billing (see missed_attempt). Rows are found by their primary key alone,
-- the one plan whatever the statistics say (after a crash they say the
-- table is empty): the planner is held to index lookups in nested loops.
CREATE OR REPLACE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
  RETURNS TABLE (recorded text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
DECLARE
  unknown_outcome text;
BEGIN
  SELECT a.search || '/' || a.outcome INTO unknown_outcome
    FROM jsonb_to_recordset(answers) AS a(search boolean, outcome text)
   WHERE NOT coalesce(a.search IS NOT NULL AND a.outcome IN ('completed', 'retry', 'paused', 'not_sent')
                       OR a.search = false AND a.outcome IN ('failed', 'throttled', 'unknown', 'needs_review', 'blocked')
                       OR a.search AND a.outcome IN ('absent', 'needs_review'), false)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no such outcome of an answer (search/outcome): %', unknown_outcome
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH answer AS (
    SELECT *
      FROM ROWS FROM (jsonb_to_recordset(answers) AS (
             key text, attempt integer, search boolean, outcome text, http_status integer,
             charge_id text, replayed boolean, request_id text, error_type text, error_code text,
             decline_code text, message text, body_excerpt text))
           WITH ORDINALITY AS a(key, attempt, search, outcome, http_status, charge_id, replayed,
                                request_id, error_type, error_code, decline_code, message,
                                body_excerpt, position)
  ), locked AS (
    SELECT r.idempotency_key, r.customer_id, r.billing_period, r.status, r.attempts
      FROM billguard.billing_records r
     WHERE r.idempotency_key IN (SELECT a.key FROM answer a)
       FOR UPDATE SKIP LOCKED
  ), mine AS (   -- the answers whose attempt is still their record's
    SELECT a.*, l.customer_id, l.billing_period,
           CASE WHEN a.search THEN 'search ' ELSE '' END || a.outcome AS what,
           jsonb_strip_nulls(jsonb_build_object(
             'http_status', nullif(a.http_status, 0), 'type', a.error_type, 'code', a.error_code,
             'decline_code', a.decline_code, 'message', a.message, 'body', a.body_excerpt,
             'request_id', a.request_id, 'attempt', a.attempt)) AS detail
      FROM answer a
      JOIN locked l ON l.idempotency_key = a.key AND l.status = 'dispatching' AND l.attempts = a.attempt
  ), effect AS (
    SELECT m.key, m.customer_id, m.billing_period, m.what,
           CASE WHEN m.what IN ('completed', 'search completed') THEN m.charge_id END AS charge_id,
           CASE m.what
             WHEN 'completed' THEN 'completed' WHEN 'search completed' THEN 'completed'
             WHEN 'failed' THEN 'failed' WHEN 'needs_review' THEN 'needs_review'
             WHEN 'search needs_review' THEN 'needs_review'
             WHEN 'blocked' THEN 'blocked'
             WHEN 'retry' THEN 'pending' WHEN 'throttled' THEN 'pending'
             WHEN 'paused' THEN 'pending' WHEN 'not_sent' THEN 'pending'
             WHEN 'search absent' THEN NULL   -- nothing changes
             ELSE 'unknown'                   -- unknown, search retry, search paused, search not_sent
           END AS status,
           -- an attempt that provably charged nothing and told nothing does not count
           CASE WHEN m.outcome IN ('paused', 'not_sent') THEN -1 ELSE 0 END AS attempts_delta,
           CASE m.what
             WHEN 'retry' THEN now() + billguard.retry_delay(m.attempt, 900::double precision)
             -- a rate limit or a key still in use backs off a minute at most
             WHEN 'throttled' THEN now() + billguard.retry_delay(m.attempt, 60::double precision)
             -- search is eventually consistent: "absent" only after the settle delay
             WHEN 'unknown' THEN now() + settle_delay
             WHEN 'search retry' THEN now() + billguard.retry_delay(m.attempt, 900::double precision)
             WHEN 'paused' THEN now() WHEN 'not_sent' THEN now()
             WHEN 'search paused' THEN now() WHEN 'search not_sent' THEN now()
           END AS next_attempt_at,   -- NULL: settled, out of the queue
           m.what IN ('paused', 'search paused', 'search not_sent') AS keeps_error,
           CASE
             WHEN m.what IN ('completed', 'search completed') THEN NULL
             WHEN m.what = 'not_sent' THEN 'not sent: ' || m.message
             WHEN m.what IN ('search retry', 'search needs_review') THEN m.message
             ELSE billguard.error_text(m.detail)
           END AS last_error,
           CASE m.what
             WHEN 'completed' THEN 'BillingCompleted' WHEN 'search completed' THEN 'ChargeReconciled'
             WHEN 'failed' THEN 'BillingFailed' WHEN 'retry' THEN 'BillingFailed'
             WHEN 'throttled' THEN 'BillingFailed' WHEN 'unknown' THEN 'ChargeUnknown'
             WHEN 'needs_review' THEN 'NeedsReview' WHEN 'not_sent' THEN 'ChargeNotSent'
             WHEN 'search needs_review' THEN 'NeedsReview'
             WHEN 'blocked' THEN 'BillingBlocked'
           END AS event_type,
           CASE m.what
             WHEN 'completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'replayed', coalesce(m.replayed, false),
               'http_status', m.http_status, 'attempt', m.attempt, 'request_id', m.request_id))
             WHEN 'search completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'via', 'search', 'attempt', m.attempt,
               'request_id', m.request_id))
             WHEN 'failed' THEN m.detail || jsonb_build_object('terminal', true)
             WHEN 'retry' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'throttled' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'unknown' THEN m.detail
             WHEN 'needs_review' THEN m.detail
             WHEN 'search needs_review' THEN m.detail || jsonb_build_object('via', 'search')
             WHEN 'blocked' THEN m.detail
             WHEN 'not_sent' THEN jsonb_build_object('attempt', m.attempt, 'message', m.message)
           END AS event
      FROM mine m
  ), updated AS (
    UPDATE billguard.billing_records r
       SET status = e.status,
           attempts = r.attempts + e.attempts_delta,
           unknown_cycles = CASE WHEN e.what = 'unknown'
                                 THEN least(coalesce(r.unknown_cycles, 0) + 1, 32767)
                                 ELSE r.unknown_cycles END,
           next_attempt_at = e.next_attempt_at,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.keeps_error THEN r.last_error ELSE e.last_error END,
           charge_id = coalesce(e.charge_id, r.charge_id),
           completed_at = CASE WHEN e.status = 'completed' THEN now() ELSE r.completed_at END,
           updated_at = now()
      FROM effect e
     WHERE r.idempotency_key = e.key AND e.status IS NOT NULL
  ), journaled AS (
    -- The record's row lock serialises all writers of its entity, so
    -- max + 1 cannot race.
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           e.customer_id, e.event_type, e.event
      FROM effect e
     CROSS JOIN LATERAL (SELECT 'billing-' || e.customer_id || '-' || e.billing_period AS id) p
     WHERE e.event_type IS NOT NULL
  )
  SELECT CASE WHEN a.position IN (SELECT m.position FROM mine m) THEN 'recorded'
              WHEN a.key IN (SELECT l.idempotency_key FROM locked l) THEN 'stale'
              ELSE billguard.missed_attempt(a.key, a.attempt)
         END
    FROM answer a
   ORDER BY a.position;
END $$;

-- One answer to a search for the record's charge (see record_answers).
CREATE OR REPLACE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', true, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'request_id', request_id,
            'message', message)),
          NULL::interval) a);

-- Deactivating an account withdraws its billings that were never sent.
-- SECURITY DEFINER: whoever maintains accounts need not write billing_records.
CREATE OR REPLACE FUNCTION billguard.cancel_unsent_of_deactivated() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.cancel_unsent(NEW.customer_id, NULL::text, 'account deactivated');
  RETURN NULL;
END $$;

-- ==== The account guards hold for logical replication's apply worker ====
-- The apply worker of a subscription runs with session_replication_role =
-- replica, in which ordinary triggers do not fire: a rename or delete of a
-- billed account at the publisher went through, and the next bill_period
-- charged the same customer again. The triggers of accounts and currencies
-- now fire always; a refused change stalls the subscription instead.
ALTER TABLE billguard.currencies ENABLE ALWAYS TRIGGER currencies_user_rows;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_updated_at;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_keep_billed_ids;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_keep_billed_rows;
ALTER TABLE billguard.accounts ENABLE ALWAYS TRIGGER accounts_deactivated;

-- ==== The scheduler never bills a period older than one it issued, whatever the clock says now ====
-- A clock stepped back an hour after the scheduler billed 2026-08 on
-- 2026-09-01 made 2026-07 the most recent due period, and the scheduler
-- billed it: a period an earlier system may have charged already. Each
-- BillingTickIssued now records whether the period's month had ended by
-- the scheduler's clock (month_ended); billing-scheduler's state lists those
-- periods (ended_when_issued), and issued_after() takes the state, so that
-- what was issued, not the clock now, keeps the scheduler from going back.
DROP FUNCTION billguard.issued_after(text, jsonb, timestamptz);
-- The latest period after due_period that billing-scheduler's state
-- (scheduler_state) lists as issued once its month had ended, or NULL. The
-- scheduler never goes back behind one: moving bill_day or bill_hour_utc
-- later can take the calendar's due period back a month, to one the
-- scheduler had passed, and so can a clock stepped back (an hour after the
-- scheduler billed 2026-08 on 2026-09-01, the calendar says 2026-07 is due).
-- What counts is the clock when the period was issued (ended_when_issued),
-- not the clock now. A period issued before its month ended (billed in
-- advance, or a mistyped year) does not count until its month has ended by
-- the clock `at`: it keeps no due period from being billed.
CREATE FUNCTION billguard.issued_after(due_period text, scheduler_state jsonb, at timestamptz)
  RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT max(i.period COLLATE "C")
            FROM jsonb_array_elements_text(coalesce(scheduler_state -> 'issued_periods', '[]'::jsonb))
                   AS i(period)
           WHERE i.period COLLATE "C" > due_period
             AND (coalesce(scheduler_state -> 'ended_when_issued', '[]'::jsonb) ? i.period
                  OR i.period COLLATE "C" < to_char(at AT TIME ZONE 'UTC', 'YYYY-MM')));
REVOKE ALL ON FUNCTION billguard.issued_after(text, jsonb, timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION billguard.initial_state(persistence_id text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN persistence_id = 'billing-scheduler'
      THEN jsonb_build_object('entity', 'billing-scheduler', 'issued_periods', '[]'::jsonb,
                              'last_issued_period', NULL, 'last_issued_at', NULL,
                              'ended_when_issued', '[]'::jsonb)
    WHEN persistence_id LIKE 'billing-%'
      THEN jsonb_build_object('entity', 'billing', 'status', 'new', 'attempts', 0)
    ELSE jsonb_build_object('entity', 'unknown')
  END;

-- One step of the fold. Pure: the same events always give the same state.
CREATE OR REPLACE FUNCTION billguard.apply_event(state jsonb, event_type text, event jsonb) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE event_type
    WHEN 'BillingInitiated' THEN state || jsonb_build_object(
      'status', 'in_progress',
      'customer_id', event -> 'customer_id',
      'billing_period', event -> 'billing_period',
      'idempotency_key', event -> 'idempotency_key',
      'amount_cents', event -> 'amount_cents',
      'currency', event -> 'currency',
      'initiated_at', event -> 'initiated_at')
    WHEN 'ChargeAttempted' THEN state || jsonb_build_object(
      'attempts', coalesce(event -> 'attempt', to_jsonb(coalesce((state ->> 'attempts')::int, 0) + 1)))
    WHEN 'BillingCompleted' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ChargeReconciled' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'ReviewResolved' THEN state || jsonb_build_object(
      'status', 'completed', 'charge_id', event -> 'charge_id')
    WHEN 'BillingFailed' THEN state || jsonb_build_object(
      'status', CASE WHEN (event ->> 'terminal')::boolean THEN 'failed' ELSE state ->> 'status' END,
      'last_error', event - 'terminal')
    WHEN 'ChargeUnknown' THEN state || jsonb_build_object('status', 'unknown')
    WHEN 'NeedsReview' THEN state || jsonb_build_object('status', 'needs_review')
    WHEN 'BillingBlocked' THEN state || jsonb_build_object('status', 'blocked')
    WHEN 'RecordRequeued' THEN state || jsonb_build_object('status', 'in_progress')
    WHEN 'BillingCancelled' THEN state || jsonb_build_object('status', 'cancelled')
    WHEN 'WebhookApplied' THEN state || jsonb_strip_nulls(jsonb_build_object(
      'status', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN 'completed'
                     WHEN event ->> 'effect' = 'failed' THEN 'failed' END,
      'charge_id', CASE WHEN event ->> 'effect' IN ('completed', 'refunded') THEN event -> 'charge_id' END,
      -- Stripe's amount refunded so far only grows; its events come in any order.
      'refunded_cents', CASE WHEN event ->> 'effect' = 'refunded'
                             THEN to_jsonb(greatest((state ->> 'refunded_cents')::bigint,
                                                    (event ->> 'amount_refunded_cents')::bigint)) END))
    WHEN 'BillingTickIssued' THEN jsonb_set(state, '{issued_periods}',
      CASE WHEN (state -> 'issued_periods') ? (event ->> 'billing_period')
           THEN state -> 'issued_periods'
           ELSE coalesce(state -> 'issued_periods', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period')
      END)
      || CASE WHEN event ->> 'billing_period' >= coalesce(state ->> 'last_issued_period', '')
              THEN jsonb_build_object('last_issued_period', event -> 'billing_period',
                                      'last_issued_at', event -> 'issued_at')
              ELSE '{}'::jsonb
         END
      -- Events before 0.2.0 do not say: their periods count by the clock now.
      || CASE WHEN coalesce((event ->> 'month_ended')::boolean, false)
                   AND NOT coalesce(state -> 'ended_when_issued', '[]'::jsonb) ? (event ->> 'billing_period')
              THEN jsonb_build_object('ended_when_issued',
                     coalesce(state -> 'ended_when_issued', '[]'::jsonb) || jsonb_build_array(event -> 'billing_period'))
              ELSE '{}'::jsonb
         END
    ELSE state
  END || jsonb_build_object('last_event_type', event_type);

-- A snapshot's state of an older state_version in the current shape, one
-- step per version:
--   1 -> 2  the scheduler entity's last_issued_period is the greatest of its
--           issued_periods, last_issued_at unknown, ended_when_issued empty
--           (0.1.0 did not record it: those periods count by the clock now).
--           A state without issued_periods (a malformed or hand-made
--           snapshot) gets none: billing_records, not the state, keeps those
--           periods from being billed twice.
CREATE OR REPLACE FUNCTION billguard.upcast_state(state jsonb, state_version integer) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN state_version >= 2 OR state ->> 'entity' IS DISTINCT FROM 'billing-scheduler' THEN state
    ELSE state || jsonb_build_object(
      'issued_periods', coalesce(state -> 'issued_periods', '[]'::jsonb),
      'last_issued_period',
        (SELECT max(p.period) FROM jsonb_array_elements_text(
           coalesce(state -> 'issued_periods', '[]'::jsonb)) AS p(period)),
      'last_issued_at', NULL,
      'ended_when_issued', '[]'::jsonb)
  END;

-- The work of bill_period(); PL/pgSQL cannot name an input and an output
-- column alike, as bill_period's public signature does. The scheduler's
-- tick passes search_first_reason when it claims late (see scheduler_tick()):
-- each record it claims is searched for at Stripe before it is sent.
CREATE OR REPLACE FUNCTION billguard.claim_period(period text, search_first_reason text DEFAULT NULL)
  RETURNS TABLE (initiated bigint, already_completed bigint, in_progress bigint, failed bigint,
                 cancelled bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  -- The anti-join below reads billing_records while the same statement
  -- inserts into it; planned as a nested loop over a seq scan (likely while
  -- the table is new and unanalysed) it would rescan the growing table per
  -- account. Hash and merge joins keep a large period linear.
  SET enable_nestloop = off
  AS $$
#variable_conflict use_column
DECLARE
  ns        text := billguard.key_namespace();
  scheduler_state jsonb;
BEGIN
  PERFORM billguard.check_billing_period(period);

  -- Claims of one period are serialised: bill_period holds the period's
  -- lock exclusively, bill_customer holds it shared. Once we have it, every
  -- earlier claim is committed and visible to the next statement, so a plain
  -- set-based INSERT of the accounts without a record claims each exactly
  -- once; no per-row speculative insertion, no row-order deadlocks.
  PERFORM pg_advisory_xact_lock(billguard.period_lock_class(), hashtext(period));
  BEGIN
    WITH claimed AS (
      INSERT INTO billguard.billing_records AS r
             (customer_id, billing_period, idempotency_key, amount_cents, currency,
              stripe_customer, payment_method, search_first_reason)
      SELECT a.customer_id, period, billguard.idempotency_key(a.customer_id, period, ns),
             a.amount_cents, a.currency, a.stripe_customer, a.payment_method,
             claim_period.search_first_reason
        FROM billguard.accounts a
       WHERE a.active
         AND NOT EXISTS (SELECT FROM billguard.billing_records e
                          WHERE e.customer_id = a.customer_id AND e.billing_period = period)
      RETURNING r.customer_id, r.idempotency_key, r.amount_cents, r.currency, r.created_at
    ), journaled AS (
      INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
      SELECT 'billing-' || c.customer_id || '-' || period, 1, c.customer_id, 'BillingInitiated',
             billguard.billing_initiated_event(c.customer_id, period, c.idempotency_key,
                                               c.amount_cents, c.currency, c.created_at)
        FROM claimed c
      RETURNING 1
    )
    SELECT count(*) INTO initiated FROM journaled;
  EXCEPTION WHEN unique_violation THEN
    -- Only a REPEATABLE READ / SERIALIZABLE caller whose snapshot predates
    -- another claim gets here; nothing of this call is kept.
    RAISE EXCEPTION 'billing records of % were claimed concurrently; retry the transaction', period
      USING ERRCODE = 'serialization_failure';
  END;

  -- Every record of the period (others' claims committed before we took the
  -- lock), whatever its account has become since: period_status's counts.
  SELECT count(*) FILTER (WHERE r.status = 'completed'),
         count(*) FILTER (WHERE r.status IN ('pending', 'dispatching', 'unknown', 'needs_review')),
         count(*) FILTER (WHERE r.status IN ('failed', 'blocked')),
         count(*) FILTER (WHERE r.status = 'cancelled')
    INTO already_completed, in_progress, failed, cancelled
    FROM billguard.billing_records r
   WHERE r.billing_period = period;
  in_progress := in_progress - initiated;   -- our own claims are pending too

  -- The first time a period is billed, the scheduler entity records it,
  -- and whether its month had ended by the scheduler's clock: the scheduler
  -- never goes back behind such a period, whatever its clock says later
  -- (see issued_after()). The advisory lock serialises appends to that one
  -- entity.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  scheduler_state := billguard.entity_state('billing-scheduler');
  IF NOT (scheduler_state -> 'issued_periods') ? period THEN
    PERFORM billguard.append_event('billing-scheduler', (scheduler_state ->> 'seq_nr')::bigint,
                                   'BillingTickIssued',
                                   jsonb_build_object('billing_period', period,
                                                      'issued_at', clock_timestamp(),
                                                      'month_ended', period COLLATE "C" < to_char(
                                                        (SELECT s.now FROM billguard.scheduler_settings() s)
                                                          AT TIME ZONE 'UTC', 'YYYY-MM')));
  END IF;

  IF initiated > 0 THEN
    PERFORM billguard.wake_dispatcher();
  END IF;
  RETURN NEXT;
END $$;

-- One tick of the scheduler, in the dispatcher's transaction: bills the most
-- recent due period unless billing-scheduler has issued it. outcome:
--   billed          bill_period claimed the accounts without a record
--   already_issued  BillingTickIssued is in the scheduler's state: nothing
--   already_billed  the state did not list the period, yet billing_records
--                   held every record it would claim (a stale or older
--                   snapshot; or bill_customer for every account): nothing
--                   was claimed, and the worker logs the inconsistency
--   busy            a session bills this period right now, or has billed a
--                   period in a transaction still open (it holds the
--                   period's lock or billing-scheduler's); the worker tries
--                   again shortly rather than wait for either lock
--   passed          a later period was issued already once its month had
--                   ended: bill_day or bill_hour_utc moved later, or a clock
--                   stepped back, took the calendar back to a period the
--                   scheduler had passed (see issued_after()).
--                   Nothing: billing it is a person's decision (due_periods)
-- existing counts the period's records from before this tick.
-- search_first_reason, when the tick claims more than the dispatcher's
-- billguard.idempotency_window after the period became due: an earlier
-- system may have charged the period already (a backup restored from before
-- its tick, a reinstall with the accounts imported again, auto_bill switched
-- on for a period billed elsewhere), with keys Stripe has pruned since. Each
-- record claimed carries the reason, and the dispatcher searches for its
-- charge before sending one (claim_due_records). A person's bill_period of
-- a past period sends plain charges: see the README's scheduler section.
CREATE OR REPLACE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz, search_first_reason text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  state    jsonb;
  issued   jsonb;
  tick_at  timestamptz := (SELECT s.now FROM billguard.scheduler_settings() s);
  trusted  interval := current_setting('billguard.idempotency_window')::interval;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  -- bill_period takes the same locks: the check and the claim are one step.
  -- The dispatcher waits for no lock: a session's open transaction must not
  -- halt all sending of this database.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period))
     OR NOT pg_try_advisory_xact_lock(billguard.scheduler_lock_class(), 0) THEN
    outcome := 'busy';
    RETURN NEXT;
    RETURN;
  END IF;
  state := billguard.entity_state('billing-scheduler');
  issued := state -> 'issued_periods';
  IF issued ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSIF billguard.issued_after(schedule.due_period, state, tick_at) IS NOT NULL THEN
    outcome := 'passed';
  ELSE
    IF tick_at > schedule.due_at + trusted THEN
      search_first_reason := format(
        'the scheduler claimed %s %s after it became due (%s), past billguard.idempotency_window '
        '(%s): a charge made for it before (a restored backup that lost the tick) may have a key '
        'Stripe has forgotten',
        schedule.due_period, justify_hours(date_trunc('second', tick_at - schedule.due_at)),
        to_char(schedule.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
        current_setting('billguard.idempotency_window'));
    END IF;
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period, search_first_reason);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
    IF initiated = 0 THEN
      search_first_reason := NULL;   -- no record carries it
    END IF;
  END IF;
  RETURN NEXT;
END $$;

-- The due periods never issued, with the instant each became due. scheduled:
-- the scheduler bills it by itself (the most recent, with auto_bill =
-- monthly, unless a later period was issued: see issued_after()); it never
-- bills the others: bill each deliberately with bill_period. records counts
-- what bill_customer claimed of it already.
CREATE OR REPLACE FUNCTION billguard.due_periods()
  RETURNS TABLE (billing_period text, due_at timestamptz, records bigint, scheduled boolean)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  issued   jsonb := coalesce(state -> 'issued_periods', '[]'::jsonb);
  missed   text[];
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  missed := billguard.never_issued(schedule.due_period, issued);
  IF cardinality(missed) = 0 THEN
    RETURN;    -- no reason to read billing_records
  END IF;
  RETURN QUERY
    SELECT p.period,
           billguard.bill_instant(p.period, schedule.bill_day, schedule.bill_hour_utc),
           coalesce(r.records, 0),
           p.period = schedule.due_period AND schedule.auto_bill = 'monthly'
             AND billguard.issued_after(p.period, state,
                                        (SELECT s.now FROM billguard.scheduler_settings() s)) IS NULL
      FROM unnest(missed) AS p(period)
      LEFT JOIN (SELECT br.billing_period, count(*) AS records
                   FROM billguard.billing_records br
                  WHERE br.billing_period = ANY (missed)
                  GROUP BY br.billing_period) r ON r.billing_period = p.period
     ORDER BY p.period;
END $$;

-- The scheduler as billguard.scheduler_status shows it: enabled, the next
-- instant it bills (in the past while the most recent due period waits to be
-- issued), the last period issued and when, and how many due periods the
-- scheduler will not bill by itself (see due_periods()).
CREATE OR REPLACE FUNCTION billguard.scheduler_state(
    OUT enabled boolean, OUT bill_day integer, OUT bill_hour_utc integer,
    OUT next_bill_at timestamptz, OUT last_period_issued text,
    OUT last_period_issued_at timestamptz, OUT missed_periods bigint)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  -- The tick would bill the most recent due period (see scheduler_tick()).
  scheduled boolean;
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  enabled := schedule.auto_bill = 'monthly';
  bill_day := schedule.bill_day;
  bill_hour_utc := schedule.bill_hour_utc;
  scheduled := enabled AND NOT (state -> 'issued_periods') ? schedule.due_period
               AND billguard.issued_after(schedule.due_period, state,
                                          (SELECT s.now FROM billguard.scheduler_settings() s)) IS NULL;
  next_bill_at := CASE WHEN NOT enabled THEN NULL
                       WHEN scheduled THEN schedule.due_at
                       ELSE schedule.next_due_at END;
  last_period_issued := state ->> 'last_issued_period';
  last_period_issued_at := (state ->> 'last_issued_at')::timestamptz;
  -- Without reading billing_records: the view may be polled.
  missed_periods := cardinality(array_remove(
    billguard.never_issued(schedule.due_period,
                           coalesce(state -> 'issued_periods', '[]'::jsonb)),
    CASE WHEN scheduled THEN schedule.due_period END));
END $$;


-- ==== A search takes a charge for the record's only if amount, currency and Stripe customer match ====
-- The key alone is no proof: two databases billing through one Stripe
-- account with the same key namespace and customer id make the same key,
-- and a search past the idempotency window completed the second database's
-- record with the first one's charge (its own customer never charged).
-- record_answers now compares the objects a search found with the record,
-- as a webhook is compared: none matching is needs_review, with what
-- differed in last_error and a WARNING. record_search_result passes the
-- found object's amount, currency and customer.
-- Records a batch of answers the dispatcher read and judged
-- (common/stripe_response.cpp), in one statement: answers is a JSON array of
-- {key, attempt, search, outcome, http_status, charge_id, replayed,
-- request_id, error_type, error_code, decline_code, message, body_excerpt,
-- found}; found, of a search, lists the charged objects that carry the
-- record's key: [{id, amount, currency, customer}, ...].
-- What each outcome does to its record, and the event it journals (every
-- event that records an answer carries Stripe's Request-Id, what Stripe
-- support asks for):
--   an answer to a charge:
--     completed     charged: charge_id                      BillingCompleted
--     failed        not charged (a decline, a 4xx)           BillingFailed, terminal
--     retry         again after retry_delay(attempt)         BillingFailed, not terminal
--     throttled     a 429 or 409: the same, backoff capped at a minute
--     unknown       a cached 500: search after settle_delay,
--                   unknown_cycles + 1                       ChargeUnknown
--     needs_review  a person must look; never re-sent        NeedsReview
--     blocked       refused by billguard-proxy's spend cap (nothing was
--                   sent upstream); terminal, never re-sent   BillingBlocked
--     paused        the API key was refused: not counted     -
--     not_sent      never left: not counted, due again (the
--                   dispatcher holds off while Stripe is
--                   unreachable)                             ChargeNotSent
--   an answer to a search for the record's charge:
--     completed     found charged, with the record's amount, currency and
--                   Stripe customer (the key alone proves nothing: another
--                   database billing with the same key namespace on this
--                   Stripe account makes the same key): the first such
--                   object's id                             ChargeReconciled
--                   found, but none of those match: needs_review, never
--                   re-sent, last_error saying what differed (and a
--                   WARNING in the log)                      NeedsReview
--     absent        not found: nothing changes, the dispatcher sends the
--                   charge now with the same key and lease
--     needs_review  not found after max_unknown_cycles indeterminate
--                   answers: re-sending would only get the cached 500
--                   replayed; never re-sent                  NeedsReview
--     retry         the search told nothing: unknown, again after retry_delay
--     paused        the API key was refused: unknown, not counted
--     not_sent      never left: the same
-- A settled record (completed, failed, needs_review, blocked) leaves the dispatch
-- queue: its next_attempt_at becomes NULL. One result per answer, in
-- order: 'recorded', or 'stale' when the record is no longer that attempt's
-- (its lease was taken over, an operator requeued it: a late answer must not
-- overwrite a newer state), or 'locked' when another session holds its row:
-- the dispatcher never waits for a row, so one held lock cannot halt all
-- billing (see missed_attempt). Rows are found by their primary key alone,
-- the one plan whatever the statistics say (after a crash they say the
-- table is empty): the planner is held to index lookups in nested loops.
CREATE OR REPLACE FUNCTION billguard.record_answers(answers jsonb, settle_delay interval)
  RETURNS TABLE (recorded text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  SET enable_seqscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  AS $$
#variable_conflict use_column
DECLARE
  unknown_outcome text;
  mismatch record;
BEGIN
  SELECT a.search || '/' || a.outcome INTO unknown_outcome
    FROM jsonb_to_recordset(answers) AS a(search boolean, outcome text)
   WHERE NOT coalesce(a.search IS NOT NULL AND a.outcome IN ('completed', 'retry', 'paused', 'not_sent')
                       OR a.search = false AND a.outcome IN ('failed', 'throttled', 'unknown', 'needs_review', 'blocked')
                       OR a.search AND a.outcome IN ('absent', 'needs_review'), false)
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'no such outcome of an answer (search/outcome): %', unknown_outcome
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  RETURN QUERY
  WITH answer AS (
    SELECT *
      FROM ROWS FROM (jsonb_to_recordset(answers) AS (
             key text, attempt integer, search boolean, outcome text, http_status integer,
             charge_id text, replayed boolean, request_id text, error_type text, error_code text,
             decline_code text, message text, body_excerpt text, found jsonb))
           WITH ORDINALITY AS a(key, attempt, search, outcome, http_status, charge_id, replayed,
                                request_id, error_type, error_code, decline_code, message,
                                body_excerpt, found, position)
  ), locked AS (
    SELECT r.idempotency_key, r.customer_id, r.billing_period, r.status, r.attempts,
           r.amount_cents, r.currency, r.stripe_customer
      FROM billguard.billing_records r
     WHERE r.idempotency_key IN (SELECT a.key FROM answer a)
       FOR UPDATE SKIP LOCKED
  ), mine AS (   -- the answers whose attempt is still their record's
    SELECT a.*, l.customer_id, l.billing_period, v.verified_charge,
           CASE WHEN a.search THEN 'search ' ELSE '' END
             || CASE WHEN a.search AND a.outcome = 'completed' AND v.verified_charge IS NULL
                     THEN 'mismatch' ELSE a.outcome END AS what,
           CASE WHEN a.search AND a.outcome = 'completed' AND v.verified_charge IS NULL THEN
             format('search found %s with the record''s key, but for %s %s of customer %s, not the '
                    'record''s %s %s of %s: another database or system bills with this key '
                    'namespace on this Stripe account',
                    coalesce(f.id, a.charge_id), coalesce(f.amount::text, '?'), coalesce(f.currency, '?'),
                    coalesce(f.customer, 'none'), l.amount_cents, l.currency, l.stripe_customer)
           END AS mismatch,
           jsonb_strip_nulls(jsonb_build_object(
             'http_status', nullif(a.http_status, 0), 'type', a.error_type, 'code', a.error_code,
             'decline_code', a.decline_code, 'message', a.message, 'body', a.body_excerpt,
             'request_id', a.request_id, 'attempt', a.attempt)) AS detail
      FROM answer a
      JOIN locked l ON l.idempotency_key = a.key AND l.status = 'dispatching' AND l.attempts = a.attempt
      -- The first object found that is the record's charge: its amount,
      -- currency and Stripe customer too, as a webhook's must be.
      LEFT JOIN LATERAL (
        SELECT c.id AS verified_charge
          FROM ROWS FROM (jsonb_to_recordset(coalesce(a.found, '[]'::jsonb)) AS (
                 id text, amount bigint, currency text, customer text)) WITH ORDINALITY AS c(id, amount, currency, customer, n)
         WHERE c.amount = l.amount_cents AND c.currency = l.currency AND c.customer = l.stripe_customer
         ORDER BY c.n LIMIT 1) v ON a.search AND a.outcome = 'completed'
      -- Else the first one found, to say what differed.
      LEFT JOIN LATERAL (
        SELECT c.id, c.amount, c.currency, c.customer
          FROM ROWS FROM (jsonb_to_recordset(coalesce(a.found, '[]'::jsonb)) AS (
                 id text, amount bigint, currency text, customer text)) WITH ORDINALITY AS c(id, amount, currency, customer, n)
         ORDER BY c.n LIMIT 1) f ON a.search AND a.outcome = 'completed' AND v.verified_charge IS NULL
  ), effect AS (
    SELECT m.key, m.customer_id, m.billing_period, m.what,
           CASE WHEN m.what = 'completed' THEN m.charge_id
                WHEN m.what = 'search completed' THEN m.verified_charge END AS charge_id,
           CASE m.what
             WHEN 'completed' THEN 'completed' WHEN 'search completed' THEN 'completed'
             WHEN 'failed' THEN 'failed' WHEN 'needs_review' THEN 'needs_review'
             WHEN 'search needs_review' THEN 'needs_review'
             WHEN 'search mismatch' THEN 'needs_review'
             WHEN 'blocked' THEN 'blocked'
             WHEN 'retry' THEN 'pending' WHEN 'throttled' THEN 'pending'
             WHEN 'paused' THEN 'pending' WHEN 'not_sent' THEN 'pending'
             WHEN 'search absent' THEN NULL   -- nothing changes
             ELSE 'unknown'                   -- unknown, search retry, search paused, search not_sent
           END AS status,
           -- an attempt that provably charged nothing and told nothing does not count
           CASE WHEN m.outcome IN ('paused', 'not_sent') THEN -1 ELSE 0 END AS attempts_delta,
           CASE m.what
             WHEN 'retry' THEN now() + billguard.retry_delay(m.attempt, 900::double precision)
             -- a rate limit or a key still in use backs off a minute at most
             WHEN 'throttled' THEN now() + billguard.retry_delay(m.attempt, 60::double precision)
             -- search is eventually consistent: "absent" only after the settle delay
             WHEN 'unknown' THEN now() + settle_delay
             WHEN 'search retry' THEN now() + billguard.retry_delay(m.attempt, 900::double precision)
             WHEN 'paused' THEN now() WHEN 'not_sent' THEN now()
             WHEN 'search paused' THEN now() WHEN 'search not_sent' THEN now()
           END AS next_attempt_at,   -- NULL: settled, out of the queue
           m.what IN ('paused', 'search paused', 'search not_sent') AS keeps_error,
           CASE
             WHEN m.what IN ('completed', 'search completed') THEN NULL
             WHEN m.what = 'not_sent' THEN 'not sent: ' || m.message
             WHEN m.what IN ('search retry', 'search needs_review') THEN m.message
             WHEN m.what = 'search mismatch' THEN m.mismatch
             ELSE billguard.error_text(m.detail)
           END AS last_error,
           CASE m.what
             WHEN 'completed' THEN 'BillingCompleted' WHEN 'search completed' THEN 'ChargeReconciled'
             WHEN 'failed' THEN 'BillingFailed' WHEN 'retry' THEN 'BillingFailed'
             WHEN 'throttled' THEN 'BillingFailed' WHEN 'unknown' THEN 'ChargeUnknown'
             WHEN 'needs_review' THEN 'NeedsReview' WHEN 'not_sent' THEN 'ChargeNotSent'
             WHEN 'search needs_review' THEN 'NeedsReview'
             WHEN 'search mismatch' THEN 'NeedsReview'
             WHEN 'blocked' THEN 'BillingBlocked'
           END AS event_type,
           CASE m.what
             WHEN 'completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'replayed', coalesce(m.replayed, false),
               'http_status', m.http_status, 'attempt', m.attempt, 'request_id', m.request_id))
             WHEN 'search completed' THEN jsonb_strip_nulls(jsonb_build_object(
               'charge_id', m.charge_id, 'via', 'search', 'attempt', m.attempt,
               'request_id', m.request_id))
             WHEN 'failed' THEN m.detail || jsonb_build_object('terminal', true)
             WHEN 'retry' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'throttled' THEN m.detail || jsonb_build_object('terminal', false)
             WHEN 'unknown' THEN m.detail
             WHEN 'needs_review' THEN m.detail
             WHEN 'search needs_review' THEN m.detail || jsonb_build_object('via', 'search')
             WHEN 'search mismatch' THEN m.detail || jsonb_build_object(
               'via', 'search', 'message', m.mismatch, 'found', m.found)
             WHEN 'blocked' THEN m.detail
             WHEN 'not_sent' THEN jsonb_build_object('attempt', m.attempt, 'message', m.message)
           END AS event
      FROM mine m
  ), updated AS (
    UPDATE billguard.billing_records r
       SET status = e.status,
           attempts = r.attempts + e.attempts_delta,
           unknown_cycles = CASE WHEN e.what = 'unknown'
                                 THEN least(coalesce(r.unknown_cycles, 0) + 1, 32767)
                                 ELSE r.unknown_cycles END,
           next_attempt_at = e.next_attempt_at,
           lease_expires_at = NULL,
           last_error = CASE WHEN e.keeps_error THEN r.last_error ELSE e.last_error END,
           charge_id = coalesce(e.charge_id, r.charge_id),
           completed_at = CASE WHEN e.status = 'completed' THEN now() ELSE r.completed_at END,
           updated_at = now()
      FROM effect e
     WHERE r.idempotency_key = e.key AND e.status IS NOT NULL
  ), journaled AS (
    -- The record's row lock serialises all writers of its entity, so
    -- max + 1 cannot race.
    INSERT INTO billguard.journal (persistence_id, seq_nr, customer_id, event_type, event)
    SELECT p.id,
           coalesce((SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = p.id), 0) + 1,
           e.customer_id, e.event_type, e.event
      FROM effect e
     CROSS JOIN LATERAL (SELECT 'billing-' || e.customer_id || '-' || e.billing_period AS id) p
     WHERE e.event_type IS NOT NULL
  )
  SELECT CASE WHEN a.position IN (SELECT m.position FROM mine m) THEN 'recorded'
              WHEN a.key IN (SELECT l.idempotency_key FROM locked l) THEN 'stale'
              ELSE billguard.missed_attempt(a.key, a.attempt)
         END
    FROM answer a
   ORDER BY a.position;
  -- A search that found the key on another's charge is for a person: say so
  -- in the log as well (the dispatcher judged the answer 'completed').
  FOR mismatch IN
    SELECT r.customer_id, r.billing_period, r.last_error
      FROM jsonb_to_recordset(answers) AS a(key text, search boolean, outcome text)
      JOIN billguard.billing_records r ON r.idempotency_key = a.key
     WHERE a.search AND a.outcome = 'completed' AND r.status = 'needs_review'
       AND r.updated_at = now() AND r.last_error LIKE 'search found % with the record''s key, but %'
  LOOP
    RAISE WARNING 'billguard dispatcher: %/% is needs_review: %', mismatch.customer_id,
                  mismatch.billing_period, mismatch.last_error
      USING HINT = 'Every database billing through one Stripe account needs a billguard.key_namespace '
                   'of its own. Compare the record with Stripe''s dashboard, then resolve_record or '
                   'retry_record.';
  END LOOP;
END $$;

DROP FUNCTION billguard.record_search_result(text, integer, text, integer, text, text, text);
-- One answer to a search for the record's charge (see record_answers):
-- charge_id the object found, with its amount, currency and Stripe customer.
CREATE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text, found_amount bigint DEFAULT NULL,
    found_currency text DEFAULT NULL, found_customer text DEFAULT NULL)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', true, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'request_id', request_id,
            'message', message,
            'found', CASE WHEN charge_id IS NULL THEN '[]'::jsonb
                          ELSE jsonb_build_array(jsonb_build_object(
                                 'id', charge_id, 'amount', found_amount, 'currency', found_currency,
                                 'customer', found_customer)) END)),
          NULL::interval) a);
REVOKE ALL ON FUNCTION billguard.record_search_result(text, integer, text, integer, text, text, text, bigint, text, text) FROM PUBLIC;

-- ==== Copies, restores, DROP DATABASE and cascades; the dispatcher's own settings ====
-- A copy made with CREATE DATABASE ... TEMPLATE and a dump restored into a
-- new database send nothing and bill no period until an operator adopts
-- them (billguard.installation, billguard.billing_installations,
-- billing_database_problem(), adopt_database()); this database, updated in
-- place, is the billing database of its history. The scheduler's tick
-- answers not_billing_database in such a database. due_periods() lists
-- periods issued before their month ended (issued_early), and scheduler_status
-- says why the scheduler bills nothing now and how many periods were issued
-- early; dispatch_status says what lock a dispatcher statement waits for.
-- The DROP guard sees what a statement drops, cascades included, and holds
-- with session_replication_role = replica, as do the triggers that keep the
-- journal, the billing records, the vault audit and users' currency rows as
-- they were.
-- The CREATE EXTENSION billguard running now restores a dump (the
-- ProcessUtility hook saw the session's settings; false without preloading).
CREATE FUNCTION billguard.created_by_restore() RETURNS boolean
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_created_by_restore';

CREATE TABLE billguard.installation (
  singleton              boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  installation_id        text NOT NULL UNIQUE,
  database_oid           oid NOT NULL,
  database_name          name NOT NULL,
  system_identifier      bigint NOT NULL,
  installed_at           timestamptz NOT NULL DEFAULT now(),
  -- CREATE EXTENSION ran in a restore: the history arrives after it.
  created_by_restore     boolean NOT NULL DEFAULT false,
  creator_pid            integer,
  creator_started_at     timestamptz,
  adopted_at             timestamptz,
  adopted_by             name,
  -- The installations that had billed the history when it was adopted.
  adopted_installations  text[]
);
COMMENT ON TABLE billguard.installation IS
  'This database''s installation of billguard; never dumped: a copy or a restore is told apart by it.';

CREATE TABLE billguard.billing_installations (
  installation_id    text PRIMARY KEY,
  database_name      name NOT NULL,
  database_oid       oid NOT NULL,
  system_identifier  bigint NOT NULL,
  began_at           timestamptz NOT NULL DEFAULT now(),
  how                text NOT NULL CHECK (how IN ('installed', 'adopted'))
);
COMMENT ON TABLE billguard.billing_installations IS
  'Every installation of billguard that billed this history: dumped with it.';
SELECT pg_catalog.pg_extension_config_dump('billguard.billing_installations', '');

WITH me AS (
  SELECT gen_random_uuid()::text AS id, d.oid, d.datname,
         (SELECT c.system_identifier FROM pg_control_system() c) AS system_identifier
    FROM pg_database d WHERE d.datname = current_database()
), installed AS (
  INSERT INTO billguard.installation (installation_id, database_oid, database_name,
                                      system_identifier, created_by_restore, creator_pid,
                                      creator_started_at)
  SELECT me.id, me.oid, me.datname, me.system_identifier, billguard.created_by_restore(),
         pg_backend_pid(), (SELECT a.backend_start FROM pg_stat_activity a WHERE a.pid = pg_backend_pid())
    FROM me
)
INSERT INTO billguard.billing_installations (installation_id, database_name, database_oid,
                                             system_identifier, how)
SELECT me.id, me.datname, me.oid, me.system_identifier, 'installed' FROM me;

-- Why this database does not bill its history, or NULL when it does.
CREATE FUNCTION billguard.billing_database_problem() RETURNS text
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  me     billguard.installation;
  others text;
  why    text;
BEGIN
  SELECT * INTO me FROM billguard.installation;
  IF NOT FOUND THEN
    why := 'billguard.installation, which names the database that installed billguard here, is empty';
  ELSIF me.database_oid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()) THEN
    why := format('this database is a copy of database %s (CREATE DATABASE ... TEMPLATE, or a copy '
                  'of its files), which bills this history', quote_ident(me.database_name));
  ELSIF me.created_by_restore AND me.adopted_at IS NULL THEN
    why := 'this database was restored from a dump (its CREATE EXTENSION billguard ran in a '
           'restore), and the database it was dumped from bills this history';
  ELSE
    SELECT string_agg(DISTINCT quote_ident(b.database_name), ', ') INTO others
      FROM billguard.billing_installations b
     WHERE b.installation_id <> me.installation_id
       AND b.installation_id <> ALL (coalesce(me.adopted_installations, '{}'));
    IF others IS NOT NULL THEN
      why := format('this database''s billing history came from database %s (a dump restored '
                    'here), which bills it', others);
    END IF;
  END IF;
  IF why IS NULL THEN
    RETURN NULL;
  END IF;
  RETURN why || ': it sends nothing and bills no period until an operator adopts it as the '
             || 'billing database (SELECT billguard.adopt_database())';
END $$;

-- Makes this database the billing database of its history, once a person
-- has made sure the one it came from no longer bills it. Refused while a
-- restore into it still runs.
CREATE FUNCTION billguard.adopt_database() RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  problem   text := billguard.billing_database_problem();
  here      oid := (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
  history   regclass[] := (SELECT e.extconfig FROM pg_extension e WHERE e.extname = 'billguard');
  me        billguard.installation;
  restoring text;
  new_id    text := gen_random_uuid()::text;
  sysid     bigint := (SELECT c.system_identifier FROM pg_control_system() c);
BEGIN
  IF problem IS NULL THEN
    RETURN 'this database bills its history already: nothing to adopt';
  END IF;
  SELECT * INTO me FROM billguard.installation FOR UPDATE;
  SELECT format('pid %s, %s', a.pid, coalesce(nullif(a.application_name, ''), 'no application_name'))
    INTO restoring
    FROM pg_stat_activity a
   WHERE a.datid = here AND a.pid <> pg_backend_pid()
     AND (a.application_name = 'pg_restore'
          OR (me.created_by_restore AND a.pid = me.creator_pid
              AND a.backend_start = me.creator_started_at))
   LIMIT 1;
  IF restoring IS NOT NULL THEN
    RAISE EXCEPTION 'the restore into this database still runs (%)', restoring
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Adopt the database once the restore has finished.';
  END IF;
  BEGIN
    EXECUTE format('LOCK TABLE %s IN SHARE MODE NOWAIT', array_to_string(history, ', '));
  EXCEPTION WHEN lock_not_available THEN
    RAISE EXCEPTION 'a session is writing billguard''s tables (a restore that still runs?)'
      USING ERRCODE = 'object_not_in_prerequisite_state',
            HINT = 'Adopt the database once the restore has finished.';
  END;

  DELETE FROM billguard.installation;
  INSERT INTO billguard.installation (installation_id, database_oid, database_name,
                                      system_identifier, installed_at, created_by_restore,
                                      adopted_at, adopted_by, adopted_installations)
  VALUES (new_id, here, current_database(), sysid, coalesce(me.installed_at, now()),
          coalesce(me.created_by_restore, false), now(), session_user,
          (SELECT array_agg(b.installation_id ORDER BY b.began_at, b.installation_id)
             FROM billguard.billing_installations b));
  INSERT INTO billguard.billing_installations (installation_id, database_name, database_oid,
                                               system_identifier, how)
  VALUES (new_id, current_database(), here, sysid, 'adopted');
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'DatabaseAdopted',
                                 jsonb_build_object('database', current_database(),
                                                    'installation_id', new_id,
                                                    'adopted_by', session_user,
                                                    'was', problem));
  PERFORM billguard.wake_dispatcher();
  RETURN 'adopted: this database bills its history from now on';
END $$;
COMMENT ON FUNCTION billguard.adopt_database() IS
  'Makes a copy or a restored database the one that bills its history; refused while a restore into it runs.';
REVOKE ALL ON TABLE billguard.installation, billguard.billing_installations FROM PUBLIC;
REVOKE ALL ON FUNCTION billguard.created_by_restore(), billguard.billing_database_problem(),
  billguard.adopt_database() FROM PUBLIC;

CREATE OR REPLACE FUNCTION billguard.scheduler_tick()
  RETURNS TABLE (billing_period text, outcome text, initiated bigint, existing bigint,
                 due_at timestamptz, next_due_at timestamptz, search_first_reason text)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  claimed  record;
  state    jsonb;
  issued   jsonb;
  tick_at  timestamptz := (SELECT s.now FROM billguard.scheduler_settings() s);
  trusted  interval := current_setting('billguard.idempotency_window')::interval;
BEGIN
  -- A failover must not lose a tick whose claims it replicated.
  PERFORM set_config('synchronous_commit', 'on', true);
  SELECT * INTO schedule FROM billguard.current_schedule();
  billing_period := schedule.due_period;
  due_at := schedule.due_at;
  next_due_at := schedule.next_due_at;
  initiated := 0;
  existing := 0;
  IF billguard.billing_database_problem() IS NOT NULL THEN
    outcome := 'not_billing_database';
    RETURN NEXT;
    RETURN;
  END IF;
  -- bill_period takes the same locks: the check and the claim are one step.
  -- The dispatcher waits for no lock: a session's open transaction must not
  -- halt all sending of this database.
  IF NOT pg_try_advisory_xact_lock(billguard.period_lock_class(), hashtext(schedule.due_period))
     OR NOT pg_try_advisory_xact_lock(billguard.scheduler_lock_class(), 0) THEN
    outcome := 'busy';
    RETURN NEXT;
    RETURN;
  END IF;
  state := billguard.entity_state('billing-scheduler');
  issued := state -> 'issued_periods';
  IF issued ? schedule.due_period THEN
    outcome := 'already_issued';
  ELSIF billguard.issued_after(schedule.due_period, state, tick_at) IS NOT NULL THEN
    outcome := 'passed';
  ELSE
    IF tick_at > schedule.due_at + trusted THEN
      search_first_reason := format(
        'the scheduler claimed %s %s after it became due (%s), past billguard.idempotency_window '
        '(%s): a charge made for it before (a restored backup that lost the tick) may have a key '
        'Stripe has forgotten',
        schedule.due_period, justify_hours(date_trunc('second', tick_at - schedule.due_at)),
        to_char(schedule.due_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI "UTC"'),
        current_setting('billguard.idempotency_window'));
    END IF;
    SELECT * INTO claimed FROM billguard.claim_period(schedule.due_period, search_first_reason);
    initiated := claimed.initiated;
    existing := claimed.already_completed + claimed.in_progress + claimed.failed + claimed.cancelled;
    outcome := CASE WHEN initiated = 0 AND existing > 0 THEN 'already_billed' ELSE 'billed' END;
    IF initiated = 0 THEN
      search_first_reason := NULL;   -- no record carries it
    END IF;
  END IF;
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.issued_early(issued jsonb, at timestamptz)
  RETURNS text[]
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(i.period ORDER BY i.period), '{}')
            FROM jsonb_array_elements_text(coalesce(issued, '[]'::jsonb)) AS i(period)
           WHERE i.period COLLATE "C" >= to_char(at AT TIME ZONE 'UTC', 'YYYY-MM'));
REVOKE ALL ON FUNCTION billguard.issued_early(jsonb, timestamptz) FROM PUBLIC;

-- due_periods() gains issued_early: created anew (no grant on it can exist yet).
DROP FUNCTION billguard.due_periods();
CREATE FUNCTION billguard.due_periods()
  RETURNS TABLE (billing_period text, due_at timestamptz, records bigint, scheduled boolean,
                 issued_early boolean)
  LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
#variable_conflict use_column
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  issued   jsonb := coalesce(state -> 'issued_periods', '[]'::jsonb);
  missed   text[];
  early    text[];
  at       timestamptz := (SELECT s.now FROM billguard.scheduler_settings() s);
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  missed := billguard.never_issued(schedule.due_period, issued);
  early := billguard.issued_early(issued, at);
  IF cardinality(missed) = 0 AND cardinality(early) = 0 THEN
    RETURN;    -- no reason to read billing_records
  END IF;
  RETURN QUERY
    SELECT p.period,
           billguard.bill_instant(p.period, schedule.bill_day, schedule.bill_hour_utc),
           coalesce(r.records, 0),
           NOT p.early AND p.period = schedule.due_period AND schedule.auto_bill = 'monthly'
             AND billguard.issued_after(p.period, state, at) IS NULL,
           p.early
      FROM (SELECT m, false FROM unnest(missed) AS m
            UNION ALL SELECT e, true FROM unnest(early) AS e) AS p(period, early)
      LEFT JOIN (SELECT br.billing_period, count(*) AS records
                   FROM billguard.billing_records br
                  WHERE br.billing_period = ANY (missed || early)
                  GROUP BY br.billing_period) r ON r.billing_period = p.period
     ORDER BY p.period;
END $$;
COMMENT ON FUNCTION billguard.due_periods() IS
  'Due periods never issued; the scheduler bills only the most recent (scheduled), the rest only bill_period does; and periods issued before they were due (issued_early).';
REVOKE ALL ON FUNCTION billguard.due_periods() FROM PUBLIC;

-- scheduler_state() and dispatcher_state() gain columns, so they are created
-- anew; their views are re-pointed with CREATE OR REPLACE, never dropped, so
-- that the grants operators hold on them survive the update.
ALTER FUNCTION billguard.scheduler_state() RENAME TO scheduler_state_before_pause;
ALTER FUNCTION billguard.dispatcher_state() RENAME TO dispatcher_state_before_waits;
CREATE FUNCTION billguard.dispatcher_state(
    OUT pid integer, OUT started_at timestamptz, OUT paused boolean, OUT pause_reason text,
    OUT in_flight integer, OUT requests_sent bigint, OUT wakeup_registered boolean,
    OUT not_served_reason text, OUT waiting_for text, OUT scheduler_pause_reason text)
  LANGUAGE c VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_dispatcher_state';
REVOKE ALL ON FUNCTION billguard.dispatcher_state() FROM PUBLIC;
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
CREATE FUNCTION billguard.scheduler_state(
    OUT enabled boolean, OUT bill_day integer, OUT bill_hour_utc integer,
    OUT next_bill_at timestamptz, OUT last_period_issued text,
    OUT last_period_issued_at timestamptz, OUT missed_periods bigint,
    OUT pause_reason text, OUT issued_early bigint)
  LANGUAGE plpgsql VOLATILE SECURITY DEFINER
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  schedule record;
  state    jsonb := billguard.entity_state('billing-scheduler');
  -- The tick would bill the most recent due period (see scheduler_tick()).
  scheduled boolean;
BEGIN
  SELECT * INTO schedule FROM billguard.current_schedule();
  enabled := schedule.auto_bill = 'monthly';
  bill_day := schedule.bill_day;
  bill_hour_utc := schedule.bill_hour_utc;
  scheduled := enabled AND NOT (state -> 'issued_periods') ? schedule.due_period
               AND billguard.issued_after(schedule.due_period, state,
                                          (SELECT s.now FROM billguard.scheduler_settings() s)) IS NULL;
  next_bill_at := CASE WHEN NOT enabled THEN NULL
                       WHEN scheduled THEN schedule.due_at
                       ELSE schedule.next_due_at END;
  last_period_issued := state ->> 'last_issued_period';
  last_period_issued_at := (state ->> 'last_issued_at')::timestamptz;
  -- Without reading billing_records: the view may be polled.
  missed_periods := cardinality(array_remove(
    billguard.never_issued(schedule.due_period,
                           coalesce(state -> 'issued_periods', '[]'::jsonb)),
    CASE WHEN scheduled THEN schedule.due_period END));
  pause_reason := coalesce(billguard.billing_database_problem(),
                           (SELECT d.scheduler_pause_reason FROM billguard.dispatcher_state() d));
  issued_early := cardinality(billguard.issued_early(
    state -> 'issued_periods', (SELECT s.now FROM billguard.scheduler_settings() s)));
END $$;
REVOKE ALL ON FUNCTION billguard.scheduler_state() FROM PUBLIC;
CREATE OR REPLACE VIEW billguard.scheduler_status AS
SELECT s.enabled, s.bill_day, s.bill_hour_utc, s.next_bill_at, s.last_period_issued,
       s.last_period_issued_at, s.missed_periods, s.pause_reason, s.issued_early
  FROM billguard.scheduler_state() s;
COMMENT ON VIEW billguard.scheduler_status IS
  'The scheduler of this database: enabled, when it bills next, the last period issued, older due periods never issued, why it bills nothing now, periods issued early.';
DROP FUNCTION billguard.scheduler_state_before_pause();
DROP FUNCTION billguard.dispatcher_state_before_waits();

DROP EVENT TRIGGER billguard_protect_history;
CREATE EVENT TRIGGER billguard_protect_history ON ddl_command_start
  WHEN TAG IN ('DROP ACCESS METHOD', 'DROP AGGREGATE', 'DROP CAST', 'DROP COLLATION',
               'DROP CONVERSION', 'DROP DOMAIN', 'DROP EXTENSION', 'DROP FOREIGN DATA WRAPPER',
               'DROP FOREIGN TABLE', 'DROP FUNCTION', 'DROP INDEX', 'DROP LANGUAGE',
               'DROP MATERIALIZED VIEW', 'DROP OPERATOR', 'DROP OPERATOR CLASS',
               'DROP OPERATOR FAMILY', 'DROP OWNED', 'DROP POLICY', 'DROP PROCEDURE',
               'DROP PUBLICATION', 'DROP ROUTINE', 'DROP RULE', 'DROP SCHEMA', 'DROP SEQUENCE',
               'DROP SERVER', 'DROP STATISTICS', 'DROP SUBSCRIPTION', 'DROP TABLE',
               'DROP TEXT SEARCH CONFIGURATION', 'DROP TEXT SEARCH DICTIONARY',
               'DROP TEXT SEARCH PARSER', 'DROP TEXT SEARCH TEMPLATE', 'DROP TRANSFORM',
               'DROP TRIGGER', 'DROP TYPE', 'DROP USER MAPPING', 'DROP VIEW')
  EXECUTE FUNCTION billguard.protect_history();
ALTER EVENT TRIGGER billguard_protect_history ENABLE ALWAYS;

-- The triggers that keep the history as it was fire whoever writes: also
-- with session_replication_role = replica, which a superuser may set and
-- logical replication's apply worker runs with.
ALTER TABLE billguard.journal ENABLE ALWAYS TRIGGER journal_append_only;
ALTER TABLE billguard.billing_records ENABLE ALWAYS TRIGGER billing_records_keep_rows;
ALTER TABLE billguard.billing_records ENABLE ALWAYS TRIGGER billing_records_frozen_identity;
ALTER TABLE billguard.vault_audit ENABLE ALWAYS TRIGGER vault_audit_append_only;
ALTER TABLE billguard.currencies ENABLE ALWAYS TRIGGER currencies_user_rows;

-- ==== An unknown outcome never becomes a free charge: attempts in doubt, reconciliation, throttles, the issuer's bounds ====
-- For a user of the proxy:
--   - each reservation numbers the attempts forwarded with its key and
--     keeps those that may have charged (forwarded and not answered, or
--     answered with no definite outcome); a refusal releases the amount
--     only when no other attempt is in doubt, and 409 and 429 (never
--     executed) release it then too;
--   - vault_authorize takes the request's metadata[billguard_key] and the
--     proxy's idempotency window: a key still reserved past it is handed to
--     reconciliation (decision reconcile) instead of being forwarded blind;
--     it answers each attempt's number and whether a refusal is a throttle:
--     a cap refusal while the budget's open reservations would leave room
--     is 429 spend_cap_pending, retried; spend_cap_exceeded only when what
--     has settled leaves none;
--   - vault_settle takes the attempt it answers (answering one twice
--     changes nothing);
--   - vault_reconcile records what the proxy found at Stripe (found,
--     absent, uncertain); vault_reservations_in_doubt lists what its
--     reconciler looks up by itself;
--   - issue_vault_key bounds the issuer token's keys: they expire within
--     issuer_max_key_days (100) and name periods at most
--     issuer_period_months (1) from the current one.
-- The grants of the proxy's role name the new signatures (README).

-- Added without defaults, filled, then given them: a default given with
-- ADD COLUMN would stay in the catalog as the rows' missing value, which a
-- fresh install does not have.
ALTER TABLE billguard.vault_reservations
  ADD COLUMN search_key text,
  ADD COLUMN attempts integer,
  ADD COLUMN attempts_in_doubt integer[],
  ADD COLUMN last_forwarded_at timestamptz;
-- A reservation reserved before this update had one attempt, of unknown
-- outcome until it settles.
UPDATE billguard.vault_reservations
   SET attempts = 1,
       attempts_in_doubt = CASE WHEN status = 'reserved' THEN ARRAY[1] ELSE '{}' END,
       last_forwarded_at = reserved_at;
ALTER TABLE billguard.vault_reservations
  ALTER COLUMN attempts SET DEFAULT 0, ALTER COLUMN attempts SET NOT NULL,
  ALTER COLUMN attempts_in_doubt SET DEFAULT '{}', ALTER COLUMN attempts_in_doubt SET NOT NULL,
  ADD CONSTRAINT vault_reservations_doubt_only_reserved CHECK (status = 'reserved' OR attempts_in_doubt = '{}');
ALTER TABLE billguard.vault_audit DROP CONSTRAINT vault_audit_decision_valid;
ALTER TABLE billguard.vault_audit ADD CONSTRAINT vault_audit_decision_valid CHECK (decision IN (
    'forwarded', 'reserved', 'reused', 'replayed', 'refused',   -- vault_authorize
    'reconcile',
    'settled', 'released', 'unknown',                           -- vault_settle, vault_reconcile
    'issued', 'revoked', 'cap_raised'));                        -- keys and caps

DROP FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text);
DROP FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text);
DROP FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric);
DROP FUNCTION billguard.vault_issue_key(text, text, numeric, text[], timestamptz, boolean, numeric);

-- The work of issue_vault_key(); PL/pgSQL cannot name an input and an
-- output column alike, as issue_vault_key's public signature does.
CREATE FUNCTION billguard.vault_issue_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean, issuer_max_period_usd numeric,
                                          issuer_max_key_days integer, issuer_period_months integer)
  RETURNS TABLE (secret text, new_key_id text, cap_cents bigint)
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  cap     bigint := billguard.usd_to_cents(period_usd_cap);
  budget  billguard.vault_budgets;
  -- The issuer's bounds on a key's life and on the periods it names; the
  -- documented defaults when the caller passes none.
  max_days   integer := coalesce(issuer_max_key_days, 100);
  max_months integer := coalesce(issuer_period_months, 1);
  months_away integer;
BEGIN
  IF vendor IS NULL OR vendor !~ '^[a-z][a-z0-9_]{0,39}$' THEN
    RAISE EXCEPTION 'vendor must be 1..40 lower-case letters, digits or _ (e.g. stripe), got %',
                    coalesce(quote_literal(left(vendor, 40)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  PERFORM billguard.check_billing_period(billing_period);
  IF NOT billguard.are_vault_endpoints(allowed_endpoints) THEN
    RAISE EXCEPTION 'allowed_endpoints must be 1..20 API paths such as /v1/payment_intents, got %',
                    coalesce(left(allowed_endpoints::text, 200), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF expires_at IS NULL OR expires_at <= now() THEN
    RAISE EXCEPTION 'expires_at must be in the future, got %', coalesce(expires_at::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF livemode IS NULL THEN
    RAISE EXCEPTION 'livemode must not be NULL' USING ERRCODE = 'invalid_parameter_value';
  END IF;

  -- The issuer token's request (issuer_max_period_usd given; the admin's is
  -- NULL): the dispatcher's, never more. Its key (vault_key_request) is for
  -- vendor stripe and the charge endpoints and their search, and it creates
  -- a budget only up to the operator's ceiling. Where the period's budget
  -- exists, the cap check below applies as to the admin: another cap is 409
  -- naming the budget's, and joining at it raises nothing, so a budget an
  -- admin made larger than the ceiling is still joined. The issuer is who
  -- the cap guards against (billing software, a compromised billing
  -- database): another vendor name, other endpoints or a larger new budget
  -- are the admin's.
  IF issuer_max_period_usd IS NOT NULL THEN
    IF max_days NOT BETWEEN 1 AND 36500 OR max_months NOT BETWEEN 0 AND 1200 THEN
      RAISE EXCEPTION 'issuer_max_key_days must be 1..36500 and issuer_period_months 0..1200, got % and %',
                      max_days, max_months
        USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF vendor <> 'stripe' THEN
      RAISE EXCEPTION 'the issuer token may ask for vendor stripe only, not %', quote_literal(vendor)
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key.';
    END IF;
    IF NOT allowed_endpoints <@ ARRAY['/v1/payment_intents', '/v1/payment_intents/search',
                                      '/v1/charges', '/v1/charges/search'] THEN
      RAISE EXCEPTION 'the issuer token may ask for /v1/payment_intents, /v1/charges and their /search only, not %',
                      array_to_string(allowed_endpoints, ', ')
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key.';
    END IF;
    IF cap > billguard.usd_to_cents(issuer_max_period_usd)
       AND NOT EXISTS (SELECT FROM billguard.vault_budgets b
                        WHERE (b.vendor, b.billing_period, b.currency)
                            = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')) THEN
      RAISE EXCEPTION 'the issuer token may create a budget of at most % USD (--issuer-max-period-usd), not % USD for billing_period %',
                      to_char(billguard.usd_to_cents(issuer_max_period_usd) / 100.0, 'FM999999999999990.00'),
                      to_char(cap / 100.0, 'FM999999999999990.00'), billing_period
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Have an admin create the period''s budget (POST /keys with the admin token), or raise the ceiling.';
    END IF;
    -- A key that never expires, or one for any period the issuer names
    -- (opening its budget, or joining an old one with room left), would
    -- outlive or outreach what the dispatcher needs: its key lives 35 days
    -- past the later of its period's end and now, and it bills the period
    -- just ended (or the current one). The operator widens both.
    IF expires_at > now() + make_interval(days => max_days) THEN
      RAISE EXCEPTION 'the issuer token may ask for a key that expires within % days (--issuer-max-key-days), not at %',
                      max_days, expires_at
        USING ERRCODE = 'insufficient_privilege', HINT = 'Ask for an earlier expires_at, or have an admin issue this key.';
    END IF;
    months_away := abs((split_part(billing_period, '-', 1)::integer * 12 + split_part(billing_period, '-', 2)::integer)
                       - (extract(year FROM now() AT TIME ZONE 'UTC')::integer * 12
                          + extract(month FROM now() AT TIME ZONE 'UTC')::integer));
    IF months_away > max_months THEN
      RAISE EXCEPTION 'the issuer token may ask for billing periods within % month(s) of the current one (%, --issuer-period-months), not %',
                      max_months, to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM'), billing_period
        USING ERRCODE = 'insufficient_privilege', HINT = 'Have an admin issue this key, or widen --issuer-period-months.';
    END IF;
  END IF;

  INSERT INTO billguard.vault_budgets AS b (vendor, billing_period, currency, cap_cents)
  VALUES (vendor, billing_period, 'usd', cap)
  ON CONFLICT DO NOTHING;
  SELECT * INTO STRICT budget FROM billguard.vault_budgets b
   WHERE (b.vendor, b.billing_period, b.currency)
       = (vault_issue_key.vendor, vault_issue_key.billing_period, 'usd')
     FOR UPDATE;
  IF budget.cap_cents <> cap THEN
    RAISE EXCEPTION 'billing_period % of % already has a cap of % USD', billing_period, vendor,
                    to_char(budget.cap_cents / 100.0, 'FM999999999999990.00')
      USING ERRCODE = 'unique_violation',
            DETAIL = 'A second key of a period joins its budget and never changes its cap.',
            HINT = 'Ask with the same period_usd_cap, or have an admin raise the cap.';
  END IF;

  secret := CASE WHEN livemode THEN 'vk_live_' ELSE 'vk_test_' END || billguard.random_base62(32);
  new_key_id := 'vkey_' || billguard.random_base62(16);
  cap_cents := cap;
  INSERT INTO billguard.vault_keys (key_id, secret_sha256, vendor, billing_period, currency,
                                    allowed_endpoints, livemode, expires_at)
  VALUES (new_key_id, sha256(convert_to(secret, 'UTF8')), vendor, billing_period, 'usd',
          allowed_endpoints, livemode, expires_at);

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, currency, decision, reason)
  VALUES (new_key_id, vendor, billing_period, 'usd', 'issued',
          format('cap %s USD, endpoints %s, expires %s',
                 to_char(cap / 100.0, 'FM999999999999990.00'),
                 array_to_string(allowed_endpoints, ' '), expires_at));

  -- The scheduler entity records every key issued; the advisory lock
  -- serialises appends to it, as bill_period's do.
  PERFORM pg_advisory_xact_lock(billguard.scheduler_lock_class(), 0);
  PERFORM billguard.append_event('billing-scheduler', billguard.highest_seq_nr('billing-scheduler'),
                                 'VaultKeyIssued',
                                 jsonb_build_object('billing_period', billing_period,
                                                    'key_id', new_key_id,
                                                    'cap_usd', round(cap / 100.0, 2),
                                                    'vendor', vendor));
  RETURN NEXT;
END $$;

CREATE FUNCTION billguard.issue_vault_key(vendor text, billing_period text, period_usd_cap numeric,
                                          allowed_endpoints text[], expires_at timestamptz,
                                          livemode boolean DEFAULT true,
                                          issuer_max_period_usd numeric DEFAULT NULL,
                                          issuer_max_key_days integer DEFAULT NULL,
                                          issuer_period_months integer DEFAULT NULL)
  RETURNS TABLE (vault_key text, key_id text, cap_usd numeric, vendor text)
  LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT k.secret, k.new_key_id, round(k.cap_cents / 100.0, 2), issue_vault_key.vendor
      FROM billguard.vault_issue_key(issue_vault_key.vendor, issue_vault_key.billing_period,
                                     issue_vault_key.period_usd_cap, issue_vault_key.allowed_endpoints,
                                     issue_vault_key.expires_at, issue_vault_key.livemode,
                                     issue_vault_key.issuer_max_period_usd,
                                     issue_vault_key.issuer_max_key_days,
                                     issue_vault_key.issuer_period_months) k;
  END;
COMMENT ON FUNCTION billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric, integer, integer) IS
  'A new vault key (vk_live_/vk_test_ + 32 base62, returned once) spending the period''s budget; 23505 when the budget has another cap; with issuer_max_period_usd (the issuer token''s request) 42501 beyond vendor stripe, the charge endpoints, that ceiling for a new budget, a key living past issuer_max_key_days (100) or a period more than issuer_period_months (1) from the current one.';

-- secret_sha256: SHA-256 of the vault key the caller presented (the proxy
-- never passes the secret). request_digest: SHA-256 (hex) of the method,
-- path, parameters and the headers that change Stripe's answer
-- (Stripe-Version). amount_cents NULL: a request that moves no money
-- (reads, search), allowed by scope alone and never counted. search_key:
-- the request's metadata[billguard_key], kept to search Stripe by.
-- idempotency_window: how long the proxy trusts Stripe to remember a key.
-- Answers decision: forwarded (not counted), reserved (counted now), reused
-- (the key's reservation, counted once already), replayed (a settled
-- success: answer with http_status and body, and forward nothing),
-- reconcile (the key is still reserved past the idempotency window: find
-- out at Stripe what its attempts did, vault_reconcile, before anything is
-- forwarded; body holds what the ledger knows of it) or refused (answer
-- with http_status and body; should_retry when the refusal is a throttle).
-- key_id names the key and attempt the attempt for vault_settle.
CREATE FUNCTION billguard.vault_authorize(secret_sha256 bytea, method text, endpoint text,
                                          idempotency_key text, request_digest text,
                                          amount_cents bigint, currency text, customer text,
                                          search_key text DEFAULT NULL,
                                          idempotency_window interval DEFAULT '23 hours')
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text,
                 attempt integer, should_retry boolean)
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  amount    bigint := vault_authorize.amount_cents;
  idem      text := vault_authorize.idempotency_key;
  k         billguard.vault_keys;
  held      billguard.vault_reservations;
  known_key boolean;   -- a reservation exists for the Idempotency-Key
  verdict   text;
  status    integer;
  error_type text := 'invalid_request_error';
  code      text;
  reason    text;
  answer    text;
  replay_request_id text;
  object_id text;      -- of a POST on an object: /v1/payment_intents/<id>/...
  attempt_no integer;
  retriable boolean := false;
  settled_cents bigint;
BEGIN
  IF octet_length(vault_authorize.secret_sha256) IS DISTINCT FROM 32 THEN
    RAISE EXCEPTION 'secret_sha256 must be 32 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.method IS NULL OR vault_authorize.method !~ '^[A-Z]{1,16}$' THEN
    RAISE EXCEPTION 'method must be an HTTP method in upper case' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.endpoint IS NULL OR vault_authorize.endpoint !~ '^/v1(/[A-Za-z0-9_]+)+$' THEN
    RAISE EXCEPTION 'endpoint must be an API path such as /v1/payment_intents, got %',
                    coalesce(quote_literal(left(vault_authorize.endpoint, 80)), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF vault_authorize.request_digest IS NULL OR vault_authorize.request_digest !~ '^[0-9a-f]{64}$' THEN
    RAISE EXCEPTION 'request_digest must be 64 lower-case hex characters' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(idem) NOT BETWEEN 1 AND 255 THEN
    RAISE EXCEPTION 'idempotency_key must be 1..255 bytes' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF amount NOT BETWEEN 1 AND 99999999 THEN
    RAISE EXCEPTION 'amount must be a positive integer of at most 99999999, got %', amount
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.customer) > 255 OR octet_length(vault_authorize.currency) > 16 THEN
    RAISE EXCEPTION 'customer or currency too long' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF octet_length(vault_authorize.search_key) NOT BETWEEN 1 AND 500 THEN
    RAISE EXCEPTION 'search_key must be 1..500 bytes (a metadata value)' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  -- Stripe keeps a key at least 24 hours: a longer window would trust a
  -- memory Stripe may have pruned.
  IF vault_authorize.idempotency_window IS NULL
     OR vault_authorize.idempotency_window NOT BETWEEN interval '1 second' AND interval '24 hours' THEN
    RAISE EXCEPTION 'idempotency_window must be between 1 second and 24 hours, got %',
                    coalesce(vault_authorize.idempotency_window::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  <<decide>>
  BEGIN
    SELECT * INTO k FROM billguard.vault_keys v WHERE v.secret_sha256 = vault_authorize.secret_sha256;
    IF NOT FOUND THEN
      status := 401; code := 'vault_key_unknown'; reason := 'unknown vault key';
      EXIT decide;
    ELSIF k.revoked_at IS NOT NULL THEN
      status := 401; code := 'vault_key_revoked'; reason := format('vault key %s was revoked', k.key_id);
      EXIT decide;
    ELSIF k.expires_at <= now() THEN
      status := 401; code := 'vault_key_expired'; reason := format('vault key %s expired', k.key_id);
      EXIT decide;
    END IF;
    IF vault_authorize.method NOT IN ('GET', 'POST')
       OR NOT EXISTS (SELECT FROM unnest(k.allowed_endpoints) e
                       WHERE vault_authorize.endpoint = e OR starts_with(vault_authorize.endpoint, e || '/')) THEN
      status := 403; code := 'endpoint_not_allowed';
      reason := format('vault key %s may call GET and POST on %s only, not %s %s', k.key_id,
                       array_to_string(k.allowed_endpoints, ', '), vault_authorize.method,
                       vault_authorize.endpoint);
      EXIT decide;
    END IF;
    -- A POST on an object (confirm, capture, update) may move money its
    -- creation counted: only one this budget created, never an object made
    -- with the real key or another budget's key, which was never counted here.
    SELECT split_part(substr(vault_authorize.endpoint, length(e) + 2), '/', 1) INTO object_id
      FROM unnest(k.allowed_endpoints) e
     WHERE vault_authorize.method = 'POST' AND starts_with(vault_authorize.endpoint, e || '/')
     ORDER BY length(e) DESC LIMIT 1;
    IF object_id IS NOT NULL
       AND NOT EXISTS (SELECT FROM billguard.vault_reservations r
                        WHERE (r.vendor, r.billing_period, r.currency) = (k.vendor, k.billing_period, k.currency)
                          AND r.status = 'settled' AND r.charge_id = object_id) THEN
      status := 403; code := 'object_not_in_budget';
      reason := format('vault key %s may POST only on objects the budget of billing_period %s created, not %s',
                       k.key_id, k.billing_period, object_id);
      EXIT decide;
    END IF;
    IF amount IS NULL THEN
      verdict := 'forwarded';
      EXIT decide;
    END IF;
    IF vault_authorize.currency IS NULL THEN
      status := 400; code := 'parameter_missing'; reason := 'Missing required param: currency.';
      EXIT decide;
    ELSIF lower(vault_authorize.currency) <> k.currency THEN
      status := 403; code := 'currency_not_allowed';
      reason := format('the budget of vault key %s is in %s, not %s', k.key_id, k.currency,
                       lower(vault_authorize.currency));
      EXIT decide;
    END IF;
    IF idem IS NULL THEN
      -- Without a key a retry is a second charge, which the cap exists to stop.
      status := 400; code := 'idempotency_key_required';
      reason := 'a request with an amount needs an Idempotency-Key';
      EXIT decide;
    END IF;

    -- Decisions on one Idempotency-Key are serialised by its own lock,
    -- taken before the reservation exists; the budget's row is locked last.
    PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency, idem);
    SELECT * INTO held FROM billguard.vault_reservations r
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (k.vendor, k.billing_period, k.currency, idem);
    known_key := FOUND;
    IF known_key AND held.request_digest <> vault_authorize.request_digest THEN
      status := 400; error_type := 'idempotency_error'; code := NULL;
      reason := format('Keys for idempotent requests can only be used with the same parameters they '
                       'were first used with. Try using a key other than ''%s'' if you meant to '
                       'execute a different request.', idem);
      EXIT decide;
    ELSIF known_key AND held.status = 'settled' THEN
      verdict := 'replayed'; status := held.response_status; answer := held.response_body;
      replay_request_id := held.response_request_id;
      reason := format('settled as %s at %s', held.charge_id, held.settled_at);
      EXIT decide;
    ELSIF known_key AND held.status = 'reserved' THEN
      -- Past the window Stripe may have forgotten the key: sent again, a
      -- charge that did happen would happen twice, counted once.
      IF held.reserved_at < now() - vault_authorize.idempotency_window THEN
        verdict := 'reconcile';
        answer := jsonb_build_object(
          'key_id', held.key_id, 'endpoint', held.endpoint, 'customer', held.customer,
          'search_key', held.search_key, 'attempts', held.attempts,
          'attempts_in_doubt', to_jsonb(held.attempts_in_doubt),
          'reserved_at', extract(epoch FROM held.reserved_at),
          'last_forwarded_at', extract(epoch FROM coalesce(held.last_forwarded_at, held.reserved_at)))::text;
        reason := format('reserved at %s, past the idempotency window of %s: reconciled with Stripe '
                         'before anything is forwarded', held.reserved_at, vault_authorize.idempotency_window);
        EXIT decide;
      END IF;
      UPDATE billguard.vault_reservations r
         SET attempts = r.attempts + 1, attempts_in_doubt = r.attempts_in_doubt || (r.attempts + 1),
             last_forwarded_at = now()
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem)
      RETURNING r.attempts INTO attempt_no;
      verdict := 'reused';
      EXIT decide;
    END IF;
    -- The cap check and the reservation in one UPDATE: the budget's row lock
    -- is held from here to the commit. Once a concurrent holder commits, the
    -- UPDATE checks the cap again against the row it left.
    UPDATE billguard.vault_budgets b SET committed_cents = b.committed_cents + amount, updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency)
       AND b.committed_cents + amount <= b.cap_cents;
    IF NOT FOUND THEN
      -- Room held by reservations still open (in flight, declined but not
      -- yet settled, of unknown outcome) may come back in a moment: that
      -- refusal is a throttle. Only when what has settled leaves no room
      -- is it final. One statement, one snapshot: the budget's committed
      -- sum and its open reservations agree.
      SELECT b.committed_cents - (SELECT coalesce(sum(v.amount_cents), 0)
                                    FROM billguard.vault_reservations v
                                   WHERE (v.vendor, v.billing_period, v.currency)
                                       = (b.vendor, b.billing_period, b.currency)
                                     AND v.status = 'reserved')
        INTO settled_cents
        FROM billguard.vault_budgets b
       WHERE (b.vendor, b.billing_period, b.currency) = (k.vendor, k.billing_period, k.currency);
      status := 429;
      IF settled_cents + amount <= (SELECT b.cap_cents FROM billguard.vault_budgets b
                                     WHERE (b.vendor, b.billing_period, b.currency)
                                         = (k.vendor, k.billing_period, k.currency)) THEN
        code := 'spend_cap_pending'; retriable := true;
        reason := format('the spend cap of billing_period %s is held by charges in flight or of '
                         'unknown outcome; retry later with the same Idempotency-Key', k.billing_period);
      ELSE
        code := 'spend_cap_exceeded';
        reason := format('spend cap exceeded for billing_period %s', k.billing_period);
      END IF;
      EXIT decide;
    END IF;
    -- Written under the budget's lock, so that concurrent reservations never
    -- share the key lock their foreign keys take on the budget and key rows.
    IF known_key THEN
      -- Released earlier, so no attempt before can have charged: counted
      -- again from this attempt on, and its window starts now.
      UPDATE billguard.vault_reservations r
         SET status = 'reserved', key_id = k.key_id, reserved_at = now(), last_forwarded_at = now(),
             attempts = r.attempts + 1, attempts_in_doubt = ARRAY[r.attempts + 1]
       WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
           = (k.vendor, k.billing_period, k.currency, idem)
      RETURNING r.attempts INTO attempt_no;
    ELSE
      INSERT INTO billguard.vault_reservations
             (vendor, billing_period, currency, idempotency_key, request_digest, key_id, endpoint,
              customer, amount_cents, search_key, attempts, attempts_in_doubt, last_forwarded_at)
      VALUES (k.vendor, k.billing_period, k.currency, idem, vault_authorize.request_digest, k.key_id,
              vault_authorize.endpoint, vault_authorize.customer, amount, vault_authorize.search_key,
              1, ARRAY[1], now());
      attempt_no := 1;
    END IF;
    verdict := 'reserved';
  END;

  IF verdict IS NULL THEN
    verdict := 'refused';
    answer := billguard.stripe_error_body(error_type, code, reason);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (k.key_id, k.vendor, k.billing_period, vault_authorize.method, vault_authorize.endpoint,
          vault_authorize.customer, amount, lower(vault_authorize.currency), idem, verdict, status,
          reason);
  RETURN QUERY SELECT verdict, status, answer, k.key_id, replay_request_id, attempt_no, retriable;
END $$;
COMMENT ON FUNCTION billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text, text, interval) IS
  'Decides a request of the spend-cap proxy and reserves its amount; audited.';

-- The reservation of an Idempotency-Key in the budget a vault key spends,
-- with the key's lock taken (as vault_authorize takes it; the budget's row
-- lock, when its committed sum changes at all, comes last): what
-- vault_settle and vault_reconcile decide on. P0002 when there is none.
CREATE FUNCTION billguard.lock_vault_reservation(key_id text, idempotency_key text)
  RETURNS billguard.vault_reservations
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  k    billguard.vault_keys;
  held billguard.vault_reservations;
BEGIN
  SELECT * INTO k FROM billguard.vault_keys v WHERE v.key_id = lock_vault_reservation.key_id;
  PERFORM billguard.lock_vault_idempotency_key(k.vendor, k.billing_period, k.currency,
                                               lock_vault_reservation.idempotency_key);
  SELECT * INTO held FROM billguard.vault_reservations r
   WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
       = (k.vendor, k.billing_period, k.currency, lock_vault_reservation.idempotency_key);
  IF NOT FOUND THEN
    RAISE EXCEPTION 'no reservation of vault key % for Idempotency-Key %',
                    coalesce(quote_literal(left(lock_vault_reservation.key_id, 40)), 'NULL'),
                    coalesce(quote_literal(left(lock_vault_reservation.idempotency_key, 255)), 'NULL')
      USING ERRCODE = 'no_data_found';
  END IF;
  RETURN held;
END $$;

-- Ends a reservation's doubt: settled (a success, its answer kept to be
-- replayed) or released (no attempt of its key can have charged).
CREATE FUNCTION billguard.close_vault_reservation(held billguard.vault_reservations, outcome text,
                                                  upstream_status integer, charge_id text,
                                                  response_body text, request_id text)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF outcome = 'settled' THEN
    UPDATE billguard.vault_reservations r
       SET status = 'settled', upstream_status = close_vault_reservation.upstream_status,
           charge_id = close_vault_reservation.charge_id,
           response_status = close_vault_reservation.upstream_status,
           response_body = coalesce(close_vault_reservation.response_body, ''),
           response_request_id = close_vault_reservation.request_id, settled_at = now(),
           attempts_in_doubt = '{}'
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.idempotency_key);
  ELSE
    UPDATE billguard.vault_reservations r
       SET status = 'released', attempts_in_doubt = '{}',
           upstream_status = coalesce(close_vault_reservation.upstream_status, r.upstream_status)
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.idempotency_key);
  END IF;
END $$;

-- The budget's committed sum once a reservation `held` became `outcome`,
-- as the last write before the commit, and only when the reservation
-- starts or stops being counted: a success settling a reservation was
-- counted when it was reserved, and leaves the budget's row alone. A
-- success after a release
-- (Stripe answering a key it refused before) is still money spent: it is
-- counted again, whatever the cap says.
-- PL/pgSQL, whose plans a session keeps, rather than SQL, whose body is
-- planned again at every call: this runs at every settle.
CREATE FUNCTION billguard.recount_vault_budget(held billguard.vault_reservations, outcome text)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF (outcome = 'settled' AND held.status = 'released') OR (outcome = 'released' AND held.status = 'reserved') THEN
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents
                             + CASE WHEN outcome = 'settled' THEN held.amount_cents ELSE -held.amount_cents END,
           updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (held.vendor, held.billing_period, held.currency);
  END IF;
END $$;

-- Stripe's answer to attempt `attempt` of a request vault_authorize
-- reserved or reused. 2xx: settled, its answer kept for replays. 402, or
-- 400/404 of type invalid_request_error: Stripe refused this attempt; 409
-- (the key in use) and 429 (rate limited): it never executed. Either
-- releases the amount only when no other attempt of the key is in doubt;
-- otherwise the amount stays reserved until a success or vault_reconcile
-- settles it. Anything else (500, 502-504, timeouts and dropped
-- connections as upstream_status 0): the attempt's outcome is unknown, it
-- stays in doubt, and so does the reservation. Answering an attempt again
-- changes nothing, so a settle may be retried. Answers settled, released
-- or unknown.
CREATE FUNCTION billguard.vault_settle(key_id text, idempotency_key text, upstream_status integer,
                                       error_type text, charge_id text, response_body text,
                                       request_id text, attempt integer)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  held    billguard.vault_reservations;
  kind    text;      -- settled, refused, not_executed or unknown
  outcome text;
  still_in_doubt integer[];
  why     text;
BEGIN
  IF upstream_status IS NULL OR upstream_status NOT BETWEEN 0 AND 599 THEN
    RAISE EXCEPTION 'upstream_status must be 0 (no answer) or an HTTP status'
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  held := billguard.lock_vault_reservation(vault_settle.key_id, vault_settle.idempotency_key);
  IF vault_settle.attempt IS NULL OR vault_settle.attempt NOT BETWEEN 1 AND held.attempts THEN
    RAISE EXCEPTION 'attempt must be one of the key''s attempts, 1..%, got %', held.attempts,
                    coalesce(vault_settle.attempt::text, 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;

  kind := CASE
    WHEN upstream_status BETWEEN 200 AND 299 THEN 'settled'
    WHEN upstream_status = 402 OR (upstream_status IN (400, 404)
                                   AND vault_settle.error_type = 'invalid_request_error') THEN 'refused'
    -- Stripe's rate limiters run before its idempotency layer, and a key in
    -- use is refused before the request runs: neither executed anything.
    WHEN upstream_status IN (409, 429) THEN 'not_executed'
    ELSE 'unknown'
  END;
  still_in_doubt := CASE WHEN kind = 'unknown' THEN held.attempts_in_doubt
                         ELSE array_remove(held.attempts_in_doubt, vault_settle.attempt) END;
  outcome := CASE WHEN kind = 'settled' THEN 'settled'
                  WHEN kind = 'unknown' OR still_in_doubt <> '{}' THEN 'unknown'
                  ELSE 'released' END;
  IF (outcome = 'settled' AND held.status <> 'settled') OR (outcome = 'released' AND held.status = 'reserved') THEN
    PERFORM billguard.close_vault_reservation(held, outcome, vault_settle.upstream_status,
                                              vault_settle.charge_id, vault_settle.response_body,
                                              vault_settle.request_id);
  ELSIF held.status = 'reserved' THEN
    UPDATE billguard.vault_reservations r
       SET upstream_status = vault_settle.upstream_status, attempts_in_doubt = still_in_doubt
     WHERE (r.vendor, r.billing_period, r.currency, r.idempotency_key)
         = (held.vendor, held.billing_period, held.currency, held.idempotency_key);
    IF kind <> 'unknown' THEN
      why := format('%s %s to attempt %s, but attempt %s of the key may have charged: kept reserved '
                    'until reconciled', upstream_status, coalesce(vault_settle.error_type, ''),
                    vault_settle.attempt, array_to_string(still_in_doubt, ', '));
    END IF;
  END IF;

  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_settle.key_id, held.vendor, held.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, held.currency, vault_settle.idempotency_key, outcome, upstream_status,
          CASE WHEN outcome = 'settled' THEN coalesce(vault_settle.charge_id, held.charge_id)
               WHEN why IS NOT NULL THEN why
               WHEN upstream_status = 0 THEN 'no answer from upstream'
               ELSE vault_settle.error_type END);
  PERFORM billguard.recount_vault_budget(held, outcome);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_settle(text, text, integer, text, text, text, text, integer) IS
  'Records Stripe''s answer to one attempt of a reserved request: settled, released (no attempt can have charged) or unknown (still reserved); audited.';

-- What the proxy found at Stripe about a reservation still reserved past
-- the idempotency window, or whose attempts are in doubt long after the
-- last one: found (a charged object the key created: settled with that
-- object as its answer, which is then replayed), absent (Stripe holds no
-- charge of the key: released, so a retry is counted again from scratch)
-- or uncertain (neither can be proved: nothing changes, the reason is
-- audited). attempts is the reservation's attempt count when the lookup
-- began: an absence seen before a newer attempt proves nothing about it,
-- and is answered stale. Answers settled, released, unknown or stale.
CREATE FUNCTION billguard.vault_reconcile(key_id text, idempotency_key text, attempts integer,
                                          finding text, charge_id text, response_body text,
                                          request_id text, reason text)
  RETURNS text
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  held    billguard.vault_reservations;
  outcome text;
BEGIN
  IF finding IS NULL OR finding NOT IN ('found', 'absent', 'uncertain') THEN
    RAISE EXCEPTION 'finding must be found, absent or uncertain, got %', coalesce(quote_literal(finding), 'NULL')
      USING ERRCODE = 'invalid_parameter_value';
  END IF;
  IF finding = 'found' AND (vault_reconcile.charge_id IS NULL OR vault_reconcile.response_body IS NULL) THEN
    RAISE EXCEPTION 'a charge found needs its id and its object' USING ERRCODE = 'invalid_parameter_value';
  END IF;
  held := billguard.lock_vault_reservation(vault_reconcile.key_id, vault_reconcile.idempotency_key);
  outcome := CASE
    -- A charge found is a fact, whatever happened since.
    WHEN finding = 'found' THEN 'settled'
    WHEN held.status <> 'reserved' OR held.attempts IS DISTINCT FROM vault_reconcile.attempts THEN 'stale'
    WHEN finding = 'absent' THEN 'released'
    ELSE 'unknown'
  END;
  IF outcome = 'stale' OR (outcome = 'settled' AND held.status = 'settled') THEN
    RETURN outcome;
  END IF;
  IF outcome <> 'unknown' THEN
    PERFORM billguard.close_vault_reservation(held, outcome, CASE WHEN outcome = 'settled' THEN 200 END,
                                              vault_reconcile.charge_id, vault_reconcile.response_body,
                                              vault_reconcile.request_id);
  END IF;
  INSERT INTO billguard.vault_audit (key_id, vendor, billing_period, method, endpoint, customer,
                                     amount_cents, currency, idempotency_key, decision, http_status,
                                     reason)
  VALUES (vault_reconcile.key_id, held.vendor, held.billing_period, 'POST', held.endpoint, held.customer,
          held.amount_cents, held.currency, vault_reconcile.idempotency_key, outcome, NULL,
          left('reconciled with Stripe: ' || coalesce(vault_reconcile.reason, finding), 1000));
  PERFORM billguard.recount_vault_budget(held, outcome);
  RETURN outcome;
END $$;
COMMENT ON FUNCTION billguard.vault_reconcile(text, text, integer, text, text, text, text, text) IS
  'Settles or releases a reserved request from what the proxy found at Stripe; audited.';

-- The reservations whose attempts are in doubt and whose last attempt was
-- forwarded more than quiet_for ago: no attempt of them is still on its
-- way, and the proxy looks each up at Stripe by itself, so that no
-- unknown outcome holds a budget's room, or waits for its key to come
-- back, for ever. The oldest first.
CREATE FUNCTION billguard.vault_reservations_in_doubt(quiet_for interval, max_rows integer)
  RETURNS TABLE (key_id text, idempotency_key text, endpoint text, customer text, search_key text,
                 attempts integer, reserved_at double precision, last_forwarded_at double precision)
  LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT r.key_id, r.idempotency_key, r.endpoint, r.customer, r.search_key, r.attempts,
           extract(epoch FROM r.reserved_at)::double precision,
           extract(epoch FROM coalesce(r.last_forwarded_at, r.reserved_at))::double precision
      FROM billguard.vault_reservations r
     WHERE r.status = 'reserved' AND r.attempts_in_doubt <> '{}'
       AND coalesce(r.last_forwarded_at, r.reserved_at) < now() - vault_reservations_in_doubt.quiet_for
     ORDER BY coalesce(r.last_forwarded_at, r.reserved_at)
     LIMIT greatest(vault_reservations_in_doubt.max_rows, 0);
  END;
COMMENT ON FUNCTION billguard.vault_reservations_in_doubt(interval, integer) IS
  'Reserved requests with attempts in doubt and no attempt for quiet_for, oldest first: for the proxy''s reconciler.';

REVOKE ALL ON FUNCTION
  billguard.vault_issue_key(text, text, numeric, text[], timestamptz, boolean, numeric, integer, integer),
  billguard.issue_vault_key(text, text, numeric, text[], timestamptz, boolean, numeric, integer, integer),
  billguard.vault_authorize(bytea, text, text, text, text, bigint, text, text, text, interval),
  billguard.vault_settle(text, text, integer, text, text, text, text, integer),
  billguard.vault_reconcile(text, text, integer, text, text, text, text, text),
  billguard.vault_reservations_in_doubt(interval, integer),
  billguard.lock_vault_reservation(text, text),
  billguard.close_vault_reservation(billguard.vault_reservations, text, integer, text, text, text),
  billguard.recount_vault_budget(billguard.vault_reservations, text) FROM PUBLIC;
