-- billguard 0.1.0 -> 0.2.0. Run by ALTER EXTENSION billguard UPDATE.
-- Every schema change since the 0.1.0 release is made here as well as in
-- sql/install/ (the fresh install of 0.2.0); test/t/080_upgrade.pl proves
-- that both give the same schema.
\echo Use "ALTER EXTENSION billguard UPDATE TO '0.2.0'" to load this file. \quit

-- ==== Every function pins its search_path (issue 6, item 1) ====
-- The dispatcher runs as a superuser: a function that resolved names through
-- the caller's search_path could run an object planted in a schema another
-- role can create in (public, in a database that role owns).
ALTER FUNCTION billguard.key_namespace() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.idempotency_key(text,text,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.wake_dispatcher() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.is_billing_period(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.check_billing_period(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.billing_initiated_event(text,text,text,bigint,text,timestamp with time zone,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.refuse_journal_change() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.highest_seq_nr(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.state_version() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.initial_state(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.apply_event(jsonb,text,jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.refuse_billing_record_change() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.caller_status(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.period_lock_class() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.scheduler_lock_class() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.append_billing_event(text,text,text,jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.retry_delay(integer,double precision) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.requeue_abandoned() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.claim_due_records(integer,interval,interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.lock_attempt(text,integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.is_json(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.json_or_null(text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.classify_stripe_response(integer,boolean,text,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_charge_response(text,integer,integer,text,text,boolean,integer,interval) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.error_text(jsonb) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_transport_error(text,integer,text,integer) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_search_result(text,integer,integer,text) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.release_claim(text,integer,boolean) SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.dispatcher_state() SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION billguard.record_for_operator(text,text,text[],text) SET search_path = pg_catalog, pg_temp;
