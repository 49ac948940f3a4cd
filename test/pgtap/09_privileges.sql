-- 09_privileges.sql: the grants of docs/privileges.md, run exactly as written there, let
-- each role do its job, and nothing more.
--
-- Proves: a role without grants (app_without_grants) is refused (42501) for
-- bill_period, bill_customer, period_status and reading billing_records;
-- the application role (billing_app) can call bill_period, bill_customer,
-- period_status, entity_state, await_billing, idempotency_key and
-- key_namespace, whose writes land in the tables, but cannot read or write
-- billing_records, journal, accounts or snapshots directly, cannot call the
-- internal journal functions, cannot read dispatch_status and cannot change
-- the key namespace; the accounts maintainer (billing_accounts) can write period amounts, read,
-- add and change accounts, but not delete them, bill, or read billing
-- records or the dispatcher's state; the operator (billing_ops) can read
-- dispatch_status (seeing the dispatcher as a superuser does), requeue a
-- failed record and resolve one that needs review, but cannot bill, read or
-- change the tables, or see where the API key lives; the webhook role
-- (billing_webhooks) can call ingest_stripe_event and nothing else.
-- The block between the markers is that of docs/privileges.md, verbatim;
-- test/t/106_privileges_doc_in_step.pl fails when the two differ.
-- Roles are created inside the transaction and vanish with the ROLLBACK.
BEGIN;
SELECT plan(88);

UPDATE billguard.accounts SET active = false WHERE customer_id NOT LIKE 't09\_%';
INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency) VALUES
  ('t09_carol', 'cus_t09carol', 2500, 'usd'),
  ('t09_dave', 'cus_t09dave', 3500, 'chf');

CREATE ROLE app_without_grants NOLOGIN;
CREATE ROLE billing_app NOLOGIN;
CREATE ROLE billing_accounts NOLOGIN;
CREATE ROLE billing_ops NOLOGIN;
CREATE ROLE billing_webhooks NOLOGIN;
-- docs/privileges.md grants: begin
-- The application: bills, and reads what it billed.
GRANT USAGE ON SCHEMA billguard TO billing_app;
GRANT EXECUTE ON FUNCTION
  billguard.bill_period(text),
  billguard.bill_customer(text, text, text),
  billguard.period_status(text),
  billguard.entity_state(text),
  billguard.await_billing(text, text, interval),
  billguard.idempotency_key(text, text, text),
  billguard.key_namespace()
TO billing_app;

-- Whoever maintains the accounts and what each owes for a period (their
-- CHECKs call is_valid_customer_id(), is_billing_period() and
-- is_stripe_metadata(), which PostgreSQL checks against the inserting role).
GRANT USAGE ON SCHEMA billguard TO billing_accounts;
GRANT SELECT, INSERT, UPDATE ON billguard.accounts TO billing_accounts;
GRANT SELECT, INSERT, UPDATE, DELETE ON billguard.period_amounts TO billing_accounts;
GRANT EXECUTE ON FUNCTION
  billguard.is_valid_customer_id(text),
  billguard.is_billing_period(text),
  billguard.is_stripe_metadata(jsonb)
TO billing_accounts;

-- Operators: the dispatcher's and the scheduler's state (the views call
-- dispatcher_state() and scheduler_state(), which PostgreSQL checks against
-- the caller), the due periods never billed, requeueing, resolving and
-- cancelling records and claiming cancelled ones again, and adopting a
-- restored or copied database.
GRANT USAGE ON SCHEMA billguard TO billing_ops;
GRANT SELECT ON billguard.dispatch_status, billguard.scheduler_status TO billing_ops;
GRANT EXECUTE ON FUNCTION
  billguard.dispatcher_state(),
  billguard.scheduler_state(),
  billguard.due_periods(),
  billguard.retry_record(text, text),
  billguard.retry_period(text, text),
  billguard.resolve_record(text, text, text),
  billguard.cancel_record(text, text),
  billguard.reclaim_record(text, text),
  billguard.adopt_database()
TO billing_ops;

