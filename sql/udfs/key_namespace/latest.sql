CREATE FUNCTION billguard.key_namespace() RETURNS text
  LANGUAGE c STABLE PARALLEL SAFE
  AS 'MODULE_PATHNAME', 'billguard_key_namespace';
COMMENT ON FUNCTION billguard.key_namespace() IS
  'The current billguard.key_namespace setting: the default namespace of idempotency_key().';
