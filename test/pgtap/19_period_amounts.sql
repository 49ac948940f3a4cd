-- 19_period_amounts.sql: what each customer owes for a period, billed once
-- and frozen by its claim; amounts Stripe would refuse are never sent.
--
-- Proves: bill_period claims an account's period amount (amount, currency,
-- description, metadata) when it has one, else its fixed amount, with its
-- Connect account and application fee, and passes over a usage-only
-- account without one; bill_customer does the same, says 22023 for a
-- usage-only account without an amount, and answers below_minimum; an
-- amount of zero or under Stripe's minimum for its currency (JPY 49, GBP 29,
-- USD 49; not USD 50, nor 1 in a currency without a known minimum) is
-- claimed below_minimum: counted by bill_period and period_status,
-- journaled BillingBelowMinimum, terminal, never in the dispatch queue; a
-- claimed period amount refuses UPDATE, DELETE, TRUNCATE and an INSERT
-- that says otherwise (23001, naming the key and status) and takes an
-- INSERT of what the record froze; a cancelled record's amount may change,
-- and reclaim_record claims it again with the new amount, journaled;
-- reclaim_record refuses a record not cancelled and one a dispatcher ever
-- claimed; cancel_record cancels a below_minimum record; the dispatcher's
-- claim stores a body with the description, the user's metadata after
-- billguard's keys (which win) and the application fee, and returns the
-- record's stripe_account; bad input (negative amount, unknown currency, a
-- KWD amount not a multiple of 10, a description over 1,000 characters, a
-- control character, a NUL, metadata Stripe would refuse, an acct_ of a bad
-- shape, a negative fee, a fee without a connected account) is refused with
-- 23xxx/22xxx and changes nothing; a connected account or fee does not
-- change while a record is in flight (23001); REPEATABLE READ writers and
-- claims are refused (25000).
BEGIN;
SELECT plan(79);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't19\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, stripe_account,
                                application_fee_cents) VALUES
  ('t19_fixed', 'cus_t19fixed', 4900, 'usd', NULL, NULL),
  ('t19_usage', 'cus_t19usage', NULL, 'usd', NULL, NULL),
  ('t19_idle', 'cus_t19idle', NULL, 'usd', NULL, NULL),
  ('t19_connect', 'cus_t19connect', 2500, 'eur', 'acct_1T19Connect', 150),
  ('t19_zero', 'cus_t19zero', NULL, 'usd', NULL, NULL),
  ('t19_yen', 'cus_t19yen', NULL, 'jpy', NULL, NULL),
  ('t19_pound', 'cus_t19pound', NULL, 'gbp', NULL, NULL),
  ('t19_cent', 'cus_t19cent', 49, 'usd', NULL, NULL),
  ('t19_fifty', 'cus_t19fifty', 50, 'usd', NULL, NULL),
  ('t19_krona', 'cus_t19krona', NULL, 'isk', NULL, NULL);
INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description, metadata) VALUES
  ('t19_usage', '2037-01', 12840, 'eur', 'January: 1,284 API calls', '{"plan": "usage", "billguard_key": "forged"}'),
  ('t19_connect', '2037-01', 3100, 'eur', NULL, '{}'),
  ('t19_zero', '2037-01', 0, 'usd', NULL, '{}'),
  ('t19_yen', '2037-01', 49, 'jpy', NULL, '{}'),
  ('t19_pound', '2037-01', 29, 'gbp', NULL, '{}'),
  ('t19_krona', '2037-01', 1, 'isk', NULL, '{}');

------------------------------------------------------------------------------
-- bill_period: the period amount, else the fixed one; below_minimum apart.
SELECT results_eq($$SELECT * FROM billguard.bill_period('2037-01')$$,
                  $$VALUES ('2037-01'::text, 5::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 4::bigint)$$,
                  'bill_period: 5 initiated, 4 below_minimum, the usage-only account without an amount passed over');
