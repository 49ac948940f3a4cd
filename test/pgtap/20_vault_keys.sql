-- 20_vault_keys.sql: issuing vault keys, budgets shared by a period's keys,
-- caps raised only, revocation, and what pg_dump carries.
--
-- Proves: issue_vault_key returns a vk_test_/vk_live_ secret of 32 base62
-- characters once and stores only its SHA-256; a second key of the period
-- joins the budget (the cap is not doubled); another cap for an existing
-- budget is 23505 and changes nothing; bad input (fractions of a cent,
-- vendor, period, endpoints, expiry) is 22023 and changes nothing; every key
-- is journaled as VaultKeyIssued on billing-scheduler and audited;
-- raise_vault_cap only raises (audited), revoke_vault_key stamps once;
-- vault_key_status and vault_spend show the budget; the ledger's tables are
-- registered for pg_dump and vault_audit is append-only; the issuer
-- token's request (issuer_max_period_usd given) is 42501 for another vendor,
-- other endpoints or a new budget past the ceiling, and changes nothing,
-- while it joins an existing budget at its cap; its keys expire within 100
-- days and name periods at most a month from the current one (both 42501
-- beyond, the operator widens them), the admin's are not bounded.
BEGIN;
SELECT plan(52);

CREATE TEMP TABLE k AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2040-01', 54890.10, ARRAY['/v1/payment_intents', '/v1/charges'],
                                          now() + interval '40 days', false);
SELECT matches((SELECT vault_key FROM k), '^vk_test_[A-Za-z0-9]{32}$', 'a test-mode key is vk_test_ + 32 base62 characters');
SELECT matches((SELECT key_id FROM k), '^vkey_[A-Za-z0-9]{16}$', 'its public id is vkey_ + 16 base62 characters');
SELECT is((SELECT cap_usd FROM k), 54890.10, 'cap_usd is the cap asked, exactly');
SELECT is((SELECT vendor FROM k), 'stripe', 'vendor is answered');
SELECT matches((SELECT vault_key FROM billguard.issue_vault_key('stripe', '2040-01', 54890.1, ARRAY['/v1/charges'],
                                                              now() + interval '1 day')),
               '^vk_live_', 'a key issued without livemode is a live key');
SELECT is((SELECT cap_cents FROM billguard.vault_budgets WHERE billing_period = '2040-01'), 5489010::bigint,
          'the budget holds the cap in cents, converted exactly');
SELECT is((SELECT count(*) FROM billguard.vault_budgets WHERE billing_period = '2040-01'), 1::bigint,
          'two keys of one period share one budget');
SELECT is((SELECT secret_sha256 FROM billguard.vault_keys WHERE key_id = (SELECT key_id FROM k)),
          (SELECT sha256(convert_to(vault_key, 'UTF8')) FROM k), 'only the SHA-256 of the secret is stored');
SELECT is((SELECT count(*) FROM billguard.vault_keys v, k
            WHERE row_to_json(v)::text LIKE '%' || substr(k.vault_key, 9) || '%'), 0::bigint,
          'no column of vault_keys holds the secret');
SELECT is((SELECT count(*) FROM billguard.vault_audit a, k
            WHERE row_to_json(a)::text LIKE '%' || substr(k.vault_key, 9) || '%'), 0::bigint,
          'no column of vault_audit holds the secret');

-- A different cap for the period: 23505, nothing changes.
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-01', 109780.20, ARRAY['/v1/charges'], now() + interval '1 day')$$,
                 '23505', 'billing_period 2040-01 of stripe already has a cap of 54890.10 USD',
                 'a key asking another cap for an existing budget is refused (23505)');
SELECT is((SELECT cap_cents FROM billguard.vault_budgets WHERE billing_period = '2040-01'), 5489010::bigint,
          '... and the cap is unchanged');
SELECT is((SELECT count(*) FROM billguard.vault_keys WHERE billing_period = '2040-01'), 2::bigint,
          '... and no key was added');

-- Bad input: 22023, nothing written.
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-02', 10.005, ARRAY['/v1/charges'], now() + interval '1 day')$$,
                 '22023', NULL, 'a fraction of a cent is refused (22023)');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-02', 0, ARRAY['/v1/charges'], now() + interval '1 day')$$,
                 '22023', NULL, 'a zero cap is refused');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-02', -5, ARRAY['/v1/charges'], now() + interval '1 day')$$,
                 '22023', NULL, 'a negative cap is refused');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('Stripe Inc', '2040-02', 5, ARRAY['/v1/charges'], now() + interval '1 day')$$,
                 '22023', NULL, 'a vendor that is not a lower-case word is refused');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-13', 5, ARRAY['/v1/charges'], now() + interval '1 day')$$,
                 '22023', NULL, 'a period that is not YYYY-MM is refused');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-02', 5, ARRAY['/v1/../customers'], now() + interval '1 day')$$,
                 '22023', NULL, 'an endpoint that is not a plain API path is refused');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-02', 5, '{}', now() + interval '1 day')$$,
                 '22023', NULL, 'an empty endpoint list is refused');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-02', 5, ARRAY['/v1/charges'], now() - interval '1 second')$$,
                 '22023', NULL, 'an expiry in the past is refused');
