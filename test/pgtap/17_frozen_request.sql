-- 17_frozen_request.sql: a record's request and charge id, once set, never change.
--
-- Proves: charge_request_body encodes exactly what the dispatcher sends
-- (bytes pinned) and refuses other endpoints and missing fields (22023);
-- the first claim stores the endpoint it was given and that body, a later
-- claim with another endpoint keeps both; UPDATEs of a stored request or
-- of a set charge id are refused (23000) and change nothing, setting a
-- charge id on a record without one is allowed; resolve_record refuses a
-- record that already has a charge id.
BEGIN;
SELECT plan(17);

UPDATE billguard.billing_records SET next_attempt_at = 'infinity'
 WHERE customer_id NOT LIKE 't17\_%' AND status IN ('pending', 'dispatching', 'unknown');
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency, payment_method)
VALUES ('t17_a', 'cus_t17a', 4900, 'usd', 'pm_card_visa'), ('t17_b', 'cus_t17b', 1200, 'eur', NULL);
SELECT count(*) FROM billguard.accounts a, billguard.bill_customer(a.customer_id, '2031-07') b WHERE a.customer_id LIKE 't17\_%';

CREATE FUNCTION pg_temp.r(c text) RETURNS billguard.billing_records LANGUAGE sql AS $$
  SELECT * FROM billguard.billing_records r WHERE r.customer_id = c AND r.billing_period = '2031-07' $$;

SELECT is(billguard.charge_request_body('/v1/payment_intents', '0f3fe6c7ee131571ac54c216d9553542', 'cust 1&2',
                                        '2026-08', 4900, 'usd', 'cus_123', 'pm_card_visa'),
          'amount=4900&currency=usd&customer=cus_123&payment_method=pm_card_visa&confirm=true'
          '&off_session=true&automatic_payment_methods%5Benabled%5D=true'
          '&automatic_payment_methods%5Ballow_redirects%5D=never&description=billguard+cust+1%262+2026-08'
          '&metadata%5Bbillguard_key%5D=0f3fe6c7ee131571ac54c216d9553542'
          '&metadata%5Bbilling_period%5D=2026-08&metadata%5Bcustomer_id%5D=cust+1%262',
          'charge_request_body: the PaymentIntent body, byte for byte, saying how it may be paid');
SELECT is(billguard.charge_request_body('/v1/charges', 'k', 'c', '2026-08', 100, 'usd', 'cus_1', NULL),
          'amount=100&currency=usd&customer=cus_1&description=billguard+c+2026-08'
          '&metadata%5Bbillguard_key%5D=k&metadata%5Bbilling_period%5D=2026-08&metadata%5Bcustomer_id%5D=c',
          'charge_request_body: a charge without a payment method');
SELECT throws_ok($$SELECT billguard.charge_request_body('/v1/refunds', 'k', 'c', '2026-08', 100, 'usd', 'cus_1', NULL)$$,
                 '22023', 'unsupported Stripe endpoint "/v1/refunds": use /v1/payment_intents or /v1/charges',
                 'charge_request_body refuses another endpoint: 22023');
SELECT throws_ok($$SELECT billguard.charge_request_body('/v1/charges', 'k', 'c', '2026-08', 100, NULL, 'cus_1', NULL)$$,
                 '22023', 'charge_request_body: argument 6 must not be NULL',
                 'charge_request_body refuses a missing field: 22023');

SELECT results_eq($$SELECT stripe_endpoint, request_body FROM pg_temp.r('t17_a')$$,
                  $$VALUES (NULL::text, NULL::text)$$, 'a record not yet claimed has no stored request');
UPDATE billguard.billing_records SET next_attempt_at = '2000-01-01' WHERE customer_id IN ('t17_a', 't17_b');
SELECT is((SELECT count(*) FROM billguard.claim_due_records(10, '30 seconds', '1 day', '/v1/payment_intents')),
          2::bigint, 'both records claimed');
