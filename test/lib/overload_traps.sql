-- Plants, beside every function of billguard, the overloads a call would
-- resolve to if its arguments did not match the function's parameter types
-- exactly: for each parameter, one overload with that parameter's type
-- replaced by one an argument could have and that PostgreSQL casts
-- implicitly (an integer literal for a double precision, a varchar for a
-- text, ...). A role that could create functions in schema billguard would
-- plant such a function and have it run as whoever called billguard's (the
-- dispatcher runs as a superuser). Called from a function of billguard, a
-- trap raises 'billguard overload trap: <signature> called by <caller>';
-- called otherwise (a test calling billguard's API with a literal) it hands
-- the call on to the function it shadows, so only billguard's own calls are
-- tested. Run as a superuser; the traps are not members of the extension.
DO $plant$
DECLARE
  f record;
  position integer;
  substitute regtype;
  argument_types regtype[];
  signature text;
  target text;
  forward text;
BEGIN
  FOR f IN
    SELECT p.oid, p.proname, p.proargtypes::regtype[] AS types, p.proretset,
           p.prorettype = 'void'::regtype AS returns_void, pg_get_function_result(p.oid) AS result
      FROM pg_proc p
      JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
     WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard')
       AND p.pronargs > 0 AND p.prokind = 'f'
  LOOP
    -- billguard.f($1::t1, ...): the call the trap hands on.
    target := format('billguard.%I(%s)', f.proname,
                     (SELECT string_agg(format('$%s::%s', n, t), ', ' ORDER BY n)
                        FROM unnest(f.types) WITH ORDINALITY AS a (t, n)));
    forward := CASE
      WHEN f.proretset THEN format('RETURN QUERY EXECUTE %L USING %s;', 'SELECT * FROM ' || target, '%s')
      WHEN f.returns_void THEN format('EXECUTE %L USING %s; RETURN;', 'SELECT ' || target, '%s')
      ELSE format('DECLARE_RESULT EXECUTE %L INTO result USING %s; RETURN result;', 'SELECT ' || target, '%s')
    END;
    forward := format(replace(forward, 'DECLARE_RESULT ', ''),
                      (SELECT string_agg('$' || n, ', ' ORDER BY n)
                         FROM generate_series(1, cardinality(f.types)) AS n));
    FOR position IN 1 .. cardinality(f.types) LOOP
      FOR substitute IN
        SELECT s.narrower::regtype FROM (VALUES
          ('bigint', 'integer'), ('bigint', 'smallint'), ('integer', 'smallint'),
          ('numeric', 'integer'), ('numeric', 'bigint'),
          ('double precision', 'integer'), ('double precision', 'bigint'),
          ('double precision', 'numeric'), ('double precision', 'real'),
          ('text', 'character varying'), ('text', 'name'), ('text', 'character'),
          ('timestamp with time zone', 'timestamp without time zone'),
          ('timestamp with time zone', 'date'),
          ('jsonb', 'json')) AS s (wider, narrower)
         WHERE s.wider::regtype = f.types[position]
      LOOP
        argument_types := f.types;
        argument_types[position] := substitute;
        signature := format('billguard.%I(%s)', f.proname, array_to_string(argument_types, ', '));
        CONTINUE WHEN to_regprocedure(signature) IS NOT NULL;
        EXECUTE format($create$
          CREATE FUNCTION %s RETURNS %s LANGUAGE plpgsql AS $trap$
          DECLARE
            stack text;
            caller text;
            %s
          BEGIN
            GET DIAGNOSTICS stack = PG_CONTEXT;
            -- The first frame below the trap's own that is a function.
            SELECT l.frame INTO caller
              FROM unnest(string_to_array(stack, E'\n')) WITH ORDINALITY AS l (frame, n)
             WHERE l.n > 1 AND l.frame ~ '^(PL/pgSQL function |SQL function ")'
             ORDER BY l.n LIMIT 1;
            IF caller ~ '^PL/pgSQL function billguard\.'
               OR substring(caller FROM '^SQL function "([a-z_0-9]+)"') IN (
                    SELECT p.proname FROM pg_proc p
                      JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                                      AND d.deptype = 'e'
                     WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'billguard'))
            THEN
              RAISE EXCEPTION 'billguard overload trap: %s called by %%', caller;
            END IF;
            %s
          END $trap$ $create$,
          signature, f.result,
          CASE WHEN NOT f.proretset AND NOT f.returns_void THEN format('result %s;', f.result) ELSE '' END,
          signature, forward);
      END LOOP;
    END LOOP;
  END LOOP;
END $plant$;
