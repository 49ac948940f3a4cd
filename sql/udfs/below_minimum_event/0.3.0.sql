-- The BillingBelowMinimum event of a record claimed with an amount that is
-- never sent: the amount, and the minimum it is under.
CREATE OR REPLACE FUNCTION billguard.below_minimum_event(amount_cents bigint, currency text)
  RETURNS jsonb
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN jsonb_build_object('amount_cents', amount_cents, 'currency', currency,
                            'min_charge_units', (SELECT c.min_charge_units FROM billguard.currencies c
                                                  WHERE c.code = below_minimum_event.currency));
