-- 13_accounts.sql: what billguard.accounts accepts, and what it never lets
-- change once an account is billed.
--
-- Proves: look-alike customer ids are refused with 23514 naming
-- accounts_customer_id_valid: a blank or invisible first or last character
-- (White_Space, format characters such as zero-width, bidi and tag
-- characters, fillers, variation selectors) and text that is not NFC, on
-- INSERT and UPDATE, and bill_customer of such an id is 23503, so one
-- Stripe customer is billed once a period; an account with billing
-- records keeps its customer_id, is never deleted and never truncated away
-- (23001), an unbilled one may be renamed or deleted, and the
-- accounts-maintainer grants of docs/privileges.md get 23001, not a permission error;
-- updated_at follows every change and only changes; amount_cents
-- above Stripe's 99,999,999 is refused (23514), and period_status sums
-- amounts above bigint in numeric, without "bigint out of range".
BEGIN;
SELECT plan(54);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't13\_%';
CREATE FUNCTION pg_temp.t13_counts() RETURNS text LANGUAGE sql AS $$
  SELECT format('accounts=%s records=%s journal=%s',
                (SELECT count(*) FROM billguard.accounts), (SELECT count(*) FROM billguard.billing_records),
                (SELECT count(*) FROM billguard.journal))
$$;

------------------------------------------------------------------------------
-- Look-alike customer ids: two ids a reader cannot tell apart would bill
-- one Stripe customer twice.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t13_c1', 'cus_t13c1', 1000);
SELECT pg_temp.t13_counts() AS baseline \gset
CREATE TEMP TABLE t13_lookalike (label text, id text);
INSERT INTO t13_lookalike VALUES
  ('a trailing U+00A0 no-break space', E't13_c1\u00A0'),
  ('a trailing U+2003 em space', E't13_c1\u2003'),
  ('a leading U+3000 ideographic space', E'\u3000t13_c1'),
  ('a trailing U+200B zero width space', E't13_c1\u200B'),
  ('a leading U+FEFF byte order mark', E'\uFEFFt13_c1'),
  ('a trailing U+00AD soft hyphen', E't13_c1\u00AD'),
  ('a trailing U+180E Mongolian vowel separator', E't13_c1\u180E'),
  ('a trailing U+2060 word joiner', E't13_c1\u2060'),
  ('a leading U+202E right-to-left override', E'\u202Et13_c1'),
  ('a trailing U+2066 left-to-right isolate', E't13_c1\u2066'),
  ('a trailing U+E0041 tag character', E't13_c1\U000E0041'),
  ('a leading U+115F Hangul choseong filler', E'\u115Ft13_c1'),
  ('a trailing U+3164 Hangul filler', E't13_c1\u3164'),
  ('a trailing U+FFA0 halfwidth Hangul filler', E't13_c1\uFFA0'),
  ('a trailing U+034F combining grapheme joiner', E't13_c1\u034F'),
  ('a trailing U+FE0F variation selector', E't13_c1\uFE0F'),
  ('a trailing U+0085 next line', E't13_c1\u0085'),
  ('a trailing ASCII space', 't13_c1 '),
  ('text that is not NFC (e + U+0301)', E't13_cafe\u0301'),
  ('text that is not NFC (U+212B angstrom sign)', E't13_\u212B');

SELECT throws_ok(format('INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES (%L, %L, 1000)',
                        id, 'cus_t13c1'),
                 '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"',
                 'an id with ' || label || ' is refused')
  FROM t13_lookalike ORDER BY label;
SELECT is(pg_temp.t13_counts(), :'baseline'::text, 'the refused look-alikes wrote nothing');
SELECT is((SELECT count(*) FROM t13_lookalike WHERE billguard.is_valid_customer_id(id)), 0::bigint,
          'is_valid_customer_id is false for every look-alike');
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES ('t13_spare', 'cus_t13spare', 1000);
SELECT throws_ok($$UPDATE billguard.accounts SET customer_id = E't13_spare\u00A0' WHERE customer_id = 't13_spare'$$,
                 '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"',
                 'an UPDATE to a look-alike id is refused');