SELECT results_eq($$SELECT customer_id, status, amount_cents, currency, description, metadata,
                           stripe_account, application_fee_cents, next_attempt_at IS NULL
                      FROM billguard.billing_records WHERE billing_period = '2037-01' ORDER BY customer_id$$,
                  $$VALUES ('t19_cent'::text, 'below_minimum'::text, 49::bigint, 'usd'::text, NULL::text, NULL::jsonb, NULL::text, NULL::bigint, true),
                           ('t19_connect', 'pending', 3100, 'eur', NULL, '{}', 'acct_1T19Connect', 150, false),
                           ('t19_fifty', 'pending', 50, 'usd', NULL, NULL, NULL, NULL, false),
                           ('t19_fixed', 'pending', 4900, 'usd', NULL, NULL, NULL, NULL, false),
                           ('t19_krona', 'pending', 1, 'isk', NULL, '{}', NULL, NULL, false),
                           ('t19_pound', 'below_minimum', 29, 'gbp', NULL, '{}', NULL, NULL, true),
                           ('t19_usage', 'pending', 12840, 'eur', 'January: 1,284 API calls',
                            '{"plan": "usage", "billguard_key": "forged"}', NULL, NULL, false),
                           ('t19_yen', 'below_minimum', 49, 'jpy', NULL, '{}', NULL, NULL, true),
                           ('t19_zero', 'below_minimum', 0, 'usd', NULL, '{}', NULL, NULL, true)$$,
                  'each record froze its period amount or its fixed amount, its Connect account and fee; below_minimum ones are not queued');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't19_idle'), 0::bigint,
          'a usage-only account without a period amount has no record');
SELECT results_eq($$SELECT event_type FROM billguard.journal WHERE persistence_id = 'billing-t19_yen-2037-01' ORDER BY seq_nr$$,
                  ARRAY['BillingInitiated', 'BillingBelowMinimum'],
                  'a below_minimum record is journaled BillingInitiated then BillingBelowMinimum');
SELECT is((SELECT event FROM billguard.journal WHERE persistence_id = 'billing-t19_yen-2037-01' AND seq_nr = 2),
          '{"amount_cents": 49, "currency": "jpy", "min_charge_units": 50}'::jsonb,
          'BillingBelowMinimum says the amount and the minimum it is under');
SELECT is(billguard.entity_state('billing-t19_zero-2037-01') ->> 'status', 'below_minimum',
          'the entity folds to below_minimum');
SELECT ok(billguard.is_terminal_status('below_minimum'), 'below_minimum is terminal');
SELECT results_eq($$SELECT count, amount_cents, currency FROM billguard.period_status('2037-01') WHERE status = 'below_minimum'$$,
                  $$VALUES (1::bigint, 29::numeric, 'gbp'::text), (1, 49, 'jpy'), (2, 49, 'usd')$$,
                  'period_status: a below_minimum row per currency');
SELECT results_eq($$SELECT * FROM billguard.bill_period('2037-01')$$,
                  $$VALUES ('2037-01'::text, 0::bigint, 0::bigint, 5::bigint, 0::bigint, 0::bigint, 4::bigint)$$,
                  'bill_period again: nothing initiated, the below_minimum ones counted again');
SELECT results_eq($$SELECT status FROM billguard.bill_customer('t19_zero', '2037-01')$$, ARRAY['below_minimum'],
                  'bill_customer answers below_minimum for a record claimed so');
SELECT is(billguard.is_below_minimum(50, 'usd'), false, 'USD 50 cents is Stripe''s minimum, not under it');
SELECT is(billguard.is_below_minimum(29, 'gbp'), true, 'GBP 29 pence is under it');
SELECT is(billguard.is_below_minimum(1, 'kwd'), false, 'a currency without a known minimum: only zero is');

------------------------------------------------------------------------------
-- bill_customer: the same rules, one customer.
INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description) VALUES
  ('t19_usage', '2037-02', 700, 'usd', 'February'),
  ('t19_yen', '2037-02', 0, 'jpy', NULL);
SELECT results_eq($$SELECT status, idempotency_key FROM billguard.bill_customer('t19_usage', '2037-02')$$,
                  $$SELECT 'initiated'::text, billguard.idempotency_key('t19_usage', '2037-02')$$,
                  'bill_customer: a usage-only account with a period amount is initiated');
