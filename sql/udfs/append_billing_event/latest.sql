-- Appends an event to a billing entity. Callers hold the record's row lock,
-- which serialises all writers of that entity, so max + 1 cannot race.
CREATE OR REPLACE FUNCTION billguard.append_billing_event(customer_id text, billing_period text,
                                               event_type text, event jsonb)
  RETURNS void
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  entity text := 'billing-' || customer_id || '-' || billing_period;
BEGIN
  INSERT INTO billguard.journal AS j (persistence_id, seq_nr, customer_id, event_type, event)
  VALUES (entity,
          coalesce((SELECT max(h.seq_nr) FROM billguard.journal h WHERE h.persistence_id = entity), 0) + 1,
          append_billing_event.customer_id, append_billing_event.event_type, append_billing_event.event);
END $$;
