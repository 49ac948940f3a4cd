-- Why this database does not bill its history, or NULL when it does.
CREATE OR REPLACE FUNCTION billguard.billing_database_problem() RETURNS text
  LANGUAGE plpgsql STABLE PARALLEL SAFE
  SET search_path = pg_catalog, pg_temp
  AS $$
DECLARE
  me     billguard.installation;
  others text;
  why    text;
BEGIN
  SELECT * INTO me FROM billguard.installation;
  IF NOT FOUND THEN
    why := 'billguard.installation, which names the database that installed billguard here, is empty';
  ELSIF me.database_oid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database()) THEN
    why := format('this database is a copy of database %s (CREATE DATABASE ... TEMPLATE, or a copy '
                  'of its files), which bills this history', quote_ident(me.database_name));
  ELSIF me.created_by_restore AND me.adopted_at IS NULL THEN
    why := 'this database was restored from a dump (its CREATE EXTENSION billguard ran in a '
           'restore), and the database it was dumped from bills this history';
  ELSE
    SELECT string_agg(DISTINCT quote_ident(b.database_name), ', ') INTO others
      FROM billguard.billing_installations b
     WHERE b.installation_id <> me.installation_id
       AND b.installation_id <> ALL (coalesce(me.adopted_installations, '{}'));
    IF others IS NOT NULL THEN
      why := format('this database''s billing history came from database %s (a dump restored '
                    'here), which bills it', others);
    END IF;
  END IF;
  IF why IS NULL THEN
    RETURN NULL;
  END IF;
  RETURN why || ': it sends nothing and bills no period until an operator adopts it as the '
             || 'billing database (SELECT billguard.adopt_database())';
END $$;
