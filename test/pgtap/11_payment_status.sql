-- 11_payment_status.sql: a 2xx that created an object without charging it.
--
-- The dispatcher judges a 2xx whose PaymentIntent is requires_action (or
-- requires_payment_method) 'failed' (common/stripe_response.cpp, unit
-- tested). Proves that recording it leaves the record failed, terminal,
-- with the status in last_error, a BillingFailed event and no charge id;
-- and that processing PaymentIntents and pending charges complete with
-- their id.
BEGIN;
SELECT plan(8);

UPDATE billguard.billing_records SET next_attempt_at = 'infinity'
 WHERE customer_id NOT LIKE 't11\_%' AND status IN ('pending', 'dispatching', 'unknown');
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
SELECT 't11_' || n, 'cus_t11_' || n, 1500 FROM unnest(ARRAY['action', 'processing', 'pending']) n;
SELECT count(*) FROM billguard.accounts a, billguard.bill_customer(a.customer_id, '2031-11') b
 WHERE a.customer_id LIKE 't11\_%';
SELECT count(*) FROM billguard.claim_due_records(10, '1 minute', '23 hours', '/v1/payment_intents');

CREATE FUNCTION pg_temp.answer(c text, outcome text, charge_id text, code text, message text) RETURNS text
  LANGUAGE sql AS $$
  SELECT billguard.record_charge_response(billguard.idempotency_key('t11_' || c, '2031-11'), 1, outcome, 200,
           charge_id, false, 'req_t11', CASE WHEN code IS NOT NULL THEN 'payment_status' END, code, NULL, message, NULL,
           '2 minutes') $$;

SELECT is(pg_temp.answer('action', 'failed', NULL, 'requires_action', 'payment_intent pi_A is requires_action: not charged'),
          'recorded', 'requires_action: recorded');
SELECT is((SELECT status || ' ' || coalesce(charge_id, '-') FROM billguard.billing_records WHERE customer_id = 't11_action'),
          'failed -', 'the record is failed, with no charge id');
SELECT matches((SELECT last_error FROM billguard.billing_records WHERE customer_id = 't11_action'),
               'requires_action: not charged', 'last_error says why');
SELECT is((SELECT event ->> 'terminal' FROM billguard.journal
            WHERE persistence_id = 'billing-t11_action-2031-11' AND event_type = 'BillingFailed'),
          'true', 'a terminal BillingFailed event');
SELECT is(pg_temp.answer('processing', 'completed', 'pi_P', NULL, NULL), 'recorded', 'processing: recorded');
SELECT is((SELECT status || ' ' || charge_id FROM billguard.billing_records WHERE customer_id = 't11_processing'),
          'completed pi_P', 'processing: completed (the charge settles asynchronously)');
SELECT is(pg_temp.answer('pending', 'completed', 'ch_P', NULL, NULL), 'recorded', 'a pending charge: recorded');
SELECT is((SELECT b.status FROM billguard.bill_customer('t11_action', '2031-11') b), 'failed',
          'bill_customer answers failed');

SELECT * FROM finish();
ROLLBACK;
