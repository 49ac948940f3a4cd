-- CREATE EXTENSION billguard installs into schema billguard, which it
-- creates when it does not exist. One that exists already must be as good
-- as one it creates: owned by a superuser, empty, and with CREATE for
-- superusers only. A schema the database owner made beforehand would let
-- that role drop billguard's tables, or add a function that one of
-- billguard's calls resolves to (a better match for its argument types),
-- which the dispatcher would then run as a superuser. pg_restore creates the
-- schema as the restoring superuser just before CREATE EXTENSION: accepted.
-- Every call billguard makes also passes its target's exact argument types,
-- so no overload can match better (test/lib/overload_traps.sql proves it).
DO $guard$
DECLARE
  schema_oid   oid := 'billguard'::regnamespace;
  owner        oid := (SELECT n.nspowner FROM pg_catalog.pg_namespace n WHERE n.oid = schema_oid);
  holds        bigint;
  may_create   text;
BEGIN
  IF NOT (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = owner) THEN
    RAISE EXCEPTION 'schema billguard exists already and is owned by %, who is not a superuser',
                    owner::regrole
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'CREATE EXTENSION billguard installs only into a schema it creates, or an empty one a superuser owns: the owner of a schema can drop what it holds.',
            HINT = 'Look at what the schema holds, drop it, then CREATE EXTENSION billguard again.';
  END IF;
  -- Everything in a schema depends on it, and so does the extension being
  -- created (it names the schema), which is not counted.
  SELECT count(*) INTO holds FROM pg_catalog.pg_depend d
   WHERE d.refclassid = 'pg_catalog.pg_namespace'::regclass AND d.refobjid = schema_oid
     AND NOT (d.classid = 'pg_catalog.pg_extension'::regclass
              AND d.objid = (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname = 'billguard'));
  holds := holds + (SELECT count(*) FROM pg_catalog.pg_default_acl a WHERE a.defaclnamespace = schema_oid);
  IF holds > 0 THEN
    RAISE EXCEPTION 'schema billguard exists already and is not empty: it holds % objects', holds
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'CREATE EXTENSION billguard installs only into a schema it creates, or an empty one a superuser owns: a function waiting there could be called in place of billguard''s.',
            HINT = 'Look at what the schema holds, drop it, then CREATE EXTENSION billguard again.';
  END IF;
  SELECT string_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END, ', ')
    INTO may_create
    FROM pg_catalog.pg_namespace n, LATERAL pg_catalog.aclexplode(n.nspacl) a
   WHERE n.oid = schema_oid AND a.privilege_type = 'CREATE'
     AND NOT coalesce((SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = a.grantee), false);
  IF may_create IS NOT NULL THEN
    RAISE EXCEPTION 'schema billguard exists already and grants CREATE to %', may_create
      USING ERRCODE = 'insufficient_privilege',
            DETAIL = 'A role that can create functions in schema billguard could have one of them called in place of billguard''s.',
            HINT = 'REVOKE CREATE ON SCHEMA billguard FROM those roles, then CREATE EXTENSION billguard again.';
  END IF;
END $guard$;
