# billguard: PGXS build of the extension, plus the project's commands.
#   make && make install      build and install into the PostgreSQL of pg_config
#   make test [PG=17]         install dependencies, build, run every test suite,
#                             on every supported PostgreSQL major (or one)
#   make demo                 a throwaway cluster billing a real period end to end
#   make bench [PG=17]        benchmarks, each printed as a ratio to its baseline, on
#                             every supported major (or one), then side by side
#   make check-style          the house rules: clang-format, no PostgreSQL in common/,
#                             no two source files of one name
#   make check-sql            the house rules of sql/: each function written once (test/check-sql.pl)
#   make check-docs           the docs: links resolve, every setting and SQL function documented (test/check-docs.pl)
#   make installcheck         the pgTAP suites against the installed extension in a running
#                             server (PGHOST, PGPORT, PGUSER; test/README.md)

EXTENSION  = billguard
# The one version source: the control file, META.json and the C++ (EXTVERSION)
# are made from it.
EXTVERSION = 0.3.0

MODULE_big = billguard
# extension/ by role; module.cpp is _PG_init.
OBJS = \
	extension/module.o \
	extension/functions/await_billing.o \
	extension/functions/charge_request.o \
	extension/functions/dispatcher_status.o \
	extension/functions/history_guard.o \
	extension/functions/idempotency_key.o \
	extension/functions/is_valid_customer_id.o \
	extension/functions/journal_events.o \
	extension/functions/random_base62.o \
	extension/functions/scheduler_settings.o \
	extension/functions/stripe_webhook_signature.o \
	extension/functions/terminal_wakeups.o \
	extension/workers/billing_database.o \
	extension/workers/database_statements.o \
	extension/workers/dispatch_queue.o \
	extension/workers/dispatch_records.o \
	extension/workers/dispatcher.o \
	extension/workers/dispatcher_main.o \
	extension/workers/dispatcher_wakeup.o \
	extension/workers/history_probe.o \
	extension/workers/launcher.o \
	extension/workers/lock_waits.o \
	extension/workers/scheduler.o \
	extension/workers/served_databases.o \
	extension/workers/vault_credentials.o \
	extension/workers/worker_signals.o \
	extension/postgres/pg_boundary.o \
	extension/postgres/shared_state.o \
	extension/postgres/spi_transaction.o \
	extension/postgres/wait_events.o \
	extension/settings/dispatcher_settings.o \
	extension/settings/settings.o

