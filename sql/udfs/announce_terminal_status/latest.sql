-- Remembers the record's wake-up slot; the transaction's COMMIT wakes the
-- callers waiting on it. A C function, fired only on a move to a terminal
-- status, so the dispatcher's claims and retries never call it. BEFORE, not
-- AFTER: it shares the old row that billing_records_frozen_identity has
-- fetched already, where an AFTER trigger would fetch it again for every
-- update of the dispatcher's, and queue an event for each move it announces.
-- Triggers fire in name order, so it comes after that check; what it arms
-- happens only at COMMIT, and a row that is not written after all only
-- makes waiters read again. The WHEN clause spells out is_terminal_status():
-- a function with SET search_path is never inlined, and this clause is
-- evaluated for every update of the dispatcher's.
CREATE OR REPLACE FUNCTION billguard.announce_terminal_status() RETURNS trigger
  LANGUAGE c
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_announce_terminal_status';
