-- 23_connect_webhooks.sql: a webhook event applies to the records of the
-- Stripe account it comes from, and to no other.
--
-- Proves: apply_stripe_event of an event with "account": "acct_..."
-- completes a record whose stripe_account is that account; one without
-- "account" completes a platform record (stripe_account NULL); an event of
-- connected account A naming (key, amount, currency, customer) a record of
-- connected account B, or of the platform, and a platform event naming a
-- connected account's record, are 'mismatch', leave the record as it was
-- and journal WebhookApplied with a detail naming both accounts; a record
-- keeps the stripe_account of its account at its claim.
BEGIN;
SELECT plan(14);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't22\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, stripe_account)
VALUES ('t22_platform', 'cus_t22', 1000, NULL),
       ('t22_a', 'cus_t22', 1000, 'acct_t22A'),
       ('t22_b', 'cus_t22', 1000, 'acct_t22B');
SELECT results_eq($$SELECT initiated FROM billguard.bill_period('2036-02')$$, ARRAY[3::bigint],
                  'three records claimed for 2036-02');
SELECT results_eq($$SELECT customer_id || '=' || coalesce(stripe_account, 'platform') FROM billguard.billing_records
                     WHERE billing_period = '2036-02' ORDER BY customer_id$$,
                  ARRAY['t22_a=acct_t22A', 't22_b=acct_t22B', 't22_platform=platform'],
                  'each record froze its account''s stripe_account');
-- As after a cached 500: a webhook is what settles them.
UPDATE billguard.billing_records SET status = 'unknown', attempts = 1, first_dispatched_at = now()
 WHERE billing_period = '2036-02';

-- payment_intent.succeeded from `from` (NULL: the platform) about the
-- charge of `customer`'s record: its key, amount, currency and customer.
CREATE FUNCTION pg_temp.succeeded(from_account text, customer text, n int) RETURNS jsonb
  LANGUAGE sql AS $$
  SELECT jsonb_strip_nulls(jsonb_build_object('id', 'evt_t22_' || n, 'object', 'event', 'account', from_account,
           'type', 'payment_intent.succeeded', 'created', 1800000000,
           'data', jsonb_build_object('object', jsonb_build_object('id', 'pi_t22_' || n, 'object', 'payment_intent',
             'amount', 1000, 'currency', 'usd', 'customer', 'cus_t22', 'status', 'succeeded',
             'metadata', jsonb_build_object('billguard_key', billguard.idempotency_key(customer, '2036-02'))))))
$$;
CREATE FUNCTION pg_temp.apply(from_account text, customer text, n int) RETURNS text
  LANGUAGE sql AS $$
  SELECT billguard.apply_stripe_event(r, pg_temp.succeeded(from_account, customer, n))
    FROM billguard.billing_records r WHERE r.customer_id = customer AND r.billing_period = '2036-02'
$$;

SET client_min_messages = error;  -- the mismatches' WARNINGs
SELECT is(pg_temp.apply('acct_t22A', 't22_b', 1), 'mismatch', 'acct_t22A''s event naming acct_t22B''s record: mismatch');
SELECT is(pg_temp.apply('acct_t22A', 't22_platform', 2), 'mismatch', 'acct_t22A''s event naming a platform record: mismatch');
SELECT is(pg_temp.apply(NULL, 't22_a', 3), 'mismatch', 'a platform event naming acct_t22A''s record: mismatch');
SELECT is(pg_temp.apply('acct_t22B', 't22_a', 4), 'mismatch', 'acct_t22B''s event naming acct_t22A''s record: mismatch');
RESET client_min_messages;
SELECT results_eq($$SELECT status FROM billguard.billing_records WHERE billing_period = '2036-02' ORDER BY customer_id$$,
                  ARRAY['unknown', 'unknown', 'unknown'], 'no record completed by another account''s event');
SELECT is((SELECT event ->> 'detail' FROM billguard.journal
            WHERE persistence_id = 'billing-t22_platform-2036-02' AND event_type = 'WebhookApplied'),
          'the event comes from connected account acct_t22A, the record''s charge is made on the platform''s own account',
          'the journal says which account the event came from and which the record charges on');
SELECT is((SELECT event ->> 'detail' FROM billguard.journal
            WHERE persistence_id = 'billing-t22_a-2036-02' AND event_type = 'WebhookApplied' AND event ->> 'event_id' = 'evt_t22_3'),
          'the event comes from the platform''s own account, the record''s charge is made on connected account acct_t22A',
          '... in both directions');

SELECT is(pg_temp.apply('acct_t22A', 't22_a', 5), 'completed', 'acct_t22A''s own event completes its record');
SELECT is(pg_temp.apply('acct_t22B', 't22_b', 6), 'completed', 'acct_t22B''s own event completes its record');
SELECT is(pg_temp.apply(NULL, 't22_platform', 7), 'completed', 'a platform event completes the platform record');
SELECT results_eq($$SELECT customer_id || '=' || status || ':' || charge_id FROM billguard.billing_records
                     WHERE billing_period = '2036-02' ORDER BY customer_id$$,
                  ARRAY['t22_a=completed:pi_t22_5', 't22_b=completed:pi_t22_6', 't22_platform=completed:pi_t22_7'],
                  'each completed with its own account''s charge');
SELECT results_eq($$SELECT effect, count(*) FROM billguard.stripe_events WHERE billing_period = '2036-02'
                     GROUP BY effect ORDER BY effect$$,
                  $$VALUES ('completed'::text, 3::bigint), ('mismatch', 4)$$,
                  'stripe_events: three completed, four mismatches');

SELECT * FROM finish();
ROLLBACK;