# SQL: each function and view is written once per version that changed it,
# sql/udfs/<name>/<version>.sql (sql/views/<name>/ for a view) as that
# version released it, and latest.sql as the version under development has
# it. sql/assemble.pl builds the scripts PostgreSQL runs from templates that
# include those files: the install of the version under development from
# sql/install/*.sql (one file per concern, in name order), the install of a
# released version from sql/billguard--<version>.sql.in, an upgrade from
# sql/billguard--<from>--<to>.sql.in (its migration and one include per
# function or view changed in <to>). 0.1.0 predates the layout: its install
# is written out whole. test/check-sql.pl holds the files to these rules and
# every released script to its bytes (sql/released.sha256).
SQL_PARTS     = $(sort $(wildcard sql/install/*.sql))
SQL_OBJECTS   = $(wildcard sql/udfs/*/*.sql sql/views/*/*.sql)
SQL_TEMPLATES = $(sort $(wildcard sql/billguard--*.sql.in))
DATA          = sql/billguard--0.1.0.sql
DATA_built    = sql/billguard--$(EXTVERSION).sql $(SQL_TEMPLATES:.sql.in=.sql)

WARNINGS    = -Wall -Wextra -Werror
PG_CXXFLAGS = -std=c++17 -fno-omit-frame-pointer $(WARNINGS) -Wno-register -Wno-missing-field-initializers
# PostgreSQL's headers are system headers to us: -Werror applies to our code.
# An include names our header by its folder: the extension's own from
# extension/ ("postgres/pg_boundary.hpp"), the shared C++ from the
# repository ("common/sha256.hpp").
PG_CPPFLAGS = -isystem $(shell $(PG_CONFIG) --includedir-server) -Iextension -I. \
	-DEXTVERSION=\"$(EXTVERSION)\"
SHLIB_LINK  = .build/common/libbillguard_common.a -lcurl -lcrypto -lstdc++

# Debian's PGXS also emits LLVM bitcode for JIT inlining; clang needs the
# same language standard as g++ for our C++17 sources.
COMPILE.cxx.bc = $(CLANG) -xc++ -std=c++17 -Wno-register -Wno-ignored-attributes $(BITCODE_CXXFLAGS) $(CPPFLAGS) -flto=thin -emit-llvm -c

EXTRA_CLEAN = .build $(EXTENSION).control META.json worker/billguard-proxy

# `make installcheck` runs the pgTAP suites (test/pgtap/*.sql, by pg_prove)
# against the extension as installed, in the running server libpq's
# environment names (test/installcheck.sh; test/README.md). PGXS's own
# installcheck runs pg_regress for REGRESS, which billguard has none of, and
# would define an empty one: NO_INSTALLCHECK leaves the target to us.
NO_INSTALLCHECK = 1
PGTAP_TESTS = $(sort $(wildcard test/pgtap/*.sql))

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(PGXS),)
include $(PGXS)
else ifeq ($(filter test demo bench deps check-style check-sql check-docs,$(MAKECMDGOALS)),)
$(error pg_config not found: install postgresql-server-dev-NN (15, 17 or 18), or run `make deps`)
endif

sql/billguard--$(EXTVERSION).sql: $(SQL_PARTS) $(SQL_OBJECTS) sql/assemble.pl
	sql/assemble.pl -o $@ $(SQL_PARTS)
sql/billguard--%.sql: sql/billguard--%.sql.in $(SQL_OBJECTS) sql/assemble.pl
	sql/assemble.pl -o $@ $<

$(EXTENSION).control: $(EXTENSION).control.in Makefile
	sed 's/@EXTVERSION@/$(EXTVERSION)/g' $< > $@

META.json: META.json.in Makefile
	sed 's/@EXTVERSION@/$(EXTVERSION)/g' $< > $@
all: META.json

# common/: the pure C++ shared by the extension, the proxy and the unit tests
# (no PostgreSQL header), as a static library. The unit tests link a second
# build of it with AddressSanitizer and UndefinedBehaviorSanitizer.
COMMON_SRCS = $(sort $(wildcard common/*.cpp))
COMMON_CXXFLAGS = -std=c++17 -O2 -g -fPIC -fno-omit-frame-pointer $(WARNINGS) -Icommon -MMD -MP
SANITIZE = -fsanitize=address,undefined -fno-sanitize-recover=all

.build/common/%.o: common/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(COMMON_CXXFLAGS) -c -o $@ $<
.build/common/libbillguard_common.a: $(COMMON_SRCS:common/%.cpp=.build/common/%.o)
	$(AR) rcs $@ $^
.build/asan/common/%.o: common/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(COMMON_CXXFLAGS) $(SANITIZE) -c -o $@ $<
.build/asan/common/libbillguard_common.a: $(COMMON_SRCS:common/%.cpp=.build/asan/common/%.o)
	$(AR) rcs $@ $^
$(shlib): .build/common/libbillguard_common.a
# PGXS tracks no header of the extension's objects: a changed header of
# common/ or extension/ rebuilds them all, so no object is linked with
# another's idea of a struct.
$(OBJS): $(wildcard common/*.hpp extension/*.hpp extension/*/*.hpp)
# Nor does it track EXTVERSION, which the library compiles in (the schema
# version its dispatcher waits for): a stamp that changes with it rebuilds
# the objects, so that no build pairs a new schema with an old library.
.build/extversion: FORCE
	@mkdir -p $(@D)
	@echo '$(EXTVERSION)' | cmp -s - $@ || echo '$(EXTVERSION)' > $@
$(OBJS): .build/extversion
.PHONY: FORCE

# Unit tests: each test/unit/<name>_test.cpp is one TAP-printing program,
# built plain and sanitized; test/unit/run.t runs every one of both.
UNIT_SRCS  = $(sort $(wildcard test/unit/*_test.cpp))
UNIT_TESTS = $(UNIT_SRCS:test/unit/%.cpp=.build/unit/%) $(UNIT_SRCS:test/unit/%.cpp=.build/asan/unit/%)
UNIT_LIBS  = -lcurl -lcrypto
.build/unit/%: test/unit/%.cpp .build/common/libbillguard_common.a
	@mkdir -p $(@D)
	$(CXX) $(COMMON_CXXFLAGS) -o $@ $< .build/common/libbillguard_common.a $(UNIT_LIBS)
.build/asan/unit/%: test/unit/%.cpp .build/asan/common/libbillguard_common.a
	@mkdir -p $(@D)
	$(CXX) $(COMMON_CXXFLAGS) $(SANITIZE) -o $@ $< .build/asan/common/libbillguard_common.a $(UNIT_LIBS)

# The programs a user runs by name, billguard-proxy and
# billguard-stripe-emulator, are installed where a user's shell finds them,
# not in PostgreSQL's bindir (off PATH on Debian). PROXY_BINDIR, its former
# name, is still honoured.
PROXY_BINDIR   ?= /usr/local/bin
PROGRAM_BINDIR ?= $(PROXY_BINDIR)

# billguard-proxy, the spend-cap proxy (worker/): common/, libpqxx,
# nlohmann-json, and Boost.Beast and Asio (header-only, in http_server.cpp
# alone). Asio's deprecated interfaces are compiled out, as Boost 1.87 and
# later removed them: what builds here builds with every Debian's Boost.
PROXY        = worker/billguard-proxy
PROXY_SRCS   = $(sort $(wildcard worker/*.cpp))
PROXY_LIBS   = -lpqxx -lpq -lcurl -lcrypto -pthread
# libpqxx 8 (Debian forky's) needs C++20; 6.4 and 7 build with C++17.
PQXX_MAJOR := $(shell sed -n 's/^\#define PQXX_VERSION_MAJOR //p' /usr/include/pqxx/version.hxx 2>/dev/null)
PROXY_CXXSTD := $(if $(filter-out 6 7,$(PQXX_MAJOR)),-std=c++20,-std=c++17)
PROXY_CXXFLAGS = $(COMMON_CXXFLAGS) $(PROXY_CXXSTD) -pthread -DBOOST_ASIO_NO_DEPRECATED
.build/worker/%.o: worker/%.cpp
	@mkdir -p $(@D)
	$(CXX) $(PROXY_CXXFLAGS) -c -o $@ $<
$(PROXY): $(PROXY_SRCS:worker/%.cpp=.build/worker/%.o) .build/common/libbillguard_common.a
	$(CXX) -o $@ $^ $(PROXY_LIBS)
# EXTENSION_ONLY=1 builds and installs the extension alone: the programs
# depend on no PostgreSQL major, so a build for a second major skips them.
ifeq ($(EXTENSION_ONLY),)
all: $(PROXY)
install: install-proxy
endif
.PHONY: install-proxy
install-proxy: $(PROXY)
	$(INSTALL) -d '$(DESTDIR)$(PROGRAM_BINDIR)'
	$(INSTALL_PROGRAM) $(PROXY) '$(DESTDIR)$(PROGRAM_BINDIR)/billguard-proxy'

-include $(wildcard .build/*/*.d .build/*/*/*.d)

.PHONY: test demo bench deps unit check-style check-sql check-docs installcheck
deps:
	test/install-deps.sh

unit: $(UNIT_TESTS)
	prove test/unit/

check-style:
	test/check-style.sh

check-sql:
	test/check-sql.pl

check-docs:
	test/check-docs.pl
installcheck:
	test/installcheck.sh $(PGTAP_TESTS)

# Every supported PostgreSQL major, 15 here and 17 and 18 in Debian chroots
# (test/majors/); PG=17 (or PG="15 18") runs those only.
test:
	test/majors/test.sh $(PG)

demo:
	demo/run.sh

# bench/run.sh on every supported major, as `make test` (test/majors/bench.sh).
bench:
	test/majors/bench.sh $(PG)

# The Stripe emulator: its own Makefile, no code shared with the extension.
EMULATOR = tools/stripe-emulator/billguard-stripe-emulator
.PHONY: emulator install-emulator clean-emulator
ifeq ($(EXTENSION_ONLY),)
all: emulator
install: install-emulator
endif
emulator:
	$(MAKE) -C tools/stripe-emulator
install-emulator: emulator
	$(INSTALL) -d '$(DESTDIR)$(PROGRAM_BINDIR)'
	$(INSTALL_PROGRAM) $(EMULATOR) '$(DESTDIR)$(PROGRAM_BINDIR)/billguard-stripe-emulator'
clean: clean-emulator
clean-emulator:
	$(MAKE) -C tools/stripe-emulator clean
