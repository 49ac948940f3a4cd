-- The rule of period_amounts.metadata, within what Stripe accepts of a
-- charge's metadata: an object of string values, keys of 1..40 characters
-- without square brackets (they would break metadata[key] in the form
-- body), values of 1..500 characters (Stripe reads an empty one as "unset
-- the key"), and at most 47 keys besides billguard's own three
-- (billguard_key, billing_period, customer_id, which the charge always
-- carries and which win over a key of the same name), so that the body
-- never holds more than Stripe's 50.
CREATE OR REPLACE FUNCTION billguard.is_stripe_metadata(metadata jsonb) RETURNS boolean
  LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN jsonb_typeof(metadata) = 'object'
     AND (SELECT coalesce(bool_and(char_length(e.key) BETWEEN 1 AND 40
                                   AND e.key !~ '[][[:cntrl:]]'
                                   AND jsonb_typeof(e.value) = 'string'
                                   AND char_length(e.value #>> '{}') BETWEEN 1 AND 500), true)
                 AND count(*) FILTER (WHERE e.key NOT IN ('billguard_key', 'billing_period', 'customer_id')) <= 47
            FROM jsonb_each(metadata) e);
COMMENT ON FUNCTION billguard.is_stripe_metadata(jsonb) IS
  'True for a JSON object Stripe takes as a charge''s metadata beside billguard''s own keys: string values of 1..500 characters, keys of 1..40 without [ or ], at most 47 keys besides billguard_key, billing_period and customer_id.';
