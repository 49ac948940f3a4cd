-- The periods issued whose month has not ended at `at` (UTC): a clock that
-- ran ahead (stepped a month forward, then back) billed them early, and
-- accounts added since were not billed for them; or a person billed them in
-- advance. A bill_day moved later is no such case: the month had ended. A
-- clock stepped back across a month's end after the tick lists the period
-- too, until its month has ended again by that clock: by the clock now it
-- was issued early.
CREATE OR REPLACE FUNCTION billguard.issued_early(issued jsonb, at timestamptz)
  RETURNS text[]
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT coalesce(array_agg(i.period ORDER BY i.period), '{}')
            FROM jsonb_array_elements_text(coalesce(issued, '[]'::jsonb)) AS i(period)
           WHERE i.period COLLATE "C" >= to_char(at AT TIME ZONE 'UTC', 'YYYY-MM'));
