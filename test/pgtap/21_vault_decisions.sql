-- 21_vault_decisions.sql: vault_authorize and vault_settle, the proxy's
-- decisions (issue 8).
--
-- Proves: unknown, revoked and expired keys are 401; another endpoint or
-- method and another currency are 403; reads are forwarded uncounted; a
-- charge without Idempotency-Key or currency is 400; a charge is reserved
-- up to exactly the cap and the next cent is 429 "spend cap exceeded for
-- billing_period <period>"; the same key reuses its reservation (counted
-- once), through another key of the budget too, and with other parameters is
-- idempotency_error; a settled success is replayed with its status, body and
-- Request-Id; 402 and invalid_request_error release, 500 and no answer keep
-- the amount reserved, a later success settles it once; a released key is
-- reserved again on retry; bad arguments are 22023 and change nothing;
-- every decision is one audit row.
BEGIN;
SELECT plan(39);

CREATE TEMP TABLE k AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-01', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
CREATE TEMP TABLE k2 AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-01', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
-- authorize(vault key, method, path, idempotency key, digest letter, amount, currency)
CREATE FUNCTION pg_temp.authorize(secret text, method text, path text, idem text, digest text,
                                  amount bigint, currency text DEFAULT 'usd')
  RETURNS TABLE (decision text, http_status integer, body text, key_id text, request_id text)
  LANGUAGE sql AS $$
  SELECT * FROM billguard.vault_authorize(sha256(convert_to(secret, 'UTF8')), method, path, idem,
                                          repeat(digest, 64), amount, currency, 'cus_t21')
$$;
CREATE FUNCTION pg_temp.decision(secret text, method text, path text, idem text, digest text,
                                 amount bigint, currency text DEFAULT 'usd') RETURNS text
  LANGUAGE sql AS $$
  SELECT a.decision || coalesce(' ' || a.http_status, '') || coalesce(' ' || (a.body::jsonb -> 'error' ->> 'code'), '')
    FROM pg_temp.authorize(secret, method, path, idem, digest, amount, currency) a
$$;
CREATE FUNCTION pg_temp.sums() RETURNS text LANGUAGE sql AS $$
  SELECT settled_cents || '/' || reserved_cents FROM billguard.vault_spend WHERE billing_period = '2041-01'
$$;
CREATE TEMP TABLE other AS
  SELECT * FROM billguard.issue_vault_key('stripe', '2041-02', 50, ARRAY['/v1/payment_intents'],
                                          now() + interval '40 days', false);
UPDATE billguard.vault_keys SET expires_at = now() WHERE key_id = (SELECT key_id FROM other);

-- Scope.
SELECT is(pg_temp.decision('vk_test_' || repeat('x', 32), 'POST', '/v1/payment_intents', 'i0', 'a', 50),
          'refused 401 vault_key_unknown', 'an unknown key is 401');
SELECT is(pg_temp.decision((SELECT vault_key FROM other), 'POST', '/v1/payment_intents', 'i0', 'a', 50),
          'refused 401 vault_key_expired', 'an expired key is 401');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/charges', 'i0', 'a', 50),
          'refused 403 endpoint_not_allowed', 'an endpoint the key does not allow is 403');
SELECT is((SELECT body::jsonb -> 'error' ->> 'message'
             FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/charges', 'i0', 'a', 50)),
          format('vault key %s may call GET and POST on /v1/payment_intents only, not POST /v1/charges', (SELECT key_id FROM k)),
          '... and the refusal names the allowed endpoints');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'DELETE', '/v1/payment_intents/pi_1', NULL, 'a', NULL),
          'refused 403 endpoint_not_allowed', 'a method other than GET and POST is 403');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents_evil', 'i0', 'a', 50),
          'refused 403 endpoint_not_allowed', 'a path that merely begins like an allowed one is 403');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i0', 'a', 50, 'eur'),
          'refused 403 currency_not_allowed', 'another currency is 403');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'GET', '/v1/payment_intents/search', NULL, 'a', NULL),
          'forwarded', 'a read of an allowed endpoint is forwarded, uncounted');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', NULL, 'a', 50),
          'refused 400 idempotency_key_required', 'a charge without Idempotency-Key is 400');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i0', 'a', 50, NULL),
          'refused 400 parameter_missing', 'a charge without currency is 400');
SELECT is(pg_temp.sums(), '0/0', 'no refusal and no read counted anything');

-- Reservations up to the cap (5,000 cents).
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'a', 3000),
          'reserved', 'a charge within the cap is reserved');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'a', 3000),
          'reused', 'the same Idempotency-Key reuses its reservation');
SELECT is(pg_temp.decision((SELECT vault_key FROM k2), 'POST', '/v1/payment_intents', 'i1', 'a', 3000),
          'reused', '... also through another key of the same budget');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'b', 3000),
          'refused 400', 'the same Idempotency-Key with other parameters is refused');
