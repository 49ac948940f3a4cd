-- The due periods never issued, oldest first: every period from the first
-- one issued (or, with none, due_period) up to due_period, the most recent
-- one due; none when the first one issued is later than due_period (the
-- calendar went back behind it, see issued_after()).
CREATE OR REPLACE FUNCTION billguard.never_issued(due_period text, issued jsonb)
  RETURNS text[]
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(to_char(m, 'YYYY-MM') ORDER BY m), '{}')
            FROM generate_series(
                   to_date(coalesce((SELECT min(i.p) FROM jsonb_array_elements_text(issued) AS i(p)),
                                    due_period),
                           'YYYY-MM'),
                   to_date(due_period, 'YYYY-MM'), interval '1 month') AS m
           WHERE NOT issued ? to_char(m, 'YYYY-MM'));
