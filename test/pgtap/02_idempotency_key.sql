-- 02_idempotency_key.sql: billguard.idempotency_key() is the seed's key,
-- byte for byte, and a pure function of (customer, period, namespace).
--
-- Proves: known test vectors (computed outside PostgreSQL, see below); the
-- default namespace is the billguard.key_namespace setting ('akka-billing');
-- the function is IMMUTABLE, STRICT and PARALLEL SAFE; NULL in -> NULL out;
-- every malformed argument is refused with SQLSTATE 22023 and a message
-- naming that argument; the key does not change with time; the namespace
-- setting refuses ':' and can be changed by superusers only.
--
-- Test vectors: each expected key was computed in a shell, independently of
-- billguard, as the first 32 hex characters of SHA-256 of the UTF-8 bytes
-- "<customer_id>:<billing_period>:<namespace>":
--   printf '%s' 'cust_123:2026-08:akka-billing' | sha256sum | cut -c1-32
--     -> 0f3fe6c7ee131571ac54c216d9553542   (the example of the public contract)
--   printf '%s' 'cust_456:2026-09:akka-billing' | sha256sum | cut -c1-32
--     -> dcbc621235ef1fb27999f191e826e070
--   printf '%s' 'kunde_müller_€:2026-08:akka-billing' | sha256sum | cut -c1-32
--     -> 367a7ab8ea973d526f05c19d4e3ba1e5   (UTF-8 customer id, 14 chars / 17 bytes)
--   L=$(printf 'x%.0s' $(seq 255)); printf '%s' "$L:2026-08:akka-billing" | sha256sum | cut -c1-32
--     -> 3ec0396d30e3d3c9f53dd42c90ab7500   (255-byte customer id, the maximum)
--   E=$(python3 -c "print('€'*85, end='')"); printf '%s' "$E:2026-08:akka-billing" | sha256sum | cut -c1-32
--     -> ee1b1f9760d11d6c820c68b29a4370e3   (85 x '€' = 255 bytes)
--   printf '%s' 'cust_123:2026-08:other-ns' | sha256sum | cut -c1-32
--     -> a9937d13d8dac69afbf7a570a56bd1c1   (another namespace)
--   printf '%s' 'cust_123:2026-08:billguard-test_ns.v2' | sha256sum | cut -c1-32
--     -> 81f048a4aa0ed2ba6d107ff95a403a45   (another namespace)
--   printf '%s' 'cust_123:2026-12:akka-billing' | sha256sum | cut -c1-32
--     -> 820bddd0a0db8bbfaf6e1f67e779ff21
--   printf '%s' 'cust_123:1970-01:akka-billing' | sha256sum | cut -c1-32
--     -> d6f016606908cb7dabf78cd320fcb1ae   (the first valid period)
--   printf '%s' 'cust_123:9999-12:akka-billing' | sha256sum | cut -c1-32
--     -> b58c60cc12d70013b76f0ce54b7ee456   (the last valid period)
BEGIN;
SELECT plan(49);

-- Test vectors.
SELECT is(billguard.idempotency_key('cust_123', '2026-08', 'akka-billing'),
          '0f3fe6c7ee131571ac54c216d9553542', 'vector: DESIGN example cust_123 / 2026-08 / akka-billing');
SELECT is(billguard.idempotency_key('cust_456', '2026-09', 'akka-billing'),
          'dcbc621235ef1fb27999f191e826e070', 'vector: cust_456 / 2026-09');
SELECT is(billguard.idempotency_key('kunde_müller_€', '2026-08', 'akka-billing'),
          '367a7ab8ea973d526f05c19d4e3ba1e5', 'vector: UTF-8 customer id kunde_müller_€ (hashes bytes)');
SELECT is(billguard.idempotency_key(repeat('x', 255), '2026-08', 'akka-billing'),
          '3ec0396d30e3d3c9f53dd42c90ab7500', 'vector: 255-byte customer id');
