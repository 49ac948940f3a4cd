-- One line for billing_records.last_error, e.g.
-- "402 card_error/card_declined: Your card was declined."
CREATE OR REPLACE FUNCTION billguard.error_text(detail jsonb) RETURNS text
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN concat_ws(' ', detail ->> 'http_status',
                   nullif(concat_ws('/', detail ->> 'type', detail ->> 'code'), '') || ':',
                   detail ->> 'message');
