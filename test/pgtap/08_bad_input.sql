-- 08_bad_input.sql: bad input gets a clear error and changes nothing.
--
-- Proves: NULLs, empty strings, malformed periods ('2026-13', '2026-8',
-- ' 2026-08'), 10 kB strings and SQL-injection-looking strings given to
-- bill_customer / bill_period / period_status / idempotency_key /
-- entity_state, and invalid rows for billguard.accounts (zero or negative
-- amounts, unknown or upper-case currency, malformed stripe_customer, blank,
-- control-character or over-long customer ids, NULLs), are each refused with
-- the exact SQLSTATE (22023, or 23514 check / 23503 foreign key / 23502 not
-- null / 23505 unique), never XX000, and after each refusal the row counts
-- of accounts, billing_records and journal are unchanged. Finally an
-- account whose id looks like SQL injection is billed like any other and
-- nothing is dropped.
BEGIN;
SELECT plan(101);

INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, active) VALUES
  ('t08_good', 'cus_t08good', 1000, 'usd', true),
  ('t08_off', 'cus_t08off', 1000, 'usd', false);

-- Row counts of accounts, billing_records, journal and snapshots, as one
-- comparable value.
CREATE FUNCTION pg_temp.t08_counts() RETURNS text LANGUAGE sql AS $$
  SELECT format('accounts=%s records=%s journal=%s snapshots=%s',
                (SELECT count(*) FROM billguard.accounts), (SELECT count(*) FROM billguard.billing_records),
                (SELECT count(*) FROM billguard.journal), (SELECT count(*) FROM billguard.snapshots))
$$;
SELECT pg_temp.t08_counts() AS baseline \gset

-- A refusal is two assertions: $statement fails with $sqlstate and
-- $message, and the row counts are still $baseline.
CREATE FUNCTION pg_temp.t08_refused(label text, statement text, sqlstate char(5), message text, baseline text)
RETURNS SETOF text LANGUAGE plpgsql AS $$
BEGIN
  RETURN NEXT throws_ok(statement, sqlstate, message, label || ' -> ' || sqlstate);
  RETURN NEXT is(pg_temp.t08_counts(), baseline, label || ': nothing written');
END
$$;