SELECT is((SELECT count(*) FROM billguard.vault_budgets WHERE billing_period = '2040-02'), 0::bigint,
          'the refused keys created no budget');

-- Journal and audit.
SELECT is((SELECT count(*) FROM billguard.journal
            WHERE persistence_id = 'billing-scheduler' AND event_type = 'VaultKeyIssued'
              AND event ->> 'billing_period' = '2040-01'), 2::bigint,
          'each issued key is journaled as VaultKeyIssued on billing-scheduler');
SELECT is((SELECT event FROM billguard.journal WHERE event ->> 'key_id' = (SELECT key_id FROM k)),
          jsonb_build_object('billing_period', '2040-01', 'key_id', (SELECT key_id FROM k), 'cap_usd', 54890.10,
                             'vendor', 'stripe'),
          'VaultKeyIssued carries billing_period, key_id, cap_usd and vendor');
SELECT is((SELECT count(*) FROM billguard.vault_audit WHERE billing_period = '2040-01' AND decision = 'issued'),
          2::bigint, 'each issued key is audited');

-- Raising and revoking.
SELECT throws_ok(format('SELECT billguard.raise_vault_cap(%L, 100)', (SELECT key_id FROM k)), '22023', NULL,
                 'a cap is never lowered (22023)');
SELECT is(billguard.raise_vault_cap((SELECT key_id FROM k), 60000), 60000.00, 'raise_vault_cap raises the budget''s cap');
SELECT results_eq(format('SELECT cap_cents, settled_cents, reserved_cents, remaining_cents, revoked_at IS NULL
                            FROM billguard.vault_key_status(%L)', (SELECT key_id FROM k)),
                  $$VALUES (6000000::bigint, 0::bigint, 0::bigint, 6000000::bigint, true)$$,
                  'vault_key_status shows the raised cap and the budget''s sums');
SELECT is((SELECT reason FROM billguard.vault_audit WHERE decision = 'cap_raised' AND billing_period = '2040-01'),
          'cap raised from 54890.10 to 60000.00 USD', 'the raise is audited with both caps');
SELECT ok(billguard.revoke_vault_key((SELECT key_id FROM k)) = billguard.revoke_vault_key((SELECT key_id FROM k)),
          'revoking twice keeps the first revocation time');
SELECT throws_ok($$SELECT billguard.revoke_vault_key('vkey_doesNotExist0000')$$, 'P0002', NULL,
                 'revoking an unknown key is P0002');
SELECT results_eq($$SELECT cap_cents, remaining_cents, usable_keys FROM billguard.vault_spend WHERE billing_period = '2040-01'$$,
                  $$VALUES (6000000::bigint, 6000000::bigint, 1::bigint)$$,
                  'vault_spend shows spend against cap per budget and the keys still usable');

-- What pg_dump carries, and the audit trail is append-only.
SELECT is((SELECT array_agg(c::regclass::text ORDER BY c::regclass::text) FROM pg_extension e, unnest(e.extconfig) c
            WHERE e.extname = 'billguard' AND c::regclass::text LIKE 'billguard.vault%'),
          ARRAY['billguard.vault_audit', 'billguard.vault_budgets', 'billguard.vault_keys',
                'billguard.vault_reservations'],
          'the ledger''s tables are registered with pg_extension_config_dump');
SELECT throws_ok($$DELETE FROM billguard.vault_audit$$, '42501', 'billguard.vault_audit is append-only: DELETE refused',
                 'vault_audit refuses DELETE, even to its owner');

-- The issuer token's request: the dispatcher's key only.
CREATE TEMP TABLE issuer_rows AS
  SELECT (SELECT count(*) FROM billguard.vault_budgets) budgets, (SELECT count(*) FROM billguard.vault_keys) keys;
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe_b', '2040-05', 10, ARRAY['/v1/charges'], now() + interval '1 day', true, 100)$$,
                 '42501', 'the issuer token may ask for vendor stripe only, not ''stripe_b''', 'issuer: another vendor is 42501');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-05', 10, ARRAY['/v1/charges', '/v1/payouts'], now() + interval '1 day', true, 100)$$,
                 '42501', 'the issuer token may ask for /v1/payment_intents, /v1/charges and their /search only, not /v1/charges, /v1/payouts',
                 'issuer: endpoints beyond the charge endpoints are 42501');
SELECT throws_ok($$SELECT * FROM billguard.issue_vault_key('stripe', '2040-05', 100.01, ARRAY['/v1/charges'], now() + interval '1 day', true, 100)$$,
                 '42501', 'the issuer token may create a budget of at most 100.00 USD (--issuer-max-period-usd), not 100.01 USD for billing_period 2040-05',
                 'issuer: a new budget past the ceiling is 42501');
