-- billguard install script, assembled from sql/install/*.sql in name order.
\echo Use "CREATE EXTENSION billguard" to load this file. \quit
