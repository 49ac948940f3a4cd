-- 09_privileges.sql: the README's grants are enough to bill, and nothing more.
--
-- Proves: a role without grants (app_without_grants) is refused (42501) for
-- bill_period, bill_customer, period_status and reading billing_records;
-- a role with exactly the README grants (billing_app) can call bill_period,
-- bill_customer, period_status, entity_state, idempotency_key and
-- key_namespace, whose writes land in the tables, but cannot read or write
-- billing_records, journal, accounts or snapshots directly, cannot call the
-- internal journal functions, and cannot change the key namespace.
-- Roles are created inside the transaction and vanish with the ROLLBACK.
BEGIN;
SELECT plan(45);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't09\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency) VALUES
  ('t09_carol', 'cus_t09carol', 2500, 'usd'),
  ('t09_dave', 'cus_t09dave', 3500, 'chf');

CREATE ROLE app_without_grants NOLOGIN;
CREATE ROLE billing_app NOLOGIN;
-- Exactly the README grants.
GRANT USAGE ON SCHEMA billguard TO billing_app;
GRANT EXECUTE ON FUNCTION billguard.bill_period(text), billguard.bill_customer(text, text, text),
  billguard.period_status(text), billguard.entity_state(text), billguard.idempotency_key(text, text, text),
  billguard.key_namespace() TO billing_app;

------------------------------------------------------------------------------
-- No grants: refused.
SET LOCAL ROLE app_without_grants;
SELECT is(current_user::text, 'app_without_grants', 'running as app_without_grants');
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2034-01')$$, '42501',
                 'permission denied for schema billguard', 'app_without_grants: bill_period refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t09_carol', '2034-01')$$, '42501',
                 'permission denied for schema billguard', 'app_without_grants: bill_customer refused');
SELECT throws_ok($$SELECT * FROM billguard.period_status('2034-01')$$, '42501',
                 'permission denied for schema billguard', 'app_without_grants: period_status refused');
SELECT throws_ok($$SELECT * FROM billguard.billing_records$$, '42501',
                 'permission denied for schema billguard', 'app_without_grants: SELECT from billing_records refused');
SELECT throws_ok($$SELECT * FROM billguard.journal$$, '42501',
                 'permission denied for schema billguard', 'app_without_grants: SELECT from journal refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('t09_carol', '2034-01')$$, '42501',
                 'permission denied for schema billguard', 'app_without_grants: idempotency_key refused');
RESET ROLE;

-- Even with USAGE on the schema, no EXECUTE and no table privilege.
GRANT USAGE ON SCHEMA billguard TO app_without_grants;
SET LOCAL ROLE app_without_grants;
SELECT throws_ok($$SELECT * FROM billguard.bill_period('2034-01')$$, '42501',
                 'permission denied for function bill_period', 'app_without_grants + USAGE: bill_period refused');
SELECT throws_ok($$SELECT * FROM billguard.bill_customer('t09_carol', '2034-01')$$, '42501',
                 'permission denied for function bill_customer', 'app_without_grants + USAGE: bill_customer refused');
SELECT throws_ok($$SELECT * FROM billguard.period_status('2034-01')$$, '42501',
                 'permission denied for function period_status', 'app_without_grants + USAGE: period_status refused');
SELECT throws_ok($$SELECT * FROM billguard.billing_records$$, '42501',
                 'permission denied for table billing_records', 'app_without_grants + USAGE: SELECT from billing_records refused');
RESET ROLE;
REVOKE USAGE ON SCHEMA billguard FROM app_without_grants;
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id LIKE 't09\_%'), 0::bigint,
          'the refused calls wrote nothing');

------------------------------------------------------------------------------
-- The README grants: the public functions work.
SET LOCAL ROLE billing_app;
SELECT is(current_user::text, 'billing_app', 'running as billing_app');
SELECT results_eq($$SELECT * FROM billguard.bill_period('2034-01')$$,
                  $$VALUES ('2034-01'::text, 2::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  'billing_app: bill_period works (2 initiated)');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t09_carol', '2034-01', 'req-app')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t09_carol', '2034-01'), NULL::text$$,
                  'billing_app: bill_customer works (in_progress for a claimed period)');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t09_carol', '2034-02')$$,
                  $$SELECT 'initiated'::text, billguard.idempotency_key('t09_carol', '2034-02'), NULL::text$$,
                  'billing_app: bill_customer works (initiated for a new period)');
SELECT results_eq($$SELECT status, count, amount_cents FROM billguard.period_status('2034-01')
                     WHERE status = 'pending'$$,
                  $$VALUES ('pending'::text, 2::bigint, 6000::numeric)$$,
                  'billing_app: period_status works');
SELECT is(billguard.entity_state('billing-t09_carol-2034-01') ->> 'status', 'in_progress',
          'billing_app: entity_state works');
SELECT is(billguard.key_namespace(), 'akka-billing', 'billing_app: key_namespace works');
SELECT is(billguard.idempotency_key('cust_123', '2026-08'), '0f3fe6c7ee131571ac54c216d9553542',
          'billing_app: idempotency_key works, with its default namespace');

