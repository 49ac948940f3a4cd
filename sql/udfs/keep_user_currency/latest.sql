-- pg_dump carries the currencies users added and the built-in ones they
-- changed, which stop being built-in here. pg_restore runs CREATE EXTENSION
-- first: a dumped row for a built-in code then replaces the built-in values
-- instead of colliding with them (and taking every other dumped row down).
CREATE OR REPLACE FUNCTION billguard.keep_user_currency() RETURNS trigger
  LANGUAGE plpgsql
  SET search_path = pg_catalog, pg_temp
  AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    UPDATE billguard.currencies c
       SET minor_units = NEW.minor_units, min_charge_units = NEW.min_charge_units
     WHERE c.code = NEW.code AND c.builtin;
    IF FOUND THEN
      RETURN NULL;
    END IF;
    NEW.builtin := false;
  ELSE
    NEW.builtin := OLD.builtin AND NEW.code = OLD.code AND NEW.minor_units = OLD.minor_units
                   AND NEW.min_charge_units IS NOT DISTINCT FROM OLD.min_charge_units;
  END IF;
  RETURN NEW;
END $$;
