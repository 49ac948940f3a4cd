-- The highest sequence number ever written for an entity. Snapshots count
-- too, so it never goes back when retention deletes the events they cover.
CREATE OR REPLACE FUNCTION billguard.highest_seq_nr(persistence_id text) RETURNS bigint
  LANGUAGE sql STABLE STRICT PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  RETURN greatest(
    (SELECT max(j.seq_nr) FROM billguard.journal j WHERE j.persistence_id = highest_seq_nr.persistence_id),
    (SELECT max(s.seq_nr) FROM billguard.snapshots s WHERE s.persistence_id = highest_seq_nr.persistence_id),
    0);
