-- 22_vault_currencies.sql: budgets in any currency and on connected
-- accounts, in SQL.
--
-- Proves: issue_vault_key's 0.2.0 call still makes a USD budget; with
-- currency and period_cap it makes one in that currency, exact in its minor
-- units (JPY none, KWD three), cap_usd NULL but for USD; one cap only, and
-- period_usd_cap only for USD; a cap finer than the currency's unit, an
-- unknown currency or a connected account id of a bad shape is 22023 and
-- changes nothing; the issuer's request in a currency without a ceiling is
-- 42501 and makes no budget, its ceiling in the currency is the one
-- applied; a second key's accounts join the budget's, sorted, never its
-- cap; vault_authorize refuses a Stripe-Account the budget does not name
-- (403, audited with the account) and keeps one reservation per account
-- for one Idempotency-Key; vault_settle and vault_reconcile find each by
-- its account; raise_vault_cap raises in the budget's currency;
-- to_minor_units and minor_units_text convert exactly.
BEGIN;
SELECT plan(30);

SELECT is(billguard.to_minor_units(1.25, 'kwd', 'cap'), 1250::bigint, '1.25 KWD is 1250 fils');
SELECT is(billguard.to_minor_units(5000, 'jpy', 'cap'), 5000::bigint, '5000 JPY is 5000 yen');
SELECT throws_ok($$SELECT billguard.to_minor_units(0.5, 'jpy', 'cap')$$, '22023',
                 'cap must be a positive amount of whole JPY (0 decimals) up to 1000000000000000 JPY, got 0.5',
                 'half a yen is 22023, saying why');
SELECT throws_ok($$SELECT billguard.to_minor_units(1, 'xyz', 'cap')$$, '22023', NULL, 'an unknown currency is 22023');
SELECT is(billguard.minor_units_text(1250, 'kwd') || ' ' || billguard.minor_units_text(5000, 'jpy') || ' '
          || billguard.minor_units_text(5500, 'usd'), '1.250 KWD 5000 JPY 55.00 USD', 'amounts as people read them');

CREATE TEMP TABLE usd AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2043-01', 10, ARRAY['/v1/payment_intents'], now() + interval '1 day', false);
SELECT is((SELECT currency || ' ' || cap_usd || ' ' || cap_cents FROM usd), 'usd 10.00 1000',
          'the 0.2.0 call makes a USD budget');

CREATE TEMP TABLE jpy AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2043-01', NULL, ARRAY['/v1/payment_intents'], now() + interval '1 day',
                                          false, currency => 'jpy', period_cap => 5000);
SELECT is((SELECT currency || ' ' || cap || ' ' || cap_cents || ' ' || coalesce(cap_usd::text, 'no cap_usd') FROM jpy),
          'jpy 5000 5000 no cap_usd', 'a JPY budget of 5000 yen');
CREATE TEMP TABLE kwd AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2043-01', NULL, ARRAY['/v1/payment_intents'], now() + interval '1 day',
                                          false, currency => 'kwd', period_cap => 1.25,
                                          stripe_accounts => ARRAY['acct_Z9', 'acct_A1', 'acct_Z9']);
SELECT is((SELECT cap || ' ' || cap_cents || ' ' || array_to_string(stripe_accounts, ',') FROM kwd),
          '1.250 1250 acct_A1,acct_Z9', 'a KWD budget of 1.250 dinars on two connected accounts, named once each, sorted');
SELECT is((SELECT string_agg(currency || '=' || cap_cents, ' ' ORDER BY currency) FROM billguard.vault_budgets
            WHERE billing_period = '2043-01'), 'jpy=5000 kwd=1250 usd=1000', 'three budgets of one period, one per currency');

SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', 10, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, currency => 'eur')$$, '22023',
                 'period_usd_cap is a cap in USD: a budget in EUR takes period_cap', 'period_usd_cap for EUR is 22023');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', 10, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, period_cap => 10)$$, '22023',
                 'a key asks for one cap: period_usd_cap (USD) or period_cap (in its currency), got both', 'two caps are 22023');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', NULL, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, currency => 'kwd', period_cap => 1.2505)$$, '22023', NULL,
                 'a tenth of a fils is 22023');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', NULL, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, currency => 'xyz', period_cap => 1)$$, '22023', NULL,
                 'an unknown currency is 22023');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', 10, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, stripe_accounts => ARRAY['acct_x-y'])$$, '22023', NULL,
                 'a connected account id of a bad shape is 22023');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', NULL, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, issuer_max_period_usd => 1000, currency => 'gbp', period_cap => 1)$$,
                 '42501', 'the issuer token may create no budget in GBP (the proxy has no ceiling for it: --issuer-max-period AMOUNT:gbp)',
                 'the issuer in a currency without a ceiling is 42501');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2043-02', NULL, ARRAY['/v1/payment_intents'],
                   now() + interval '1 day', false, issuer_max_key_days => 100, currency => 'eur', period_cap => 100.01,
                   issuer_max_period => 100)$$,
                 '42501', NULL, 'the issuer past its EUR ceiling is 42501');
