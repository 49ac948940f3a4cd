CREATE OR REPLACE FUNCTION billguard.refuse_vault_audit_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  RAISE EXCEPTION 'billguard.vault_audit is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
