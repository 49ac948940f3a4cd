-- 11_payment_status.sql: a 2xx that created an object without charging it.
--
-- Proves: record_charge_response marks a PaymentIntent answered 200 with
-- status requires_action (or requires_payment_method) failed, terminal,
-- with the status in last_error and a BillingFailed event, never completed;
-- succeeded and processing PaymentIntents and pending charges complete.
BEGIN;
SELECT plan(9);

UPDATE billguard.billing_records SET next_attempt_at = 'infinity'
 WHERE customer_id NOT LIKE 't11\_%' AND status IN ('pending', 'dispatching', 'unknown');
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
SELECT 't11_' || n, 'cus_t11_' || n, 1500 FROM unnest(ARRAY['action', 'method', 'processing', 'pending']) n;
SELECT count(*) FROM billguard.accounts a, billguard.bill_customer(a.customer_id, '2031-11') b
 WHERE a.customer_id LIKE 't11\_%';
SELECT count(*) FROM billguard.claim_due_records(10, '1 minute', '23 hours', '/v1/payment_intents');

CREATE FUNCTION pg_temp.answer(c text, body text) RETURNS text LANGUAGE sql AS $$
  SELECT billguard.record_charge_response(billguard.idempotency_key('t11_' || c, '2031-11'), 1, 200,
                                          body, NULL, false, 10, '2 minutes') $$;

SELECT is(pg_temp.answer('action', '{"id": "pi_A", "object": "payment_intent", "status": "requires_action"}'),
          'failed', 'requires_action: failed');
SELECT is((SELECT status || ' ' || coalesce(charge_id, '-') FROM billguard.billing_records WHERE customer_id = 't11_action'),
          'failed -', 'the record is failed, with no charge id');
SELECT matches((SELECT last_error FROM billguard.billing_records WHERE customer_id = 't11_action'),
               'requires_action: not charged', 'last_error says why');
SELECT is((SELECT event ->> 'terminal' FROM billguard.journal
            WHERE persistence_id = 'billing-t11_action-2031-11' AND event_type = 'BillingFailed'),
          'true', 'a terminal BillingFailed event');
SELECT is(pg_temp.answer('method', '{"id": "pi_M", "object": "payment_intent", "status": "requires_payment_method"}'),
          'failed', 'requires_payment_method: failed');
SELECT is(pg_temp.answer('processing', '{"id": "pi_P", "object": "payment_intent", "status": "processing"}'),
          'completed', 'processing: completed (the charge settles asynchronously)');
SELECT is(pg_temp.answer('pending', '{"id": "ch_P", "object": "charge", "status": "pending"}'),
          'completed', 'a pending charge: completed');
SELECT is((SELECT charge_id FROM billguard.billing_records WHERE customer_id = 't11_pending'),
          'ch_P', 'with its id');
SELECT is((SELECT b.status FROM billguard.bill_customer('t11_action', '2031-11') b), 'failed',
          'bill_customer answers failed');

SELECT * FROM finish();
ROLLBACK;