SELECT is((SELECT count(*) FROM billguard.vault_budgets) || '/' || (SELECT count(*) FROM billguard.vault_keys),
          (SELECT budgets || '/' || keys FROM issuer_rows), '... and none changed anything');
SELECT is((SELECT cap_usd FROM billguard.issue_vault_key('stripe', '2040-01',
                                                         (SELECT b.cap_cents / 100.0 FROM billguard.vault_budgets b
                                                           WHERE (b.vendor, b.billing_period) = ('stripe', '2040-01')),
                                                         ARRAY['/v1/payment_intents', '/v1/payment_intents/search'],
                                                         now() + interval '1 day', true, 100, NULL, 1200)),
          (SELECT round(b.cap_cents / 100.0, 2) FROM billguard.vault_budgets b
            WHERE (b.vendor, b.billing_period) = ('stripe', '2040-01') AND b.cap_cents > 10000),
          'issuer: an existing budget past the ceiling is joined at its cap');
SELECT is((SELECT cap_usd FROM billguard.issue_vault_key('stripe_b', '2040-05', 100000, ARRAY['/v1/payouts'], now() + interval '1 day')),
          100000.00, 'the admin (no ceiling) is not bounded');

-- The issuer's keys: a bounded life, and periods near the current one.
CREATE TEMP TABLE months AS
  SELECT to_char(now() AT TIME ZONE 'UTC' + m * interval '1 month', 'YYYY-MM') AS period, m
    FROM generate_series(-3, 3) m;
CREATE FUNCTION pg_temp.issuer_key(period_offset integer, expires_at timestamptz,
                                   max_days integer DEFAULT NULL, max_months integer DEFAULT NULL)
  RETURNS text LANGUAGE sql AS $$
  SELECT key_id FROM billguard.issue_vault_key('stripe', (SELECT period FROM months WHERE m = period_offset), 10,
                                               ARRAY['/v1/payment_intents'], expires_at, true, 100,
                                               max_days, max_months)
$$;
CREATE TEMP TABLE issuer_rows_2 AS
  SELECT (SELECT count(*) FROM billguard.vault_budgets) budgets, (SELECT count(*) FROM billguard.vault_keys) keys;
SELECT throws_ok($$SELECT pg_temp.issuer_key(0, 'infinity')$$, '42501',
                 'the issuer token may ask for a key that expires within 100 days (--issuer-max-key-days), not at infinity',
                 'issuer: a key that never expires is 42501');
SELECT throws_ok($$SELECT pg_temp.issuer_key(0, now() + interval '101 days')$$, '42501', NULL,
                 'issuer: a key living 101 days is 42501 (the default is 100)');
SELECT throws_ok(format($$SELECT pg_temp.issuer_key(2, now() + interval '1 day')$$), '42501',
                 format('the issuer token may ask for billing periods within 1 month(s) of the current one (%s, --issuer-period-months), not %s',
                        (SELECT period FROM months WHERE m = 0), (SELECT period FROM months WHERE m = 2)),
                 'issuer: a period two months ahead is 42501');
SELECT throws_ok($$SELECT pg_temp.issuer_key(-2, now() + interval '1 day')$$, '42501', NULL,
                 'issuer: a period two months back is 42501');
SELECT is((SELECT count(*) FROM billguard.vault_budgets) || '/' || (SELECT count(*) FROM billguard.vault_keys),
          (SELECT budgets || '/' || keys FROM issuer_rows_2), '... and none changed anything');
SELECT matches(pg_temp.issuer_key(-1, now() + interval '100 days'), '^vkey_',
               'issuer: the previous period, a key of 100 days');
SELECT matches(pg_temp.issuer_key(0, now() + interval '66 days'), '^vkey_', 'issuer: the current period');
SELECT matches(pg_temp.issuer_key(1, now() + interval '97 days'), '^vkey_',
               'issuer: the next period, expiring 35 days after its end (the dispatcher''s request)');
SELECT matches(pg_temp.issuer_key(3, now() + interval '1000 days', 1000, 3), '^vkey_',
               'issuer: the operator widens both');
SELECT matches((SELECT key_id FROM billguard.issue_vault_key('stripe', (SELECT period FROM months WHERE m = -2), 10,
                                                            ARRAY['/v1/payment_intents'], now() + interval '1 day')),
               '^vkey_', 'the admin opens the budget of two months back');
SELECT throws_ok($$SELECT pg_temp.issuer_key(-2, now() + interval '1 day')$$, '42501', NULL,
                 'issuer: joining a far period''s budget is 42501 too (its room left is not the issuer''s)');
SELECT matches((SELECT key_id FROM billguard.issue_vault_key('stripe', '2040-07', 10, ARRAY['/v1/payment_intents'], 'infinity')),
               '^vkey_', 'the admin is not bounded: any period, a key that never expires');

SELECT * FROM finish();
ROLLBACK;