SELECT lives_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES
                    (E't13_caf\u00E9', 'cus_t13cafe', 1000), ('t13_日本_42', 'cus_t13jp', 1000),
                    ('t13 with spaces inside', 'cus_t13sp', 1000), (E't13\u00A0inside', 'cus_t13nbsp', 1000)$$,
                'NFC letters, and blanks inside an id, are accepted');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer(E't13_c1\u00A0', '2035-01')$$, '23503', NULL,
                 'bill_customer of a look-alike id finds no account (23503)');
SELECT results_eq($$SELECT initiated FROM billguard.bill_period('2035-01')$$, ARRAY[6::bigint],
                  'bill_period claims the six accounts, no look-alike among them');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE stripe_customer = 'cus_t13c1'), 1::bigint,
          'Stripe customer cus_t13c1 is billed once for the period');

------------------------------------------------------------------------------
-- A billed account keeps its id: a renamed one would be billed again.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents) VALUES
  ('t13_billed', 'cus_t13billed', 1000), ('t13_unbilled', 'cus_t13unbilled', 1000);
UPDATE billguard.accounts SET active = false WHERE customer_id = 't13_unbilled';
SELECT results_eq($$SELECT status FROM billguard.bill_customer('t13_billed', '2035-02')$$, ARRAY['initiated'],
                  't13_billed is billed for 2035-02');
SELECT pg_temp.t13_counts() AS baseline \gset
SELECT throws_ok($$UPDATE billguard.accounts SET customer_id = 't13_renamed' WHERE customer_id = 't13_billed'$$,
                 '23001', 'account ''t13_billed'' has billing records: its customer_id never changes',
                 'renaming a billed account is refused (restrict_violation)');
SELECT throws_ok($$DELETE FROM billguard.accounts WHERE customer_id = 't13_billed'$$,
                 '23001', 'account ''t13_billed'' has billing records: it is never deleted',
                 'deleting a billed account is refused (restrict_violation)');
SELECT throws_ok($$TRUNCATE billguard.accounts$$, '23001', NULL,
                 'truncating accounts that have billing records is refused (restrict_violation)');
SELECT throws_like($$TRUNCATE billguard.accounts$$, 'billguard.accounts cannot be truncated: % accounts have billing records',
                   'the TRUNCATE refusal says why');
SELECT is(pg_temp.t13_counts(), :'baseline'::text, 'the refused changes changed nothing');
SELECT is((SELECT count(*) FROM billguard.accounts WHERE customer_id = 't13_billed'), 1::bigint,
          't13_billed is still there under its id');
SELECT lives_ok($$UPDATE billguard.accounts SET customer_id = customer_id, amount_cents = 1100
                   WHERE customer_id = 't13_billed'$$,
                'other columns of a billed account may change (customer_id set to itself)');
SELECT lives_ok($$UPDATE billguard.accounts SET customer_id = 't13_unbilled_2' WHERE customer_id = 't13_unbilled'$$,
                'an account without billing records may be renamed');
SELECT lives_ok($$DELETE FROM billguard.accounts WHERE customer_id = 't13_unbilled_2'$$,
                'an account without billing records may be deleted');
SELECT results_eq($$SELECT initiated, in_progress FROM billguard.bill_period('2035-02')$$,
                  $$VALUES (6::bigint, 1::bigint)$$,
                  'bill_period of 2035-02 claims the other six once; t13_billed stays one record');

-- The grants of docs/privileges.md for whoever maintains accounts.
CREATE ROLE t13_maintainer NOLOGIN;
GRANT USAGE ON SCHEMA billguard TO t13_maintainer;
GRANT SELECT, INSERT, UPDATE ON billguard.accounts TO t13_maintainer;
GRANT EXECUTE ON FUNCTION billguard.is_valid_customer_id(text) TO t13_maintainer;
SET LOCAL ROLE t13_maintainer;
SELECT lives_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
                  VALUES ('t13_by_maintainer', 'cus_t13m', 1000)$$,
                'the maintainer adds an account');
SELECT throws_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
                   VALUES (E't13_by_maintainer\u2003', 'cus_t13m', 1000)$$,
                 '23514', 'new row for relation "accounts" violates check constraint "accounts_customer_id_valid"',
                 'the maintainer''s look-alike id is refused by the rule');
