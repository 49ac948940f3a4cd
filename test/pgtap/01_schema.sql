-- 01_schema.sql: the installed schema is the documented one.
--
-- Proves: the extension lives in schema billguard and cannot be relocated;
-- the tables exist; billing_records keeps the seed's columns and constraints
-- verbatim (names, types, NOT NULL, defaults, billing_records_pk and
-- billing_records_uq); the journal's primary key is (persistence_id, seq_nr);
-- the status CHECK admits exactly the documented values; the data tables are
-- registered for pg_dump; nothing in the schema is granted to PUBLIC.
BEGIN;
SELECT plan(70);

-- The extension and its schema.
SELECT has_schema('billguard', 'schema billguard exists');
SELECT is((SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'billguard'),
          'billguard', 'extension billguard is installed in schema billguard');
SELECT is((SELECT extrelocatable FROM pg_extension WHERE extname = 'billguard'),
          false, 'extension billguard is not relocatable');
SELECT is((SELECT extversion FROM pg_extension WHERE extname = 'billguard'),
          (SELECT default_version FROM pg_available_extensions WHERE name = 'billguard'),
          'the extension is created at the default version of the control file');
SELECT ok((SELECT array_agg(version) FROM pg_available_extension_versions WHERE name = 'billguard')
          @> ARRAY['0.1.0', '0.2.0'], 'the released 0.1.0 and 0.2.0 are still installable');
SELECT throws_ok($$ALTER EXTENSION billguard SET SCHEMA public$$, '0A000', 'extension "billguard" does not support SET SCHEMA',
                 'ALTER EXTENSION billguard SET SCHEMA is refused');

-- Tables.
SELECT has_table('billguard', 'accounts', 'table billguard.accounts exists');
SELECT has_table('billguard', 'billing_records', 'table billguard.billing_records exists');
SELECT has_table('billguard', 'journal', 'table billguard.journal exists');
SELECT has_table('billguard', 'snapshots', 'table billguard.snapshots exists');
SELECT has_table('billguard', 'currencies', 'table billguard.currencies exists');

-- billing_records: the seed's columns, verbatim.
SELECT col_type_is('billguard', 'billing_records', 'customer_id', 'text', 'customer_id is TEXT');
SELECT col_not_null('billguard', 'billing_records', 'customer_id', 'customer_id is NOT NULL');
SELECT col_type_is('billguard', 'billing_records', 'billing_period', 'text', 'billing_period is TEXT');
SELECT col_type_is('billguard', 'billing_records', 'idempotency_key', 'text', 'idempotency_key is TEXT');
SELECT col_not_null('billguard', 'billing_records', 'idempotency_key', 'idempotency_key is NOT NULL');
SELECT col_type_is('billguard', 'billing_records', 'status', 'text', 'status is TEXT');
SELECT col_default_is('billguard', 'billing_records', 'status', 'pending'::text, 'status defaults to ''pending''');
SELECT col_type_is('billguard', 'billing_records', 'charge_id', 'text', 'charge_id is TEXT');
SELECT col_is_null('billguard', 'billing_records', 'charge_id', 'charge_id is nullable');
SELECT col_type_is('billguard', 'billing_records', 'created_at', 'timestamp with time zone', 'created_at is TIMESTAMPTZ');
SELECT col_not_null('billguard', 'billing_records', 'created_at', 'created_at is NOT NULL');
SELECT is((SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
             JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
            WHERE d.adrelid = 'billguard.billing_records'::regclass AND a.attname = 'created_at'),
          'now()', 'created_at defaults to now()');
SELECT is((SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
            WHERE attrelid = 'billguard.billing_records'::regclass AND attnum BETWEEN 1 AND 6),
          ARRAY['customer_id', 'billing_period', 'idempotency_key', 'status', 'charge_id', 'created_at'],
          'the first six columns are the seed''s, in the seed''s order');
-- ... plus what dispatch needs.
SELECT has_column('billguard', 'billing_records', 'amount_cents', 'billing_records.amount_cents exists');
SELECT has_column('billguard', 'billing_records', 'currency', 'billing_records.currency exists');
SELECT has_column('billguard', 'billing_records', 'attempts', 'billing_records.attempts exists');
SELECT has_column('billguard', 'billing_records', 'next_attempt_at', 'billing_records.next_attempt_at exists');
SELECT has_column('billguard', 'billing_records', 'first_dispatched_at', 'billing_records.first_dispatched_at exists');
SELECT has_column('billguard', 'billing_records', 'last_error', 'billing_records.last_error exists');
SELECT has_column('billguard', 'billing_records', 'completed_at', 'billing_records.completed_at exists');

