-- The latest period after due_period that billing-scheduler's state
-- (scheduler_state) lists as issued once its month had ended, or NULL. The
-- scheduler never goes back behind one: moving bill_day or bill_hour_utc
-- later can take the calendar's due period back a month, to one the
-- scheduler had passed, and so can a clock stepped back (an hour after the
-- scheduler billed 2026-08 on 2026-09-01, the calendar says 2026-07 is due).
-- What counts is the clock when the period was issued (ended_when_issued),
-- not the clock now. A period issued before its month ended (billed in
-- advance, or a mistyped year) does not count until its month has ended by
-- the clock `at`: it keeps no due period from being billed.
CREATE OR REPLACE FUNCTION billguard.issued_after(due_period text, scheduler_state jsonb, at timestamptz)
  RETURNS text
  LANGUAGE sql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN (SELECT max(i.period COLLATE "C")
            FROM jsonb_array_elements_text(coalesce(scheduler_state -> 'issued_periods', '[]'::jsonb))
                   AS i(period)
           WHERE i.period COLLATE "C" > due_period
             AND (coalesce(scheduler_state -> 'ended_when_issued', '[]'::jsonb) ? i.period
                  OR i.period COLLATE "C" < to_char(at AT TIME ZONE 'UTC', 'YYYY-MM')));
