-- Nothing is granted to PUBLIC. Application roles get EXECUTE on the
-- functions they call (see README, "Privileges"); the SECURITY DEFINER
-- functions do the table access.
REVOKE ALL ON ALL TABLES IN SCHEMA billguard FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA billguard FROM PUBLIC;
REVOKE ALL ON SCHEMA billguard FROM PUBLIC;