SELECT results_eq($$SELECT amount_cents, currency, description FROM billguard.billing_records
                     WHERE customer_id = 't19_usage' AND billing_period = '2037-02'$$,
                  $$VALUES (700::bigint, 'usd'::text, 'February'::text)$$,
                  'bill_customer froze the period amount');
SELECT results_eq($$SELECT status FROM billguard.bill_customer('t19_yen', '2037-02')$$, ARRAY['below_minimum'],
                  'bill_customer: a zero amount is claimed below_minimum');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t19_idle', '2037-02')$$, '22023',
                 'customer ''t19_idle'' has nothing to bill for 2037-02: its account is usage-only (amount_cents NULL) and billguard.period_amounts has no amount for the period',
                 'bill_customer: a usage-only account without a period amount is 22023, said plainly');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id = 't19_idle'), 0::bigint,
          'and nothing was claimed');

------------------------------------------------------------------------------
-- The freeze.
SELECT throws_ok($$UPDATE billguard.period_amounts SET amount_cents = 13000
                    WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$, '23001',
                 format('period amount of ''t19_usage'' for 2037-01 is frozen: billing record %s claimed it and is pending',
                        billguard.idempotency_key('t19_usage', '2037-01')),
                 'UPDATE of a claimed period amount is refused, naming the record''s key and status');
SELECT throws_ok($$DELETE FROM billguard.period_amounts WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                 '23001', NULL, 'DELETE of a claimed period amount is refused');
SELECT throws_ok($$UPDATE billguard.period_amounts SET metadata = '{"plan": "other"}'
                    WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                 '23001', NULL, 'a change of its metadata alone is refused too');
SELECT throws_ok($$UPDATE billguard.period_amounts SET billing_period = '2037-03'
                    WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                 '23001', NULL, 'moving it to another period is refused');
SELECT throws_ok($$UPDATE billguard.period_amounts SET amount_cents = 60
                    WHERE customer_id = 't19_zero' AND billing_period = '2037-01'$$,
                 '23001', NULL, 'a below_minimum record freezes its amount too');
SELECT throws_ok($$TRUNCATE billguard.period_amounts$$, '23001', NULL, 'TRUNCATE is refused');
SELECT throws_ok($$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency)
                   VALUES ('t19_fixed', '2037-01', 5000, 'usd')$$, '23001', NULL,
                 'an INSERT that says otherwise than a record claimed from the fixed amount is refused');
SELECT lives_ok($$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency)
                  VALUES ('t19_fixed', '2037-01', 4900, 'usd')$$,
                'an INSERT of what the record froze is taken (a restore loads such rows)');
SELECT lives_ok($$UPDATE billguard.period_amounts SET amount_cents = amount_cents
                   WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                'an UPDATE that changes nothing is taken');
SELECT lives_ok($$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency)
                  VALUES ('t19_fixed', '2037-05', 100, 'usd')$$,
                'a period not claimed yet takes any amount');
SELECT lives_ok($$UPDATE billguard.period_amounts SET amount_cents = 200 WHERE customer_id = 't19_fixed' AND billing_period = '2037-05'$$,
                'and changes to it');
SELECT is((SELECT amount_cents FROM billguard.period_amounts WHERE customer_id = 't19_usage' AND billing_period = '2037-01'),
          12840::bigint, 'the claimed period amount is unchanged');

------------------------------------------------------------------------------
-- The correction: cancel, change, claim again.
SELECT is(billguard.cancel_record('t19_usage', '2037-01'), 'cancelled', 'cancel_record of the never-sent record');
SELECT lives_ok($$UPDATE billguard.period_amounts SET amount_cents = 11900, description = 'January, corrected'
                   WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                'a cancelled record''s period amount may change');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t19_usage', '2037-01')$$,
                  $$SELECT 'cancelled'::text, billguard.idempotency_key('t19_usage', '2037-01'), NULL::text$$,
                  'bill_customer does not claim a cancelled record again');
