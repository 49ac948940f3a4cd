-- Every object of the billguard extension and every object that depends on
-- one (indexes, constraints, triggers, row and array types, TOAST tables,
-- defaults, rules): OID and name, one per line, for compare.pl.
WITH RECURSIVE member(classid, objid) AS (
  SELECT 'pg_extension'::regclass, oid FROM pg_extension WHERE extname = 'billguard'
  UNION
  SELECT d.classid, d.objid
  FROM pg_depend d
  JOIN member m ON d.refclassid = m.classid AND d.refobjid = m.objid
)
SELECT m.objid,
       coalesce(p.proname, c.relname, t.typname, co.conname, tg.tgname, e.evtname,
                n.nspname, r.rulename, i.name, '')
FROM member m
CROSS JOIN LATERAL pg_identify_object(m.classid, m.objid, 0) i
LEFT JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
LEFT JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
LEFT JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
LEFT JOIN pg_constraint co ON m.classid = 'pg_constraint'::regclass AND co.oid = m.objid
LEFT JOIN pg_trigger tg ON m.classid = 'pg_trigger'::regclass AND tg.oid = m.objid
LEFT JOIN pg_event_trigger e ON m.classid = 'pg_event_trigger'::regclass AND e.oid = m.objid
LEFT JOIN pg_namespace n ON m.classid = 'pg_namespace'::regclass AND n.oid = m.objid
LEFT JOIN pg_rewrite r ON m.classid = 'pg_rewrite'::regclass AND r.oid = m.objid
ORDER BY 1;
