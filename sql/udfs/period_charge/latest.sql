-- What a claim of (customer, period) charges now, for bill_customer and
-- reclaim_record: the period amount when there is one, else the account's
-- fixed amount (none for a usage-only account: no row), and the status the
-- record takes. The caller holds the locks that make this read final (see
-- refuse_frozen_period_amount()).
CREATE OR REPLACE FUNCTION billguard.period_charge(account billguard.accounts, billing_period text)
  RETURNS TABLE (amount_cents bigint, currency text, description text, metadata jsonb, status text)
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  BEGIN ATOMIC
    SELECT m.amount_cents, m.currency, m.description, m.metadata,
           CASE WHEN billguard.is_below_minimum(m.amount_cents, m.currency) THEN 'below_minimum'
                ELSE 'pending' END
      FROM (SELECT 1 AS preference, p.amount_cents, p.currency, p.description, p.metadata
              FROM billguard.period_amounts p
             WHERE p.customer_id = (period_charge.account).customer_id
               AND p.billing_period = period_charge.billing_period
            UNION ALL
            SELECT 2, (period_charge.account).amount_cents, (period_charge.account).currency,
                   NULL::text, NULL::jsonb
             WHERE (period_charge.account).amount_cents IS NOT NULL
            ORDER BY preference
            LIMIT 1) m;
  END;
