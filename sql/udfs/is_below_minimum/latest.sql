-- Whether an amount is not sent to Stripe: zero, or under Stripe's minimum
-- charge for its currency (currencies.min_charge_units; none known, only
-- zero is). claim_period writes the same rule out as a join.
CREATE OR REPLACE FUNCTION billguard.is_below_minimum(amount_cents bigint, currency text)
  RETURNS boolean
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN amount_cents = 0
      OR coalesce(amount_cents < (SELECT c.min_charge_units FROM billguard.currencies c
                                   WHERE c.code = is_below_minimum.currency), false);
