-- The reservations whose attempts are in doubt and whose last attempt was
-- forwarded more than quiet_for ago: no attempt of them is still on its
-- way, and the proxy looks each up at Stripe by itself, so that no
-- unknown outcome holds a budget's room, or waits for its key to come
-- back, for ever. The oldest first. stripe_account: the connected account
-- the request acted on (looked up there), NULL for the platform's.
CREATE OR REPLACE FUNCTION billguard.vault_reservations_in_doubt(quiet_for interval, max_rows integer)
  RETURNS TABLE (key_id text, idempotency_key text, endpoint text, customer text, search_key text,
                 attempts integer, reserved_at double precision, last_forwarded_at double precision,
                 stripe_account text)
  LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT r.key_id, r.idempotency_key, r.endpoint, r.customer, r.search_key, r.attempts,
           extract(epoch FROM r.reserved_at)::double precision,
           extract(epoch FROM coalesce(r.last_forwarded_at, r.reserved_at))::double precision,
           nullif(r.stripe_account, '')
      FROM billguard.vault_reservations r
     WHERE r.status = 'reserved' AND r.attempts_in_doubt <> '{}'
       AND coalesce(r.last_forwarded_at, r.reserved_at) < now() - vault_reservations_in_doubt.quiet_for
     ORDER BY coalesce(r.last_forwarded_at, r.reserved_at)
     LIMIT greatest(vault_reservations_in_doubt.max_rows, 0);
  END;
COMMENT ON FUNCTION billguard.vault_reservations_in_doubt(interval, integer) IS
  'Reserved requests with attempts in doubt and no attempt for quiet_for, oldest first: for the proxy''s reconciler.';
