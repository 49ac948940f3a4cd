-- A snapshot's state of an older state_version in the current shape, one
-- step per version:
--   1 -> 2  the scheduler entity's last_issued_period is the greatest of its
--           issued_periods, last_issued_at unknown, ended_when_issued empty
--           (0.1.0 did not record it: those periods count by the clock now).
--           A state without issued_periods (a malformed or hand-made
--           snapshot) gets none: billing_records, not the state, keeps those
--           periods from being billed twice.
CREATE OR REPLACE FUNCTION billguard.upcast_state(state jsonb, state_version integer) RETURNS jsonb
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN CASE
    WHEN state_version >= 2 OR state ->> 'entity' IS DISTINCT FROM 'billing-scheduler' THEN state
    ELSE state || jsonb_build_object(
      'issued_periods', coalesce(state -> 'issued_periods', '[]'::jsonb),
      'last_issued_period',
        (SELECT max(p.period) FROM jsonb_array_elements_text(
           coalesce(state -> 'issued_periods', '[]'::jsonb)) AS p(period)),
      'last_issued_at', NULL,
      'ended_when_issued', '[]'::jsonb)
  END;