-- The seed's constraints, by name and definition.
SELECT is((SELECT pg_get_constraintdef(oid) FROM pg_constraint
            WHERE conrelid = 'billguard.billing_records'::regclass AND conname = 'billing_records_pk'),
          'PRIMARY KEY (idempotency_key)', 'billing_records_pk = PRIMARY KEY (idempotency_key)');
SELECT is((SELECT pg_get_constraintdef(oid) FROM pg_constraint
            WHERE conrelid = 'billguard.billing_records'::regclass AND conname = 'billing_records_uq'),
          'UNIQUE (customer_id, billing_period)', 'billing_records_uq = UNIQUE (customer_id, billing_period)');
SELECT col_is_pk('billguard', 'billing_records', ARRAY['idempotency_key'],
                 'the primary key of billing_records is idempotency_key');

-- The journal and snapshots.
SELECT col_is_pk('billguard', 'journal', ARRAY['persistence_id', 'seq_nr'],
                 'the primary key of journal is (persistence_id, seq_nr)');
SELECT col_is_pk('billguard', 'snapshots', ARRAY['persistence_id', 'seq_nr'],
                 'the primary key of snapshots is (persistence_id, seq_nr)');
SELECT columns_are('billguard', 'journal',
                   ARRAY['persistence_id', 'seq_nr', 'customer_id', 'event_type', 'event',
                         'event_version', 'written_at'],
                   'journal has the documented columns (customer_id for future distribution)');
SELECT col_type_is('billguard', 'journal', 'event', 'jsonb', 'journal.event is jsonb');
SELECT col_type_is('billguard', 'journal', 'seq_nr', 'bigint', 'journal.seq_nr is bigint');
SELECT col_is_pk('billguard', 'accounts', ARRAY['customer_id'], 'the primary key of accounts is customer_id');
SELECT col_type_is('billguard', 'accounts', 'amount_cents', 'bigint', 'accounts.amount_cents is bigint (integer cents)');

-- The status CHECK: each documented value is accepted, anything else refused.
SELECT lives_ok($$INSERT INTO billguard.billing_records
                    (customer_id, billing_period, idempotency_key, status, charge_id,
                     amount_cents, currency, stripe_customer)
                  SELECT 't01_' || s, '2031-01', billguard.idempotency_key('t01_' || s, '2031-01'), s,
                         CASE WHEN s = 'completed' THEN 'ch_t01' END, 100, 'usd', 'cus_t01'
                    FROM unnest(ARRAY['pending', 'dispatching', 'completed', 'failed',
                                      'blocked', 'needs_review', 'unknown', 'cancelled',
                                      'below_minimum']) AS s$$,
                'the nine status values are accepted');
SELECT bag_eq($$SELECT status FROM billguard.billing_records WHERE customer_id LIKE 't01\_%'$$,
              ARRAY['pending', 'dispatching', 'completed', 'failed', 'blocked', 'needs_review', 'unknown',
                    'cancelled', 'below_minimum'],
              'nine records with the nine statuses were written');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, status, amount_cents, currency, stripe_customer)
                   VALUES ('t01_bogus', '2031-01', billguard.idempotency_key('t01_bogus', '2031-01'),
                           'bogus', 100, 'usd', 'cus_t01')$$,
                 '23514', NULL, 'status ''bogus'' is refused by a CHECK (23514)');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, status, amount_cents, currency, stripe_customer)
                   VALUES ('t01_upper', '2031-01', billguard.idempotency_key('t01_upper', '2031-01'),
                           'PENDING', 100, 'usd', 'cus_t01')$$,
                 '23514', NULL, 'status ''PENDING'' (upper case) is refused by a CHECK (23514)');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, status, amount_cents, currency, stripe_customer)
                   VALUES ('t01_in_progress', '2031-01', billguard.idempotency_key('t01_in_progress', '2031-01'),
                           'in_progress', 100, 'usd', 'cus_t01')$$,
                 '23514', NULL, 'status ''in_progress'' (a caller status, not a record status) is refused (23514)');
-- The seed's constraints enforce what they say.
SELECT lives_ok($$INSERT INTO billguard.billing_records
                    (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer)
                  VALUES ('t01_default', '2031-02', billguard.idempotency_key('t01_default', '2031-02'),
                          100, 'usd', 'cus_t01')$$,
                'a record without a status can be inserted');
SELECT is((SELECT status FROM billguard.billing_records WHERE customer_id = 't01_default'),
          'pending', 'a record inserted without a status is pending');