-- Stripe's webhooks, as billguard-proxy delivers them (POST /webhooks/stripe):
-- verified events applied to the records, and nothing else.
GRANT USAGE ON SCHEMA billguard TO billing_webhooks;
GRANT EXECUTE ON FUNCTION billguard.ingest_stripe_event(text, text) TO billing_webhooks;
-- docs/privileges.md grants: end

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
-- The documented grants: the public functions work.
SET LOCAL ROLE billing_app;
SELECT is(current_user::text, 'billing_app', 'running as billing_app');
SELECT results_eq($$SELECT * FROM billguard.bill_period('2034-01')$$,
                  $$VALUES ('2034-01'::text, 2::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint, 0::bigint)$$,
                  'billing_app: bill_period works (2 initiated)');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t09_carol', '2034-01', 'req-app')$$,
                  $$SELECT 'in_progress'::text, billguard.idempotency_key('t09_carol', '2034-01'), NULL::text$$,
                  'billing_app: bill_customer works (in_progress for a claimed period)');
SELECT results_eq($$SELECT * FROM billguard.bill_customer('t09_carol', '2034-02')$$,
                  $$SELECT 'initiated'::text, billguard.idempotency_key('t09_carol', '2034-02'), NULL::text$$,
                  'billing_app: bill_customer works (initiated for a new period)');
SELECT results_eq($$SELECT status, count, amount_cents, currency FROM billguard.period_status('2034-01')
                     WHERE status = 'pending'$$,
                  $$VALUES ('pending'::text, 1::bigint, 3500::numeric, 'chf'::text), ('pending', 1, 2500, 'usd')$$,
                  'billing_app: period_status works (CHF and USD apart)');
SELECT is(billguard.entity_state('billing-t09_carol-2034-01') ->> 'status', 'in_progress',
          'billing_app: entity_state works');
SELECT results_eq($$SELECT * FROM billguard.await_billing('t09_carol', '2034-01', '0')$$,
                  $$VALUES ('in_progress'::text, NULL::text)$$,
                  'billing_app: await_billing works');
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
SELECT throws_ok($$SELECT * FROM billguard.dispatch_status$$, '42501',
                 'permission denied for view dispatch_status', 'billing_app: dispatch_status refused');
-- ... nor the namespace.
SELECT throws_ok($$SET billguard.key_namespace = 'app-ns'$$, '42501',
                 'permission denied to set parameter "billguard.key_namespace"',
                 'billing_app: SET billguard.key_namespace refused');
RESET ROLE;

------------------------------------------------------------------------------
-- The accounts maintainer: reads, adds and changes accounts; nothing else.
SET LOCAL ROLE billing_accounts;
SELECT is(current_user::text, 'billing_accounts', 'running as billing_accounts');
SELECT lives_ok($$INSERT INTO billguard.accounts (customer_id, stripe_customer, amount_cents, currency)
                  VALUES ('t09_erin', 'cus_t09erin', 1500, 'eur')$$,
                'billing_accounts: INSERT into accounts works');
SELECT lives_ok($$UPDATE billguard.accounts SET amount_cents = 1600 WHERE customer_id = 't09_erin'$$,
                'billing_accounts: UPDATE of accounts works');
SELECT is((SELECT amount_cents FROM billguard.accounts WHERE customer_id = 't09_erin'), 1600::bigint,
          'billing_accounts: SELECT from accounts works');
SELECT lives_ok($$INSERT INTO billguard.period_amounts (customer_id, billing_period, amount_cents, currency, metadata)
                  VALUES ('t09_erin', '2034-05', 2100, 'eur', '{"plan": "pro"}')$$,
                'billing_accounts: INSERT into period_amounts works (its metadata CHECK too)');
SELECT lives_ok($$UPDATE billguard.period_amounts SET amount_cents = 2200 WHERE customer_id = 't09_erin'$$,
                'billing_accounts: UPDATE of period_amounts works');
