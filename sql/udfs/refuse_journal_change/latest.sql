-- Only the retention function may delete events, and nothing may change
-- them. apply_retention is SECURITY DEFINER, so its DELETE runs as the
-- journal's owner, a role nobody but a superuser can become: that is the
-- guard, since any session can set any setting. The transaction-local
-- setting it raises keeps the owner's own stray DELETE out too.
CREATE OR REPLACE FUNCTION billguard.refuse_journal_change() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'DELETE' AND current_setting('billguard_internal.retention', true) = 'on'
     AND current_user = (SELECT pg_get_userbyid(c.relowner) FROM pg_class c WHERE c.oid = TG_RELID) THEN
    RETURN NULL;
  END IF;
  RAISE EXCEPTION 'billguard.journal is append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege',
          HINT = 'Old events are removed only by billguard.apply_retention().';
END $$;