SELECT is(billguard.reclaim_record('t19_usage', '2037-01'), 'pending', 'reclaim_record claims it again: pending');
SELECT results_eq($$SELECT status, amount_cents, description, idempotency_key, next_attempt_at IS NOT NULL
                      FROM billguard.billing_records WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                  $$SELECT 'pending'::text, 11900::bigint, 'January, corrected'::text,
                           billguard.idempotency_key('t19_usage', '2037-01'), true$$,
                  'the same record, the same key, the corrected amount, queued');
SELECT results_eq($$SELECT event_type, event ->> 'amount_cents', event ->> 'previous_amount_cents'
                      FROM billguard.journal WHERE persistence_id = 'billing-t19_usage-2037-01' ORDER BY seq_nr DESC LIMIT 1$$,
                  $$VALUES ('BillingReclaimed'::text, '11900'::text, '12840'::text)$$,
                  'journaled BillingReclaimed with the new and the old amount');
SELECT is(billguard.entity_state('billing-t19_usage-2037-01') -> 'amount_cents', '11900'::jsonb,
          'the entity folds to the corrected amount');
SELECT throws_ok($$UPDATE billguard.period_amounts SET amount_cents = 1 WHERE customer_id = 't19_usage' AND billing_period = '2037-01'$$,
                 '23001', NULL, 'frozen again once claimed again');
SELECT throws_ok($$SELECT billguard.reclaim_record('t19_fixed', '2037-01')$$, '22023',
                 'billing record t19_fixed/2037-01 is pending: only a cancelled record can be claimed again',
                 'reclaim_record refuses a record that is not cancelled');
SELECT throws_ok($$SELECT billguard.reclaim_record('t19_fixed', '2036-12')$$, 'P0002', NULL,
                 'reclaim_record of no record is P0002');
-- A cancelled record a dispatcher had claimed (a restored backup could hold one).
UPDATE billguard.billing_records SET status = 'cancelled', next_attempt_at = NULL, first_dispatched_at = now()
 WHERE customer_id = 't19_fifty' AND billing_period = '2037-01';
SELECT throws_ok($$SELECT billguard.reclaim_record('t19_fifty', '2037-01')$$, '22023', NULL,
                 'reclaim_record refuses a record a dispatcher ever claimed');
SELECT is(billguard.cancel_record('t19_pound', '2037-01'), 'cancelled', 'cancel_record cancels a below_minimum record');
UPDATE billguard.period_amounts SET amount_cents = 300 WHERE customer_id = 't19_pound' AND billing_period = '2037-01';
SELECT is(billguard.reclaim_record('t19_pound', '2037-01'), 'pending', 'and once its amount is raised, it is claimed again, pending');

------------------------------------------------------------------------------
-- The charge's body and the dispatcher's claim.
SELECT is(billguard.charge_request_body('/v1/payment_intents', 'k19', 'c19', '2037-01', 3100, 'eur', 'cus_1', NULL,
                                        'Seats & overage', '{"z": "last", "customer_id": "forged", "a": "ä"}', 150),
          'amount=3100&currency=eur&customer=cus_1&confirm=true&off_session=true'
          '&automatic_payment_methods%5Benabled%5D=true&automatic_payment_methods%5Ballow_redirects%5D=never'
          '&application_fee_amount=150&description=Seats+%26+overage'
          '&metadata%5Bbillguard_key%5D=k19&metadata%5Bbilling_period%5D=2037-01&metadata%5Bcustomer_id%5D=c19'
          '&metadata%5Ba%5D=%C3%A4&metadata%5Bz%5D=last',
          'charge_request_body: the fee, the description, billguard''s keys first and winning, the user''s after in key order');
SELECT is(billguard.charge_request_body('/v1/payment_intents', 'k19', 'c19', '2037-01', 3100, 'eur', 'cus_1', NULL),
          billguard.charge_request_body('/v1/payment_intents', 'k19', 'c19', '2037-01', 3100, 'eur', 'cus_1', NULL,
                                        NULL, NULL, NULL),
          'without them, the body of the eight arguments');
CREATE TEMP TABLE t19_claimed AS
  SELECT * FROM billguard.claim_due_records(100, '1 minute', '23 hours', '/v1/payment_intents');