SELECT throws_ok(statement, '42501', message, 'billing_accounts: ' || refused) FROM (VALUES
  ($$DELETE FROM billguard.accounts WHERE customer_id = 't09_erin'$$,
   'permission denied for table accounts', 'DELETE from accounts refused'),
  ($$INSERT INTO billguard.currencies (code, minor_units) VALUES ('xts', 2)$$,
   'permission denied for table currencies', 'INSERT into currencies refused'),
  ($$SELECT * FROM billguard.billing_records$$,
   'permission denied for table billing_records', 'SELECT from billing_records refused'),
  ($$SELECT * FROM billguard.journal$$, 'permission denied for table journal', 'SELECT from journal refused'),
  ($$SELECT * FROM billguard.bill_period('2034-05')$$,
   'permission denied for function bill_period', 'bill_period refused'),
  ($$SELECT * FROM billguard.dispatch_status$$,
   'permission denied for view dispatch_status', 'dispatch_status refused'),
  ($$SELECT * FROM billguard.scheduler_status$$,
   'permission denied for view scheduler_status', 'scheduler_status refused'),
  ($$SELECT * FROM billguard.due_periods()$$,
   'permission denied for function due_periods', 'due_periods refused'),
  ($$SELECT billguard.adopt_database()$$,
   'permission denied for function adopt_database', 'adopt_database refused')
) AS cases (statement, message, refused);
RESET ROLE;

------------------------------------------------------------------------------
-- The operator: the dispatcher's state, requeueing and resolving; nothing else.
UPDATE billguard.billing_records SET status = 'failed', last_error = '402 card_error/card_declined'
 WHERE customer_id = 't09_carol' AND billing_period = '2034-01';
UPDATE billguard.billing_records SET status = 'needs_review'
 WHERE customer_id = 't09_dave' AND billing_period = '2034-01';
CREATE TEMPORARY TABLE t09_dispatcher_seen_by_superuser AS
  SELECT worker_running, worker_pid FROM billguard.dispatch_status;
GRANT SELECT ON t09_dispatcher_seen_by_superuser TO billing_ops;

SET LOCAL ROLE billing_ops;
SELECT is(current_user::text, 'billing_ops', 'running as billing_ops');
SELECT is((SELECT count(*) FROM billguard.dispatch_status), 1::bigint,
          'billing_ops: dispatch_status can be read');
SELECT results_eq($$SELECT worker_running, worker_pid FROM billguard.dispatch_status$$,
                  $$SELECT worker_running, worker_pid FROM t09_dispatcher_seen_by_superuser$$,
                  'billing_ops: it shows the dispatcher as a superuser sees it');
SELECT results_eq($$SELECT enabled, last_period_issued FROM billguard.scheduler_status$$,
                  $$VALUES (false, '2034-01'::text)$$,
                  'billing_ops: scheduler_status can be read (off; billing_app issued 2034-01)');
SELECT lives_ok($$SELECT * FROM billguard.due_periods()$$, 'billing_ops: due_periods works');
SELECT is(billguard.adopt_database(), 'this database bills its history already: nothing to adopt',
          'billing_ops: adopt_database works (and changes nothing in the billing database)');
SELECT is(billguard.retry_record('t09_carol', '2034-01'), 'pending', 'billing_ops: retry_record works');
SELECT is(billguard.resolve_record('t09_dave', '2034-01', 'pi_t09dave'), 'completed',
          'billing_ops: resolve_record works');
SELECT throws_ok($$SHOW billguard.api_key_file$$, '42501', NULL,
                 'billing_ops: where the API key lives stays hidden');
