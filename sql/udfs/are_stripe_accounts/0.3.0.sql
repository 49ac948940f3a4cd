-- Connected accounts a budget may spend on: 0..100 distinct Stripe
-- account ids (acct_ and letters or digits), in order.
CREATE OR REPLACE FUNCTION billguard.are_stripe_accounts(accounts text[]) RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN coalesce(cardinality(accounts) <= 100
                  AND array_position(accounts, NULL) IS NULL
                  AND (cardinality(accounts) = 0
                       OR array_to_string(accounts, ' ') ~ '^acct_[A-Za-z0-9]{1,250}( acct_[A-Za-z0-9]{1,250})*$')
                  AND accounts = ARRAY(SELECT DISTINCT a COLLATE "C" FROM unnest(accounts) a ORDER BY 1), false);