SELECT throws_ok($$UPDATE billguard.accounts SET customer_id = 't13_renamed' WHERE customer_id = 't13_billed'$$,
                 '23001', 'account ''t13_billed'' has billing records: its customer_id never changes',
                 'the maintainer''s rename of a billed account is refused by the rule, not by a missing privilege');
SELECT lives_ok($$UPDATE billguard.accounts SET customer_id = 't13_by_maintainer_2' WHERE customer_id = 't13_by_maintainer'$$,
                'the maintainer renames an unbilled account');
SELECT lives_ok($$UPDATE billguard.accounts SET active = false WHERE customer_id = 't13_billed'$$,
                'the maintainer deactivates a billed account');
RESET ROLE;
SELECT is((SELECT status FROM billguard.billing_records WHERE customer_id = 't13_billed' AND billing_period = '2035-02'),
          'cancelled', 'the maintainer''s deactivation cancelled the never-sent record');

------------------------------------------------------------------------------
-- updated_at: it says when the account last changed, and nothing else.
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, created_at, updated_at)
VALUES ('t13_touched', 'cus_t13touched', 1000, now() - interval '2 days', now() - interval '2 days');
UPDATE billguard.accounts SET active = active WHERE customer_id = 't13_touched';
SELECT is((SELECT updated_at FROM billguard.accounts WHERE customer_id = 't13_touched'), now() - interval '2 days',
          'an UPDATE that changes nothing leaves updated_at');
UPDATE billguard.accounts SET amount_cents = 1200 WHERE customer_id = 't13_touched';
SELECT is((SELECT updated_at FROM billguard.accounts WHERE customer_id = 't13_touched'), now(),
          'an UPDATE that changes the account sets updated_at to now()');
SELECT is((SELECT created_at FROM billguard.accounts WHERE customer_id = 't13_touched'), now() - interval '2 days',
          'created_at stays');

------------------------------------------------------------------------------
-- Stripe's largest charge, and sums that overflow bigint.
SELECT lives_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
                  VALUES ('t13_max', 'cus_t13max', 99999999)$$,
                'amount_cents 99,999,999 (Stripe''s largest charge) is accepted');
SELECT throws_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
                   VALUES ('t13_over', 'cus_t13over', 100000000)$$,
                 '23514', 'new row for relation "accounts" violates check constraint "accounts_amount_within_stripe_max"',
                 'amount_cents 100,000,000 is refused');
SELECT throws_ok($$UPDATE billguard.accounts SET amount_cents = 9223372036854775000 WHERE customer_id = 't13_max'$$,
                 '23514', 'new row for relation "accounts" violates check constraint "accounts_amount_within_stripe_max"',
                 'an UPDATE to 9,223,372,036,854,775,000 is refused');
SELECT is((SELECT amount_cents FROM billguard.accounts WHERE customer_id = 't13_max'), 99999999::bigint,
          'the refused UPDATE changed nothing');
-- Records claimed before the cap (as a 0.1.0 history may hold) are history
-- and keep their amounts; their sum must still be reported.
INSERT INTO billguard.billing_records (customer_id, billing_period, idempotency_key, status, charge_id,
                                       amount_cents, currency, stripe_customer)
SELECT c, '2035-03', billguard.idempotency_key(c, '2035-03'), 'completed', 'ch_' || c, 9223372036854775000,
       'usd', 'cus_' || c
  FROM unnest(ARRAY['t13_huge_a', 't13_huge_b']) AS c;
SELECT results_eq($$SELECT status, count, amount_cents FROM billguard.period_status('2035-03')
                     WHERE status = 'completed'$$,
                  $$VALUES ('completed'::text, 2::bigint, 18446744073709550000::numeric)$$,
                  'period_status sums 2 x 9,223,372,036,854,775,000 in numeric');
SELECT is((SELECT sum(count) FROM billguard.period_status('2035-03')), 2::numeric,
          'period_status answers for the whole period');
SELECT results_eq($$SELECT already_completed FROM billguard.bill_period('2035-03')$$, ARRAY[2::bigint],
                  'bill_period of that period counts the two completed records');

SELECT * FROM finish();
ROLLBACK;
