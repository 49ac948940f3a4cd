-- One answer to a search for the record's charge (see record_answers):
-- charge_id the object found, with its amount, currency and Stripe customer.
CREATE OR REPLACE FUNCTION billguard.record_search_result(
    key text, attempt integer, outcome text, http_status integer, charge_id text,
    request_id text, message text, found_amount bigint DEFAULT NULL,
    found_currency text DEFAULT NULL, found_customer text DEFAULT NULL)
  RETURNS text
  LANGUAGE sql
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT a.recorded FROM billguard.record_answers(jsonb_build_array(jsonb_build_object(
            'key', key, 'attempt', attempt, 'search', true, 'outcome', outcome,
            'http_status', http_status, 'charge_id', charge_id, 'request_id', request_id,
            'message', message,
            'found', CASE WHEN charge_id IS NULL THEN '[]'::jsonb
                          ELSE jsonb_build_array(jsonb_build_object(
                                 'id', charge_id, 'amount', found_amount, 'currency', found_currency,
                                 'customer', found_customer)) END)),
          NULL::interval) a);
