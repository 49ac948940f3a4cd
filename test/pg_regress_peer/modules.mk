# The C modules PostgreSQL's regression suite loads from its --dlpath:
# regress (src/test/regress/regress.c) and contrib/spi's refint and autoinc,
# built from the same source as the tests, against the installed headers.
MODULES = regress refint autoinc
PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
