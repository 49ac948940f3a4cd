CREATE OR REPLACE FUNCTION billguard.touch_updated_at() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  NEW.updated_at := now();
  RETURN NEW;
END $$;
