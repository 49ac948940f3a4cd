-- billguard's install script, run by CREATE EXTENSION billguard: built by
-- sql/assemble.pl from sql/install/*.sql in name order, which include each
-- function and view from sql/udfs/ and sql/views/.
\echo Use "CREATE EXTENSION billguard" to load this file. \quit