SELECT throws_ok(statement, '42501', message, 'billing_ops: ' || refused) FROM (VALUES
  ($$SELECT * FROM billguard.billing_records$$,
   'permission denied for table billing_records', 'SELECT from billing_records refused'),
  ($$UPDATE billguard.billing_records SET status = 'completed'$$,
   'permission denied for table billing_records', 'UPDATE of billing_records refused'),
  ($$SELECT * FROM billguard.accounts$$, 'permission denied for table accounts', 'SELECT from accounts refused'),
  ($$SELECT * FROM billguard.journal$$, 'permission denied for table journal', 'SELECT from journal refused'),
  ($$SELECT * FROM billguard.bill_period('2034-05')$$,
   'permission denied for function bill_period', 'bill_period refused'),
  ($$SELECT * FROM billguard.claim_due_records(10, '1 minute', '23 hours', '/v1/payment_intents')$$,
   'permission denied for function claim_due_records', 'claim_due_records refused'),
  ($$SELECT * FROM billguard.scheduler_tick()$$,
   'permission denied for function scheduler_tick', 'scheduler_tick refused'),
  ($$SET billguard.scheduler_now = '2034-02-01 00:00:00+00'$$,
   'permission denied to set parameter "billguard.scheduler_now"', 'SET billguard.scheduler_now refused')
) AS cases (statement, message, refused);
RESET ROLE;

------------------------------------------------------------------------------
-- The webhook role: ingest_stripe_event, which gets past the privileges to
-- the signature check (this cluster has no webhook secret); nothing else.
SET LOCAL ROLE billing_webhooks;
SELECT is(current_user::text, 'billing_webhooks', 'running as billing_webhooks');
SELECT throws_ok($$SELECT billguard.ingest_stripe_event('{}', 't=1,v1=00')$$, '55000',
                 'Stripe webhooks cannot be verified: billguard.webhook_secret_file is not set',
                 'billing_webhooks: ingest_stripe_event may be called (and needs the secret)');
SELECT throws_ok(statement, '42501', message, 'billing_webhooks: ' || refused) FROM (VALUES
  ($$SELECT * FROM billguard.stripe_events$$,
   'permission denied for table stripe_events', 'SELECT from stripe_events refused'),
  ($$SELECT * FROM billguard.billing_records$$,
   'permission denied for table billing_records', 'SELECT from billing_records refused'),
  ($$SELECT billguard.verify_stripe_signature('{}', 't=1,v1=00')$$,
   'permission denied for function verify_stripe_signature', 'verify_stripe_signature refused'),
  ($$SELECT * FROM billguard.bill_period('2034-05')$$,
   'permission denied for function bill_period', 'bill_period refused'),
  ($$SELECT * FROM billguard.dispatch_status$$,
   'permission denied for view dispatch_status', 'dispatch_status refused')
) AS cases (statement, message, refused);
RESET ROLE;
SET LOCAL ROLE billing_app;
SELECT throws_ok($$SELECT billguard.ingest_stripe_event('{}', 't=1,v1=00')$$, '42501',
                 'permission denied for function ingest_stripe_event',
                 'billing_app: ingest_stripe_event refused (webhooks are not the application''s)');
RESET ROLE;

------------------------------------------------------------------------------
-- What the roles did through the functions is in the tables, and their
-- refused attempts changed nothing.
SELECT is(current_user::text, session_user::text, 'back to the session user');
SELECT bag_eq($$SELECT customer_id, billing_period, status, request_id FROM billguard.billing_records
                 WHERE customer_id LIKE 't09\_%'$$,
              $$VALUES ('t09_carol'::text, '2034-01'::text, 'pending'::text, NULL::text),
                       ('t09_dave', '2034-01', 'completed', NULL),
                       ('t09_carol', '2034-02', 'pending', NULL)$$,
              'billing_app''s calls wrote exactly three records, none forged; billing_ops requeued one and resolved one');
SELECT is((SELECT charge_id FROM billguard.billing_records WHERE customer_id = 't09_dave' AND billing_period = '2034-01'),
          'pi_t09dave', 'the resolved record carries the charge billing_ops named');
SELECT is((SELECT count(*) FROM billguard.journal WHERE persistence_id LIKE 'billing-t09\_%'), 5::bigint,
          'three BillingInitiated events, one RecordRequeued, one ReviewResolved');
SELECT is((SELECT count(*) FROM billguard.accounts WHERE customer_id LIKE 't09\_%'), 3::bigint,
          'only billing_accounts added an account');
SELECT is((SELECT sum(amount_cents) FROM billguard.accounts WHERE customer_id LIKE 't09\_%'), 7600::numeric,
          'only billing_accounts changed an account');

SELECT * FROM finish();
ROLLBACK;