SELECT is(billguard.idempotency_key(repeat('€', 85), '2026-08', 'akka-billing'),
          'ee1b1f9760d11d6c820c68b29a4370e3', 'vector: 85 x € = 255 bytes is accepted');
SELECT is(billguard.idempotency_key('cust_123', '2026-08', 'other-ns'),
          'a9937d13d8dac69afbf7a570a56bd1c1', 'vector: another namespace (other-ns)');
SELECT is(billguard.idempotency_key('cust_123', '2026-08', 'billguard-test_ns.v2'),
          '81f048a4aa0ed2ba6d107ff95a403a45', 'vector: another namespace (billguard-test_ns.v2)');
SELECT is(billguard.idempotency_key('cust_123', '2026-12', 'akka-billing'),
          '820bddd0a0db8bbfaf6e1f67e779ff21', 'vector: month 12');
SELECT is(billguard.idempotency_key('cust_123', '1970-01', 'akka-billing'),
          'd6f016606908cb7dabf78cd320fcb1ae', 'vector: first valid period 1970-01');
SELECT is(billguard.idempotency_key('cust_123', '9999-12', 'akka-billing'),
          'b58c60cc12d70013b76f0ce54b7ee456', 'vector: last valid period 9999-12');
SELECT matches(billguard.idempotency_key('cust_123', '2026-08'), '^[0-9a-f]{32}$',
               'a key is exactly 32 lower-case hex characters');

-- The default namespace is the billguard.key_namespace setting.
SELECT is(current_setting('billguard.key_namespace'), 'akka-billing',
          'billguard.key_namespace defaults to akka-billing');
SELECT is(billguard.key_namespace(), current_setting('billguard.key_namespace'),
          'key_namespace() returns the setting');
SELECT is(billguard.idempotency_key('cust_123', '2026-08'),
          billguard.idempotency_key('cust_123', '2026-08', current_setting('billguard.key_namespace')),
          'the default namespace is current_setting(''billguard.key_namespace'')');
SELECT is(billguard.idempotency_key('cust_123', '2026-08'), '0f3fe6c7ee131571ac54c216d9553542',
          'with the default namespace the DESIGN example holds');
SET LOCAL billguard.key_namespace = 'other-ns';
SELECT is(billguard.idempotency_key('cust_123', '2026-08'), 'a9937d13d8dac69afbf7a570a56bd1c1',
          'the default follows the setting (superuser SET LOCAL billguard.key_namespace = other-ns)');
RESET billguard.key_namespace;
SELECT is(billguard.idempotency_key('cust_123', '2026-08'), '0f3fe6c7ee131571ac54c216d9553542',
          'after RESET the default namespace is akka-billing again');

-- Catalog properties.
SELECT is((SELECT provolatile FROM pg_proc WHERE oid = 'billguard.idempotency_key(text, text, text)'::regprocedure),
          'i'::"char", 'idempotency_key is IMMUTABLE');
SELECT is((SELECT proisstrict FROM pg_proc WHERE oid = 'billguard.idempotency_key(text, text, text)'::regprocedure),
          true, 'idempotency_key is STRICT');
SELECT is((SELECT proparallel FROM pg_proc WHERE oid = 'billguard.idempotency_key(text, text, text)'::regprocedure),
          's'::"char", 'idempotency_key is PARALLEL SAFE');
SELECT is((SELECT prorettype::regtype::text FROM pg_proc WHERE oid = 'billguard.idempotency_key(text, text, text)'::regprocedure),
          'text', 'idempotency_key returns text');
SELECT is((SELECT pronargdefaults FROM pg_proc WHERE oid = 'billguard.idempotency_key(text, text, text)'::regprocedure),
          1::smallint, 'only the namespace argument has a default');

-- NULL in, NULL out.
SELECT is(billguard.idempotency_key(NULL, '2026-08'), NULL, 'NULL customer_id gives NULL');
SELECT is(billguard.idempotency_key('cust_123', NULL), NULL, 'NULL billing_period gives NULL');
SELECT is(billguard.idempotency_key('cust_123', '2026-08', NULL), NULL, 'NULL namespace gives NULL');

