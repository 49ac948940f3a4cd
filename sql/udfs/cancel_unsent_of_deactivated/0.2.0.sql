-- Deactivating an account withdraws its billings that were never sent.
-- SECURITY DEFINER: whoever maintains accounts need not write billing_records.
CREATE OR REPLACE FUNCTION billguard.cancel_unsent_of_deactivated() RETURNS trigger
  LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
  PERFORM billguard.cancel_unsent(NEW.customer_id, NULL::text, 'account deactivated');
  RETURN NULL;
END $$;