SELECT ok((SELECT created_at = now() FROM billguard.billing_records WHERE customer_id = 't01_default'),
          'a record inserted without created_at gets now()');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer)
                   VALUES ('t01_default', '2031-02', 'ffffffffffffffffffffffffffffffff', 100, 'usd', 'cus_t01')$$,
                 '23505', 'duplicate key value violates unique constraint "billing_records_uq"',
                 'a second record for the same (customer, period) violates billing_records_uq');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer)
                   VALUES ('t01_other', '2031-02', billguard.idempotency_key('t01_default', '2031-02'),
                           100, 'usd', 'cus_t01')$$,
                 '23505', 'duplicate key value violates unique constraint "billing_records_pk"',
                 'a second record with the same key violates billing_records_pk');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, amount_cents, currency, stripe_customer)
                   VALUES (NULL, '2031-02', 'eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee', 100, 'usd', 'cus_t01')$$,
                 '23502', NULL, 'a record without customer_id violates NOT NULL');
SELECT throws_ok($$INSERT INTO billguard.billing_records
                     (customer_id, billing_period, idempotency_key, status, amount_cents, currency, stripe_customer)
                   VALUES ('t01_nocharge', '2031-02', billguard.idempotency_key('t01_nocharge', '2031-02'),
                           'completed', 100, 'usd', 'cus_t01')$$,
                 '23514', NULL, 'a completed record without a charge_id is refused');
SELECT is((SELECT count(*) FROM billguard.billing_records WHERE customer_id LIKE 't01\_%'),
          10::bigint, 'only the ten valid records were written');

-- The tables holding user data are extension configuration tables, so
-- pg_dump dumps their rows. Otherwise a dump/restore silently loses every
-- account, pre-flight claim and event, and the next bill_period claims and
-- charges every customer again.
SELECT ok('billguard.accounts'::regclass = ANY (coalesce((SELECT extconfig FROM pg_extension WHERE extname = 'billguard'), '{}')),
          'accounts is registered with pg_extension_config_dump (its rows survive pg_dump)');
SELECT ok('billguard.billing_records'::regclass = ANY (coalesce((SELECT extconfig FROM pg_extension WHERE extname = 'billguard'), '{}')),
          'billing_records is registered with pg_extension_config_dump (its rows survive pg_dump)');
SELECT ok('billguard.journal'::regclass = ANY (coalesce((SELECT extconfig FROM pg_extension WHERE extname = 'billguard'), '{}')),
          'journal is registered with pg_extension_config_dump (its rows survive pg_dump)');
SELECT ok('billguard.snapshots'::regclass = ANY (coalesce((SELECT extconfig FROM pg_extension WHERE extname = 'billguard'), '{}')),
          'snapshots is registered with pg_extension_config_dump (its rows survive pg_dump)');

-- Nothing is granted to PUBLIC.
SELECT is(has_schema_privilege('public', 'billguard', 'USAGE'), false, 'PUBLIC has no USAGE on schema billguard');
SELECT is(has_schema_privilege('public', 'billguard', 'CREATE'), false, 'PUBLIC has no CREATE on schema billguard');
SELECT is(has_function_privilege('public', 'billguard.bill_period(text)', 'EXECUTE'), false,
          'PUBLIC cannot execute bill_period');
SELECT is(has_function_privilege('public', 'billguard.bill_customer(text, text, text)', 'EXECUTE'), false,
          'PUBLIC cannot execute bill_customer');
SELECT is(has_function_privilege('public', 'billguard.idempotency_key(text, text, text)', 'EXECUTE'), false,
          'PUBLIC cannot execute idempotency_key');
SELECT is(has_function_privilege('public', 'billguard.period_status(text)', 'EXECUTE'), false,
          'PUBLIC cannot execute period_status');
SELECT is(has_function_privilege('public', 'billguard.append_event(text, bigint, text, jsonb)', 'EXECUTE'), false,
          'PUBLIC cannot execute append_event');
SELECT is((SELECT array_agg(p.oid::regprocedure::text ORDER BY 1) FROM pg_proc p
            WHERE p.pronamespace = 'billguard'::regnamespace
              AND has_function_privilege('public', p.oid, 'EXECUTE')),
          NULL, 'PUBLIC can execute no function of schema billguard');
SELECT is(has_table_privilege('public', 'billguard.billing_records', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
          false, 'PUBLIC has no privilege on billing_records');
SELECT is(has_table_privilege('public', 'billguard.journal', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
          false, 'PUBLIC has no privilege on journal');
SELECT is(has_table_privilege('public', 'billguard.accounts', 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER'),
          false, 'PUBLIC has no privilege on accounts');
SELECT is((SELECT array_agg(c.relname::text ORDER BY 1) FROM pg_class c
            WHERE c.relnamespace = 'billguard'::regnamespace AND c.relkind IN ('r', 'v', 'm', 'p', 'S')
              AND has_table_privilege('public', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')),
          NULL, 'PUBLIC has no privilege on any table, view or sequence of schema billguard');

SELECT * FROM finish();
ROLLBACK;