SELECT results_eq($$SELECT customer_id, stripe_account FROM t19_claimed WHERE billing_period = '2037-01' ORDER BY customer_id$$,
                  $$VALUES ('t19_connect'::text, 'acct_1T19Connect'::text), ('t19_fixed', NULL), ('t19_krona', NULL),
                           ('t19_pound', NULL), ('t19_usage', NULL)$$,
                  'the dispatcher claims the pending records only, each with its stripe_account');
SELECT ok((SELECT request_body FROM t19_claimed WHERE customer_id = 't19_usage' AND billing_period = '2037-01')
            LIKE '%&description=January%2C+corrected&metadata%5Bbillguard_key%5D='
                 || billguard.idempotency_key('t19_usage', '2037-01')
                 || '&metadata%5Bbilling_period%5D=2037-01&metadata%5Bcustomer_id%5D=t19_usage&metadata%5Bplan%5D=usage',
          'the stored body carries the period amount''s description and metadata, the forged billguard_key left out');
SELECT ok((SELECT request_body FROM t19_claimed WHERE customer_id = 't19_connect') LIKE '%&application_fee_amount=150&%',
          'and the account''s application fee');
SELECT throws_ok($$UPDATE billguard.billing_records SET amount_cents = 1 WHERE customer_id = 't19_connect' AND billing_period = '2037-01'$$,
                 '23000', NULL, 'a record''s amount never changes once claimed');

------------------------------------------------------------------------------
-- Connect accounts do not change under a record in flight.
SELECT throws_ok($$UPDATE billguard.accounts SET stripe_account = 'acct_1Other' WHERE customer_id = 't19_connect'$$,
                 '23001', NULL, 'stripe_account of an account with a record in flight is refused');
SELECT throws_ok($$UPDATE billguard.accounts SET application_fee_cents = 10 WHERE customer_id = 't19_connect'$$,
                 '23001', NULL, 'so is its application fee');
SELECT lives_ok($$UPDATE billguard.accounts SET stripe_account = 'acct_1T19Idle' WHERE customer_id = 't19_idle'$$,
                'an account with no record in flight takes a connected account');

------------------------------------------------------------------------------
-- Bad input: a clear error, nothing changed.
CREATE TEMP TABLE t19_before AS
  SELECT (SELECT count(*) FROM billguard.period_amounts) AS amounts,
         (SELECT count(*) FROM billguard.accounts) AS accounts,
         (SELECT count(*) FROM billguard.billing_records) AS records;
