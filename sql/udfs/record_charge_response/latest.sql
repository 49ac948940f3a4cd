-- One answer to a charge (see record_answers).
CREATE OR REPLACE FUNCTION billguard.record_charge_response(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    replayed boolean, request_id text, error_type text, error_code text, decline_code text,
    message text, body_excerpt text, settle_delay interval)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', false, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'replayed', replayed,
            'request_id', request_id, 'error_type', error_type, 'error_code', error_code,
            'decline_code', decline_code, 'message', message, 'body_excerpt', body_excerpt)),
          settle_delay) a);
