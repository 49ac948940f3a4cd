CREATE OR REPLACE FUNCTION billguard.initial_state(persistence_id text) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN persistence_id = 'billing-scheduler'
      THEN jsonb_build_object('entity', 'billing-scheduler', 'issued_periods', '[]'::jsonb,
                              'last_issued_period', NULL, 'last_issued_at', NULL,
                              'ended_when_issued', '[]'::jsonb)
    WHEN persistence_id LIKE 'billing-%'
      THEN jsonb_build_object('entity', 'billing', 'status', 'new', 'attempts', 0)
    ELSE jsonb_build_object('entity', 'unknown')
  END;