-- ... but no direct table access.
SELECT throws_ok($$SELECT * FROM billguard.billing_records$$, '42501',
                 'permission denied for table billing_records', 'billing_app: SELECT from billing_records refused');
SELECT throws_ok($$INSERT INTO billguard.billing_records (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer)
                   VALUES ('t09_carol', '2034-03', 'k', 1, 'usd', 'cus_x')$$, '42501',
                 'permission denied for table billing_records', 'billing_app: INSERT into billing_records refused');
SELECT throws_ok($$UPDATE billguard.billing_records SET status = 'completed', charge_id = 'ch_fake'$$, '42501',
                 'permission denied for table billing_records', 'billing_app: UPDATE of billing_records refused');
SELECT throws_ok($$DELETE FROM billguard.billing_records$$, '42501',
                 'permission denied for table billing_records', 'billing_app: DELETE from billing_records refused');
SELECT throws_ok($$SELECT * FROM billguard.journal$$, '42501',
                 'permission denied for table journal', 'billing_app: SELECT from journal refused');
SELECT throws_ok($$INSERT INTO billguard.journal (persistence_id, seq_nr, event_type, event)
                   VALUES ('billing-t09_carol-2034-01', 2, 'BillingCompleted', '{"charge_id": "ch_fake"}')$$, '42501',
                 'permission denied for table journal', 'billing_app: INSERT into journal refused');
SELECT throws_ok($$UPDATE billguard.journal SET event = '{}'$$, '42501',
                 'permission denied for table journal', 'billing_app: UPDATE of journal refused');
SELECT throws_ok($$DELETE FROM billguard.journal$$, '42501',
                 'permission denied for table journal', 'billing_app: DELETE from journal refused');
SELECT throws_ok($$SELECT * FROM billguard.accounts$$, '42501',
                 'permission denied for table accounts', 'billing_app: SELECT from accounts refused');
SELECT throws_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents)
                   VALUES ('t09_mallory', 'cus_t09mallory', 1)$$, '42501',
                 'permission denied for table accounts', 'billing_app: INSERT into accounts refused');
SELECT throws_ok($$UPDATE billguard.accounts SET amount_cents = 1$$, '42501',
                 'permission denied for table accounts', 'billing_app: UPDATE of accounts refused');
SELECT throws_ok($$DELETE FROM billguard.accounts$$, '42501',
                 'permission denied for table accounts', 'billing_app: DELETE from accounts refused');
SELECT throws_ok($$SELECT * FROM billguard.snapshots$$, '42501',
                 'permission denied for table snapshots', 'billing_app: SELECT from snapshots refused');
SELECT throws_ok($$DELETE FROM billguard.snapshots$$, '42501',
                 'permission denied for table snapshots', 'billing_app: DELETE from snapshots refused');
-- ... nor the internal functions.
SELECT throws_ok($$SELECT billguard.append_event('billing-t09_carol-2034-01', 1, 'BillingCompleted', '{"charge_id": "ch_fake"}')$$,
                 '42501', 'permission denied for function append_event', 'billing_app: append_event refused');
SELECT throws_ok($$SELECT * FROM billguard.events('billing-t09_carol-2034-01')$$,
                 '42501', 'permission denied for function events', 'billing_app: events refused');
SELECT throws_ok($$SELECT * FROM billguard.apply_retention('billing-scheduler', 1)$$,
                 '42501', 'permission denied for function apply_retention', 'billing_app: apply_retention refused');
SELECT throws_ok($$SELECT billguard.save_snapshot('billing-scheduler')$$,
                 '42501', 'permission denied for function save_snapshot', 'billing_app: save_snapshot refused');
SELECT throws_ok($$SELECT * FROM billguard.claim_period('2034-04')$$,
                 '42501', 'permission denied for function claim_period', 'billing_app: claim_period refused');
-- ... nor the namespace.
SELECT throws_ok($$SET billguard.key_namespace = 'app-ns'$$, '42501',
                 'permission denied to set parameter "billguard.key_namespace"',
                 'billing_app: SET billguard.key_namespace refused');
RESET ROLE;

------------------------------------------------------------------------------
-- What billing_app did through the functions is in the tables, and its
-- refused attempts changed nothing.
SELECT is(current_user::text, session_user::text, 'back to the session user');
SELECT bag_eq($$SELECT customer_id, billing_period, status, request_id FROM billguard.billing_records
                 WHERE customer_id LIKE 't09\_%'$$,
              $$VALUES ('t09_carol'::text, '2034-01'::text, 'pending'::text, NULL::text),
                       ('t09_dave', '2034-01', 'pending', NULL),
                       ('t09_carol', '2034-02', 'pending', NULL)$$,
              'billing_app''s calls wrote exactly three pending records, none forged');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t09\_%'), 3::bigint,
          'billing_app''s calls wrote exactly three BillingInitiated events');
SELECT is((SELECT count(*) FROM billguard.accounts WHERE customer_id LIKE 't09\_%'), 2::bigint,
          'no account was added by billing_app');
SELECT is((SELECT sum(amount_cents) FROM billguard.accounts WHERE customer_id LIKE 't09\_%'), 6000::numeric,
          'no account was changed by billing_app');

SELECT * FROM finish();
ROLLBACK;
