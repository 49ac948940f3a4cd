-- Secrets and public ids of vault keys (extension/random_text.cpp).
CREATE OR REPLACE FUNCTION billguard.random_base62(length integer) RETURNS text
  LANGUAGE c VOLATILE STRICT
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_random_base62';
