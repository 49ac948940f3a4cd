-- Exponential backoff with jitter: 0.5 s doubling, as Stripe's clients
-- start, up to cap_seconds (15 minutes), scaled by a random factor in
-- [0.5, 1). With the default 20 attempts an indeterminate outcome is retried
-- for one to two and a half hours before it needs review, so a Stripe
-- outage of minutes costs nothing but time.
CREATE OR REPLACE FUNCTION billguard.retry_delay(attempt integer, cap_seconds double precision DEFAULT 900)
  RETURNS interval
  LANGUAGE plpgsql VOLATILE
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  RETURN make_interval(secs => least(0.5 * power(2, least(greatest(attempt - 1, 0), 30)), cap_seconds)
                               * (0.5 + random() / 2));
END $$;