SELECT results_eq($$SELECT stripe_endpoint, request_body FROM pg_temp.r('t17_a')$$,
                  $$SELECT '/v1/payment_intents', billguard.charge_request_body('/v1/payment_intents',
                           billguard.idempotency_key('t17_a', '2031-07'), 't17_a', '2031-07', 4900, 'usd', 'cus_t17a', 'pm_card_visa')$$,
                  'the first claim stores its endpoint and the body built for it');
CREATE TEMP TABLE t17_first AS SELECT customer_id, stripe_endpoint, request_body FROM billguard.billing_records
 WHERE customer_id IN ('t17_a', 't17_b');

UPDATE billguard.billing_records SET next_attempt_at = '2000-01-01', status = 'pending' WHERE customer_id IN ('t17_a', 't17_b');
SELECT results_eq($$SELECT customer_id, attempt, stripe_endpoint, request_body
                      FROM billguard.claim_due_records(10, '30 seconds', '1 day', '/v1/charges') ORDER BY 1$$,
                  $$SELECT customer_id, 2, stripe_endpoint, request_body FROM t17_first ORDER BY 1$$,
                  'a later claim under another endpoint sends the stored endpoint and body');
SELECT results_eq($$SELECT customer_id, stripe_endpoint, request_body FROM billguard.billing_records
                     WHERE customer_id IN ('t17_a', 't17_b') ORDER BY 1$$,
                  $$SELECT * FROM t17_first ORDER BY 1$$, '... and the stored request is unchanged');

SELECT throws_ok($$UPDATE billguard.billing_records SET request_body = request_body || '&amount=1' WHERE customer_id = 't17_a'$$,
                 '23000', 'billing record t17_a/2031-07: the request sent to Stripe never changes once stored',
                 'changing a stored body is refused: 23000');
SELECT throws_ok($$UPDATE billguard.billing_records SET stripe_endpoint = '/v1/charges' WHERE customer_id = 't17_a'$$,
                 '23000', 'billing record t17_a/2031-07: the request sent to Stripe never changes once stored',
                 'changing a stored endpoint is refused: 23000');
SELECT throws_ok($$UPDATE billguard.billing_records SET request_body = NULL, stripe_endpoint = NULL WHERE customer_id = 't17_a'$$,
                 '23000', NULL, 'erasing a stored request is refused: 23000');

UPDATE billguard.billing_records SET status = 'completed', charge_id = 'pi_t17first' WHERE customer_id = 't17_a';
SELECT is((pg_temp.r('t17_a')).charge_id, 'pi_t17first', 'a charge id is set on a record that has none');
SELECT throws_ok($$UPDATE billguard.billing_records SET charge_id = 'pi_t17other' WHERE customer_id = 't17_a'$$,
                 '23000', 'billing record t17_a/2031-07 already has charge pi_t17first: a charge id never changes',
                 'changing a completed record''s charge id is refused: 23000');
SELECT throws_ok($$UPDATE billguard.billing_records SET charge_id = NULL, status = 'failed' WHERE customer_id = 't17_a'$$,
                 '23000', NULL, 'erasing a charge id is refused: 23000');
SELECT results_eq($$SELECT status, charge_id, stripe_endpoint, request_body FROM pg_temp.r('t17_a')$$,
                  $$SELECT 'completed', 'pi_t17first', stripe_endpoint, request_body FROM t17_first WHERE customer_id = 't17_a'$$,
                  'the refused updates changed nothing');

UPDATE billguard.billing_records SET status = 'failed', charge_id = 'pi_t17seen' WHERE customer_id = 't17_b';
SELECT throws_ok($$SELECT billguard.resolve_record('t17_b', '2031-07', 'pi_t17new')$$,
                 '23000', 'billing record t17_b/2031-07 already has charge pi_t17seen: a charge id never changes',
                 'resolve_record refuses a record that already has a charge id');

SELECT * FROM finish();
ROLLBACK;