-- The cases, one row each (rows alike by design: a new case is one more
-- row): its label, the statement, and the SQLSTATE and message it must fail
-- with. pg_temp.t08_refused turns each into its two assertions, in the order
-- listed.
SELECT pg_temp.t08_refused(label, statement, sqlstate, message, :'baseline') FROM (VALUES
  ('bill_customer: NULL customer_id',
   $t$SELECT * FROM billguard.bill_customer(NULL, '2026-08')$t$,
   '22023', 'customer_id must not be NULL'),
  ('bill_customer: NULL billing_period',
   $t$SELECT * FROM billguard.bill_customer('t08_good', NULL)$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got NULL'),
  ('bill_customer: empty customer_id',
   $t$SELECT * FROM billguard.bill_customer('', '2026-08')$t$,
   '22023', 'customer_id must not be empty'),
  ('bill_customer: empty billing_period',
   $t$SELECT * FROM billguard.bill_customer('t08_good', '')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got '''''),
  ('bill_customer: period 2026-13',
   $t$SELECT * FROM billguard.bill_customer('t08_good', '2026-13')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2026-13'''),
  ('bill_customer: period 2026-8',
   $t$SELECT * FROM billguard.bill_customer('t08_good', '2026-8')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2026-8'''),
  ('bill_customer: period '' 2026-08''',
   $t$SELECT * FROM billguard.bill_customer('t08_good', ' 2026-08')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got '' 2026-08'''),
  ('bill_customer: 10 kB customer_id',
   $t$SELECT * FROM billguard.bill_customer(repeat('x', 10240), '2026-08')$t$,
   '22023', 'customer_id must be at most 255 bytes, got 10240'),
  ('bill_customer: 10 kB request_id',
   $t$SELECT * FROM billguard.bill_customer('t08_good', '2026-08', repeat('r', 10240))$t$,
   '22023', 'request_id must be at most 255 bytes'),
  ('bill_customer: SQL-injection-looking customer_id is just an unknown customer',
   $t$SELECT * FROM billguard.bill_customer($$x'); DROP TABLE billguard.accounts; --$$, '2026-08')$t$,
   '23503', 'customer ''x''''); DROP TABLE billguard.accounts; --'' is not in billguard.accounts'),
  ('bill_customer: SQL-injection-looking period',
   $t$SELECT * FROM billguard.bill_customer('t08_good', $$x'); DROP TABLE billguard.accounts; --$$)$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''x''''); DROP TABLE billguard.accounts; --'''),
  ('bill_customer: customer_id with a leading blank is another (unknown) customer',
   $t$SELECT * FROM billguard.bill_customer(' t08_good', '2026-08')$t$,
   '23503', 'customer '' t08_good'' is not in billguard.accounts'),
  ('bill_customer: inactive customer',
   $t$SELECT * FROM billguard.bill_customer('t08_off', '2026-08')$t$,
   '22023', 'customer ''t08_off'' is not active'),
  ('bill_period: NULL',
   $t$SELECT * FROM billguard.bill_period(NULL)$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got NULL'),
  ('bill_period: empty',
   $t$SELECT * FROM billguard.bill_period('')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got '''''),
  ('bill_period: 2026-13',
   $t$SELECT * FROM billguard.bill_period('2026-13')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2026-13'''),
  ('bill_period: 2026-8',
   $t$SELECT * FROM billguard.bill_period('2026-8')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2026-8'''),
  ('bill_period: '' 2026-08''',
   $t$SELECT * FROM billguard.bill_period(' 2026-08')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got '' 2026-08'''),
  ('bill_period: 10 kB period (message truncated to 40 characters)',
   $t$SELECT * FROM billguard.bill_period(repeat('x', 10240))$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'''),
  ('bill_period: SQL-injection-looking period',
   $t$SELECT * FROM billguard.bill_period($$x'); DROP TABLE billguard.accounts; --$$)$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''x''''); DROP TABLE billguard.accounts; --'''),
  ('period_status: SQL-injection-looking period',
   $t$SELECT * FROM billguard.period_status($$x'); DROP TABLE billguard.accounts; --$$)$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''x''''); DROP TABLE billguard.accounts; --'''),
  ('period_status: 2026-8',
   $t$SELECT * FROM billguard.period_status('2026-8')$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08), got ''2026-8'''),
  ('idempotency_key: 10 kB customer_id',
   $t$SELECT billguard.idempotency_key(repeat('x', 10240), '2026-08')$t$,
   '22023', 'customer_id must be at most 255 bytes, got 10240'),
  ('idempotency_key: SQL-injection-looking period',
   $t$SELECT billguard.idempotency_key('t08_good', $$x'); DROP TABLE billguard.accounts; --$$)$t$,
   '22023', 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)'),
  ('entity_state: NULL',
   $t$SELECT billguard.entity_state(NULL)$t$,
   '22023', 'persistence_id must not be NULL'),
  ('accounts: negative amount',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_neg', 'cus_t08neg', -100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_amount_positive"'),
  ('accounts: zero amount',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_zero', 'cus_t08zero', 0)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_amount_positive"'),
  ('accounts: stripe_account not acct_...',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, stripe_account) VALUES ('t08_bad_acct', 'cus_t08', 100, 'acct_x-y')$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_stripe_account_valid"'),
  ('accounts: unknown currency xyz',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency) VALUES ('t08_xyz', 'cus_t08xyz', 100, 'xyz')$t$,
   '23503', 'insert or update on table "accounts" violates foreign key constraint "accounts_currency_fkey"'),
  ('accounts: upper-case currency USD',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency) VALUES ('t08_upper', 'cus_t08upper', 100, 'USD')$t$,
   '23503', 'insert or update on table "accounts" violates foreign key constraint "accounts_currency_fkey"'),
  ('accounts: NULL currency',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency) VALUES ('t08_nullcur', 'cus_t08', 100, NULL)$t$,
   '23502', 'null value in column "currency" of relation "accounts" violates not-null constraint'),
  ('accounts: stripe_customer not cus_...',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_badcus', 'acct_123', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_stripe_customer_valid"'),
  ('accounts: empty stripe_customer',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_emptycus', '', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_stripe_customer_valid"'),
  ('accounts: SQL-injection-looking stripe_customer',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_injcus', $$x'); DROP TABLE billguard.accounts; --$$, 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_stripe_customer_valid"'),
  ('accounts: NULL stripe_customer',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_nullcus', NULL, 100)$t$,
   '23502', 'null value in column "stripe_customer" of relation "accounts" violates not-null constraint'),
  ('accounts: NULL customer_id',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (NULL, 'cus_t08', 100)$t$,
   '23502', 'null value in column "customer_id" of relation "accounts" violates not-null constraint'),
  ('accounts: empty customer_id',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('', 'cus_t08', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"'),
  ('accounts: customer_id with a leading blank',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (' t08_blank', 'cus_t08', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"'),
  ('accounts: customer_id with a control character',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (E't08_tab\t', 'cus_t08', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"'),
  ('accounts: 10 kB customer_id',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (repeat('x', 10240), 'cus_t08', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"'),
  ('accounts: 256-byte customer_id',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (repeat('x', 256), 'cus_t08', 100)$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"'),
  ('accounts: malformed payment_method',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, payment_method) VALUES ('t08_pm', 'cus_t08', 100, 'PM 1')$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_payment_method_valid"'),
  ('accounts: duplicate customer_id',
   $t$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t08_good', 'cus_t08dup', 100)$t$,
   '23505', 'duplicate key value violates unique constraint "accounts_pkey"'),
  ('accounts: UPDATE to a zero amount',
   $t$UPDATE billguard.accounts SET amount_cents = 0 WHERE customer_id = 't08_good'$t$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_amount_positive"'),
  ('accounts: UPDATE to upper-case currency',
   $t$UPDATE billguard.accounts SET currency = 'USD' WHERE customer_id = 't08_good'$t$,
   '23503', 'insert or update on table "accounts" violates foreign key constraint "accounts_currency_fkey"'),
  ('append_event: negative expected_seq_nr',
   $t$SELECT billguard.append_event($$x'); DROP TABLE billguard.accounts; --$$, -5, 'E', '{}')$t$,
   '22023', 'expected_seq_nr must be >= 0')
) AS refusal(label, statement, sqlstate, message);

-- The table really is still there, and a SQL-injection-looking customer id is
-- just data: it can be an account and be billed like any other.
SELECT has_table('billguard', 'accounts', 'billguard.accounts still exists');
SELECT lives_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
                  VALUES ($i$x'); DROP TABLE billguard.accounts; --$i$, 'cus_t08inj', 100)$$,
                'an injection-looking customer id is a valid account id');
SELECT results_eq($$SELECT status, idempotency_key FROM billguard.bill_customer($i$x'); DROP TABLE billguard.accounts; --$i$, '2026-08')$$,
                  $$SELECT 'initiated'::text, billguard.idempotency_key($i$x'); DROP TABLE billguard.accounts; --$i$, '2026-08')$$,
                  'it is billed: initiated with its content-hash key');
SELECT is((SELECT count(*) FROM billguard.journal
            WHERE persistence_id = $i$billing-x'); DROP TABLE billguard.accounts; ---2026-08$i$), 1::bigint,
          'its BillingInitiated event is on billing-<id>-<period>');
SELECT has_table('billguard', 'accounts', 'billguard.accounts still exists after billing it');
SELECT results_eq($$SELECT status FROM billguard.bill_customer('t08_good', '2026-08')$$, ARRAY['initiated'],
                  'the good customer is billable after all the refusals');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id IN ('t08_good', $i$x'); DROP TABLE billguard.accounts; --$i$)),
          2::bigint, 'exactly the two valid billings were written');
SELECT is((SELECT count(*) FROM billguard.accounts WHERE customer_id LIKE 't08\_%%' OR customer_id LIKE 'x''%%'),
          3::bigint, 'exactly the three valid accounts exist');
SELECT is((SELECT amount_cents FROM billguard.accounts WHERE customer_id = 't08_good'), 1000::bigint,
          'the refused UPDATEs left t08_good''s amount unchanged');

SELECT * FROM finish();
ROLLBACK;
