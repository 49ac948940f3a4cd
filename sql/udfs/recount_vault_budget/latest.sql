-- The budget's committed sum once a reservation `held` became `outcome`,
-- as the last write before the commit, and only when the reservation
-- starts or stops being counted: a success settling a reservation was
-- counted when it was reserved, and leaves the budget's row alone. A
-- success after a release
-- (Stripe answering a key it refused before) is still money spent: it is
-- counted again, whatever the cap says.
-- PL/pgSQL, whose plans a session keeps, rather than SQL, whose body is
-- planned again at every call: this runs at every settle.
CREATE OR REPLACE FUNCTION billguard.recount_vault_budget(held billguard.vault_reservations, outcome text)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF (outcome = 'settled' AND held.status = 'released') OR (outcome = 'released' AND held.status = 'reserved') THEN
    UPDATE billguard.vault_budgets b
       SET committed_cents = b.committed_cents
                             + CASE WHEN outcome = 'settled' THEN held.amount_cents ELSE -held.amount_cents END,
           updated_at = now()
     WHERE (b.vendor, b.billing_period, b.currency) = (held.vendor, held.billing_period, held.currency);
  END IF;
END $$;
