-- Spend against cap per budget. settled + reserved = committed in every
-- snapshot, as each decision changes a reservation and the committed sum
-- in one transaction.
CREATE OR REPLACE VIEW billguard.vault_spend AS
  SELECT b.vendor, b.billing_period, b.currency, b.cap_cents,
         b.committed_cents - r.reserved_cents AS settled_cents, r.reserved_cents,
         b.cap_cents - b.committed_cents AS remaining_cents,
         (SELECT count(*) FROM billguard.vault_keys k
           WHERE (k.vendor, k.billing_period, k.currency) = (b.vendor, b.billing_period, b.currency)
             AND k.revoked_at IS NULL AND k.expires_at > now()) AS usable_keys,
         b.committed_cents
    FROM billguard.vault_budgets b,
         LATERAL (SELECT coalesce(sum(v.amount_cents), 0)::bigint AS reserved_cents
                    FROM billguard.vault_reservations v
                   WHERE (v.vendor, v.billing_period, v.currency) = (b.vendor, b.billing_period, b.currency)
                     AND v.status = 'reserved') r;