SELECT is((SELECT body::jsonb -> 'error' ->> 'type'
             FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i1', 'b', 3000)),
          'idempotency_error', '... as Stripe''s idempotency_error');
SELECT is(pg_temp.sums(), '0/3000', 'the reservation is counted once');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2001),
          'refused 429 spend_cap_exceeded', 'a charge one cent past the cap is 429');
SELECT is((SELECT body FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2001)),
          '{"error": {"code": "spend_cap_exceeded", "type": "invalid_request_error", "message": "spend cap exceeded for billing_period 2041-01"}}',
          '... with a Stripe-shaped body: spend cap exceeded for billing_period 2041-01');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2000),
          'reserved', 'a charge reaching exactly the cap is reserved');
SELECT is(pg_temp.sums(), '0/5000', 'settled + reserved = the cap, never more');

-- Settling.
SELECT is(billguard.vault_settle((SELECT key_id FROM k), 'i1', 200, NULL, 'pi_t21', '{"id": "pi_t21"}', 'req_t21'),
          'settled', 'a 200 settles the reservation');
SELECT is(billguard.vault_settle((SELECT key_id FROM k2), 'i1', 200, NULL, 'pi_t21', '{"id": "pi_t21"}', 'req_t21b'),
          'settled', 'a second 200 for the same Idempotency-Key (a concurrent retry) ...');
SELECT is(pg_temp.sums(), '3000/2000', '... is counted once');
SELECT results_eq($$SELECT decision, http_status, body, request_id
                      FROM pg_temp.authorize((SELECT vault_key FROM k2), 'POST', '/v1/payment_intents', 'i1', 'a', 3000)$$,
                  $$VALUES ('replayed'::text, 200, '{"id": "pi_t21"}'::text, 'req_t21'::text)$$,
                  'a settled success is replayed with its status, body and Request-Id, through any key of the budget');
SELECT is(billguard.vault_settle((SELECT key_id FROM k), 'i2', 500, 'api_error', NULL, '{}', 'req_500'),
          'unknown', 'a 500 leaves the outcome unknown');
SELECT is(billguard.vault_settle((SELECT key_id FROM k), 'i2', 0, NULL, NULL, NULL, NULL),
          'unknown', 'no answer leaves the outcome unknown');
SELECT is(pg_temp.sums(), '3000/2000', '... and the amount stays reserved');
SELECT is(billguard.vault_settle((SELECT key_id FROM k), 'i2', 402, 'card_error', NULL, '{}', 'req_402'),
          'released', 'a 402 releases the reservation');
SELECT is(pg_temp.sums(), '3000/0', '... and the amount is no longer counted');
SELECT is(pg_temp.decision((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i2', 'a', 2000),
          'reserved', 'a retry of a released key is reserved again');
SELECT is(billguard.vault_settle((SELECT key_id FROM k), 'i2', 400, 'invalid_request_error', NULL, '{}', NULL),
          'released', 'a 400 invalid_request_error releases it');
SELECT is(pg_temp.sums(), '3000/0', 'released, nothing reserved');
SELECT is(billguard.vault_settle((SELECT key_id FROM k), 'i2', 200, NULL, 'pi_late', '{"id": "pi_late"}', 'req_late'),
          'settled', 'a success Stripe answers after it refused the key ...');
SELECT is(pg_temp.sums(), '5000/0', '... is counted again: the money is spent');
SELECT is((SELECT committed_cents FROM billguard.vault_budgets WHERE billing_period = '2041-01'), 5000::bigint,
          'the budget''s committed sum is its settled and reserved sums');

-- Bad arguments change nothing.
SELECT throws_ok($$SELECT * FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents', 'i3', 'a', 0)$$,
                 '22023', NULL, 'an amount of 0 is 22023');
SELECT throws_ok($$SELECT * FROM pg_temp.authorize((SELECT vault_key FROM k), 'POST', '/v1/payment_intents/../x', 'i3', 'a', 5)$$,
                 '22023', NULL, 'a path with .. is 22023');

-- One audit row per decision.
SELECT is((SELECT string_agg(decision || coalesce(':' || http_status, ''), ' ' ORDER BY occurred_at)
             FROM billguard.vault_audit WHERE billing_period = '2041-01' AND decision <> 'issued'),
          'refused:403 refused:403 refused:403 refused:403 refused:403 forwarded refused:400 refused:400 '
          'reserved reused reused refused:400 refused:400 refused:429 refused:429 reserved '
          'settled:200 settled:200 replayed:200 unknown:500 unknown:0 released:402 reserved released:400 '
          'settled:200',
          'every decision of the budget is in vault_audit, in order');

SELECT * FROM finish();
ROLLBACK;