SELECT throws_ok(statement, sqlstate, message, 'refused: ' || what) FROM (VALUES
  ('a negative amount', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES ('t19_idle', '2037-04', -1, 'usd')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_amount_valid"'),
  ('more than Stripe''s largest charge', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES ('t19_idle', '2037-04', 100000000, 'usd')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_amount_valid"'),
  ('an unknown currency', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES ('t19_idle', '2037-04', 100, 'xyz')$$,
   '23503', 'insert or update on table "period_amounts" violates foreign key constraint "period_amounts_currency_fkey"'),
  ('a KWD amount not a multiple of 10', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES ('t19_idle', '2037-04', 1005, 'kwd')$$,
   '23514', 'period amount of ''t19_idle'' for 2037-04: 1005 is in kwd, a three-decimal currency, so its last digit must be 0'),
  ('a description over 1,000 characters', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description) VALUES ('t19_idle', '2037-04', 100, 'usd', repeat('é', 1001))$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_description_valid"'),
  ('a description with a control character', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description) VALUES ('t19_idle', '2037-04', 100, 'usd', E'usage\x01')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_description_valid"'),
  ('a description over 1,000 characters with a NUL', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, description) VALUES ('t19_idle', '2037-04', 100, 'usd', repeat('x', 1000) || E'\x00')$$,
   '22021', 'invalid byte sequence for encoding "UTF8": 0x00'),
  ('metadata that is not an object', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata) VALUES ('t19_idle', '2037-04', 100, 'usd', '["a"]')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_metadata_valid"'),
  ('a metadata value that is not a string', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata) VALUES ('t19_idle', '2037-04', 100, 'usd', '{"seats": 3}')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_metadata_valid"'),
  ('a metadata key of 41 characters', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata) VALUES ('t19_idle', '2037-04', 100, 'usd', jsonb_build_object(repeat('k', 41), 'v'))$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_metadata_valid"'),
  ('a metadata key with a bracket', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata) VALUES ('t19_idle', '2037-04', 100, 'usd', '{"a[b]": "v"}')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_metadata_valid"'),
  ('a metadata value of 501 characters', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata) VALUES ('t19_idle', '2037-04', 100, 'usd', jsonb_build_object('k', repeat('v', 501)))$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_metadata_valid"'),
  ('48 metadata keys of its own', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata) SELECT 't19_idle', '2037-04', 100, 'usd', jsonb_object_agg('k' || g, 'v') FROM generate_series(1, 48) g$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_metadata_valid"'),
  ('a customer id with a leading blank', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES (' t19_idle', '2037-04', 100, 'usd')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_customer_id_valid"'),
  ('a bad period', $$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES ('t19_idle', '2037-13', 100, 'usd')$$,
   '23514', 'new row for relation "period_amounts" violates check constraint "period_amounts_period_valid"'),
  ('an acct_ of a bad shape', $$UPDATE billguard.accounts SET stripe_account = 'acct_ 1' WHERE customer_id = 't19_idle'$$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_stripe_account_valid"'),
  ('an account that is not acct_', $$UPDATE billguard.accounts SET stripe_account = 'cus_1' WHERE customer_id = 't19_idle'$$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_stripe_account_valid"'),
  ('a negative application fee', $$UPDATE billguard.accounts SET application_fee_cents = -1 WHERE customer_id = 't19_idle'$$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_application_fee_valid"'),
  ('a fee without a connected account', $$UPDATE billguard.accounts SET application_fee_cents = 10 WHERE customer_id = 't19_yen'$$,
   '23514', 'new row for relation "accounts" violates check constraint "accounts_application_fee_needs_account"')
) AS t (what, statement, sqlstate, message);
SELECT results_eq($$SELECT (SELECT count(*) FROM billguard.period_amounts), (SELECT count(*) FROM billguard.accounts),
                           (SELECT count(*) FROM billguard.billing_records)$$,
                  $$SELECT amounts, accounts, records FROM t19_before$$,
                  'bad input changed nothing');
SELECT is((SELECT stripe_account FROM billguard.accounts WHERE customer_id = 't19_idle'), 'acct_1T19Idle',
          'the refused updates left the account as it was');

-- A snapshot fixed before a claim could miss it: REPEATABLE READ writers
-- and claims are refused, in a second session (dblink).
CREATE EXTENSION IF NOT EXISTS dblink;
SELECT is(dblink_connect('t19_rr', format('host=%s port=%s dbname=%s user=%s',
            coalesce(nullif(split_part(current_setting('unix_socket_directories'), ',', 1), ''), '127.0.0.1'),
            current_setting('port'), current_database(), current_user)),
          'OK', 'a second session connects (dblink)');
SELECT is(dblink_exec('t19_rr', 'BEGIN ISOLATION LEVEL REPEATABLE READ'), 'BEGIN', 'it begins a REPEATABLE READ transaction');
SELECT throws_ok($$SELECT dblink_exec('t19_rr', 'SAVEPOINT s; INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency) VALUES (''t19_rr'', ''2037-04'', 100, ''usd'')')$$,
                 '25000', NULL, 'a REPEATABLE READ write of a period amount is refused (25000)');
SELECT is(dblink_exec('t19_rr', 'ROLLBACK TO SAVEPOINT s'), 'ROLLBACK', '(the second session goes on)');
SELECT throws_ok($$SELECT dblink_exec('t19_rr', 'SELECT * FROM billguard.bill_period(''2037-04'')')$$,
                 '25000', NULL, 'bill_period in REPEATABLE READ is refused (25000)');
SELECT is(dblink_exec('t19_rr', 'ROLLBACK'), 'ROLLBACK', 'the second session rolls back');
SELECT dblink_disconnect('t19_rr');

SELECT * FROM finish();
ROLLBACK;
