-- billguard 0.1.0 -> 0.2.0. Run by ALTER EXTENSION billguard UPDATE.
-- Every schema change since the 0.1.0 release is made here as well as in
-- sql/install/ (the fresh install of 0.2.0); test/t/080_upgrade.pl proves
-- that both give the same schema.
\echo Use "ALTER EXTENSION billguard UPDATE TO '0.2.0'" to load this file. \quit