-- Malformed arguments: 22023 with a message naming the argument.
SELECT throws_ok($$SELECT billguard.idempotency_key('', '2026-08')$$, '22023',
                 'customer_id must not be empty', 'empty customer_id is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key(repeat('x', 256), '2026-08')$$, '22023',
                 'customer_id must be at most 255 bytes, got 256', '256-byte customer_id is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key(repeat('€', 86), '2026-08')$$, '22023',
                 'customer_id must be at most 255 bytes, got 258', '86 x € (86 chars, 258 bytes) is refused: the limit is in bytes');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-13')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period 2026-13 is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-00')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period 2026-00 is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-8')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period 2026-8 is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', ' 2026-08')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period '' 2026-08'' is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-08 ')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period ''2026-08 '' is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'empty period is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026/08')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period 2026/08 is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '1969-12')$$, '22023',
                 'billing_period must be YYYY-MM with a month 01..12 (e.g. 2026-08)', 'period 1969-12 (before 1970) is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-08', '')$$, '22023',
                 'namespace must not be empty', 'empty namespace is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-08', 'akka:billing')$$, '22023',
                 'namespace must not contain '':''', 'namespace containing '':'' is refused');
SELECT throws_ok($$SELECT billguard.idempotency_key('cust_123', '2026-08', repeat('n', 256))$$, '22023',
                 'namespace must be at most 255 bytes', '256-byte namespace is refused');

-- The key never changes with time: two statements, a sleep between them.
CREATE TEMP TABLE t02_keys (n int PRIMARY KEY, key text, computed_at timestamptz);
INSERT INTO t02_keys VALUES (1, billguard.idempotency_key('cust_123', '2026-08'), clock_timestamp());
DO $$BEGIN PERFORM pg_sleep(0.01); END$$;
INSERT INTO t02_keys VALUES (2, billguard.idempotency_key('cust_123', '2026-08'), clock_timestamp());
SELECT ok((SELECT b.computed_at > a.computed_at FROM t02_keys a, t02_keys b WHERE a.n = 1 AND b.n = 2),
          'the two computations happened at different times');
SELECT is((SELECT key FROM t02_keys WHERE n = 2), (SELECT key FROM t02_keys WHERE n = 1),
          'the key computed later equals the key computed earlier');
SELECT is((SELECT key FROM t02_keys WHERE n = 2), '0f3fe6c7ee131571ac54c216d9553542',
          'and both equal the test vector');

-- The namespace setting refuses ':' and empty values.
SELECT throws_ok($$SET billguard.key_namespace = 'akka:billing'$$, '22023',
                 'invalid value for parameter "billguard.key_namespace": "akka:billing"',
                 'SET billguard.key_namespace to a value containing '':'' is refused');
SELECT throws_ok($$SET billguard.key_namespace = ''$$, '22023',
                 'invalid value for parameter "billguard.key_namespace": ""',
                 'SET billguard.key_namespace to an empty value is refused');
SELECT is(current_setting('billguard.key_namespace'), 'akka-billing',
          'the refused values left the setting unchanged');

-- Only superusers may change the namespace (PGC_SUSET).
CREATE ROLE t02_not_superuser NOSUPERUSER;
SET LOCAL ROLE t02_not_superuser;
SELECT throws_ok($$SET billguard.key_namespace = 'attacker-ns'$$, '42501',
                 'permission denied to set parameter "billguard.key_namespace"',
                 'a non-superuser cannot SET billguard.key_namespace');
SELECT throws_ok($$SELECT set_config('billguard.key_namespace', 'attacker-ns', true)$$, '42501',
                 'permission denied to set parameter "billguard.key_namespace"',
                 'a non-superuser cannot set_config(billguard.key_namespace)');
SELECT is(current_setting('billguard.key_namespace'), 'akka-billing',
          'the setting is unchanged after the refused attempts');
RESET ROLE;
SELECT is(current_user::text, session_user::text, 'RESET ROLE returned to the session user');

SELECT * FROM finish();
ROLLBACK;