SELECT is((SELECT count(*) FROM billguard.vault_budgets WHERE billing_period = '2043-02'), 0::bigint,
          'none of those made a budget');

CREATE TEMP TABLE kwd2 AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2043-01', NULL, ARRAY['/v1/payment_intents'], now() + interval '1 day',
                                          false, currency => 'kwd', period_cap => 1.25, stripe_accounts => ARRAY['acct_M5']);
SELECT is((SELECT array_to_string(stripe_accounts, ',') FROM kwd2), 'acct_A1,acct_M5,acct_Z9',
          'a second key''s accounts join the budget''s');
SELECT is((SELECT cap_cents FROM billguard.vault_budgets WHERE (billing_period, currency) = ('2043-01', 'kwd')), 1250::bigint,
          '... never its cap');

CREATE FUNCTION pg_temp.authorize(secret text, idem text, amount bigint, currency text, account text)
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, attempt integer) LANGUAGE sql AS $$
  SELECT a.decision, a.http_status, a.body, a.key_id, a.attempt
    FROM billguard.vault_authorize(sha256(convert_to(secret, 'UTF8')), 'POST', '/v1/payment_intents', idem,
                                   repeat('a', 64), amount, currency, 'cus_1', 'bk_' || idem, '23 hours', account) a $$;
SELECT is((SELECT decision || ' ' || http_status || ' ' || (body::jsonb #>> '{error,code}')
             FROM pg_temp.authorize((SELECT vault_key FROM kwd), 'k1', 100, 'kwd', 'acct_B2')),
          'refused 403 stripe_account_not_allowed', 'an account the budget does not name is 403');
SELECT is((SELECT stripe_account || ' ' || reason FROM billguard.vault_audit WHERE idempotency_key = 'k1'),
          'acct_B2 vault key ' || (SELECT key_id FROM kwd)
          || ' may act on the platform''s account and acct_A1, acct_M5, acct_Z9 only, not on acct_B2 (Stripe-Account)',
          '... audited with the account');
SELECT is((SELECT decision FROM pg_temp.authorize((SELECT vault_key FROM kwd), 'k2', 500, 'kwd', 'acct_A1')), 'reserved',
          'an account the budget names is reserved');
SELECT is((SELECT decision FROM pg_temp.authorize((SELECT vault_key FROM kwd), 'k2', 500, 'kwd', NULL)), 'reserved',
          'the same Idempotency-Key on the platform is another request');
SELECT is((SELECT decision FROM pg_temp.authorize((SELECT vault_key FROM kwd), 'k2', 500, 'kwd', 'acct_A1')), 'reused',
          '... and again on acct_A1 its own reservation');
SELECT is(billguard.vault_settle((SELECT key_id FROM kwd), 'k2', 200, NULL, 'pi_on_a1', '{"id": "pi_on_a1"}', 'req_1', 2,
                                 'acct_A1'), 'settled', 'vault_settle finds the reservation of acct_A1');
SELECT is(billguard.vault_settle((SELECT key_id FROM kwd), 'k2', 402, 'card_error', NULL, '{}', 'req_2', 1), 'released',
          '... and, without an account, the platform''s');
SELECT is((SELECT string_agg(coalesce(nullif(stripe_account, ''), 'platform') || '=' || status, ' ' ORDER BY stripe_account)
             FROM billguard.vault_reservations WHERE idempotency_key = 'k2'), 'platform=released acct_A1=settled',
          'one reservation per account');
SELECT is((SELECT committed_cents FROM billguard.vault_budgets WHERE (billing_period, currency) = ('2043-01', 'kwd')), 500::bigint,
          'the budget counts the settled one only');
SELECT is((SELECT decision || ' ' || http_status || ' ' || (body::jsonb #>> '{error,message}')
             FROM pg_temp.authorize((SELECT vault_key FROM kwd), 'k3', 751, 'kwd', NULL)),
          'refused 429 spend cap exceeded for billing_period 2043-01 in KWD', 'past the cap, to the fils: 429 naming KWD');
SELECT is(billguard.raise_vault_cap((SELECT key_id FROM kwd), 2.5), 2.500, 'raise_vault_cap raises in dinars');

SELECT * FROM finish();
ROLLBACK;
