-- Refuses any statement whose deletions reach billing_records while it holds
-- rows, cascades included (extension/history_guard.cpp): the event trigger
-- installs the guard in every session before every DROP, preloaded or not,
-- and with session_replication_role = replica too.
CREATE OR REPLACE FUNCTION billguard.protect_history() RETURNS event_trigger
  LANGUAGE c
  SET search_path = pg_catalog, pg_temp
  AS 'MODULE_PATHNAME', 'billguard_protect_history';
