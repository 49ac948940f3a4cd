# billguard: PGXS build of the extension, plus the project's commands.
#   make && make install      build and install into the PostgreSQL of pg_config
#   make test                 install dependencies, build, run every test suite
#   make demo                 a throwaway cluster billing a real period end to end
#   make bench                benchmarks, each printed as a ratio to its baseline

EXTENSION  = billguard
EXTVERSION = 0.1.0
MODULE_big = billguard
OBJS = \
	extension/module.o \
	extension/pg_boundary.o \
	extension/shared_state.o \
	extension/dispatcher_wakeup.o \
	extension/key_derivation.o \
	extension/idempotency_key.o \
	extension/journal_events.o \
	extension/api_base.o \
	extension/api_key.o \
	extension/http_client.o \
	extension/stripe_request.o \
	extension/spi_transaction.o \
	extension/dispatch_queue.o \
	extension/dispatcher.o \
	extension/dispatcher_status.o

# The install script is assembled from one file per concern, in name order.
SQL_PARTS  = $(sort $(wildcard sql/install/*.sql))
DATA_built = sql/billguard--$(EXTVERSION).sql

PG_CXXFLAGS = -std=c++17 -fno-omit-frame-pointer -Wno-register -Wno-missing-field-initializers
PG_CPPFLAGS = -Iextension
SHLIB_LINK  = -lcurl -lcrypto -lstdc++

# Debian's PGXS also emits LLVM bitcode for JIT inlining; clang needs the
# same language standard as g++ for our C++17 sources.
COMPILE.cxx.bc = $(CLANG) -xc++ -std=c++17 -Wno-register -Wno-ignored-attributes $(BITCODE_CXXFLAGS) $(CPPFLAGS) -flto=thin -emit-llvm -c

UNIT_TESTS  = test/unit/key_derivation_test test/unit/dispatch_units_test
EXTRA_CLEAN = $(UNIT_TESTS)

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(PGXS),)
include $(PGXS)
else ifeq ($(filter test demo bench deps,$(MAKECMDGOALS)),)
$(error pg_config not found: install postgresql-server-dev-15, or run `make deps`)
endif

sql/billguard--$(EXTVERSION).sql: $(SQL_PARTS)
	cat $(SQL_PARTS) > $@

test/unit/key_derivation_test: test/unit/key_derivation_test.cpp extension/key_derivation.cpp extension/key_derivation.hpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Iextension -o $@ test/unit/key_derivation_test.cpp extension/key_derivation.cpp -lcrypto

.PHONY: test demo bench deps unit
deps:
	test/install-deps.sh

test/unit/dispatch_units_test: test/unit/dispatch_units_test.cpp extension/stripe_request.cpp extension/api_base.cpp extension/api_key.cpp extension/rate_pacer.hpp
	$(CXX) -std=c++17 -O2 -Wall -Wextra -Iextension -o $@ test/unit/dispatch_units_test.cpp extension/stripe_request.cpp extension/api_base.cpp extension/api_key.cpp

unit: $(UNIT_TESTS)
	prove test/unit/

test:
	test/run-all.sh

demo:
	demo/run.sh

bench:
	bench/run.sh

# The Stripe emulator: its own Makefile, no code shared with the extension.
EMULATOR = tools/stripe-emulator/billguard-stripe-emulator
.PHONY: emulator install-emulator clean-emulator
all: emulator
emulator:
	$(MAKE) -C tools/stripe-emulator
install: install-emulator
install-emulator: emulator
	$(INSTALL_PROGRAM) $(EMULATOR) '$(DESTDIR)$(bindir)/billguard-stripe-emulator'
clean: clean-emulator
clean-emulator:
	$(MAKE) -C tools/stripe-emulator clean
