# status_history — PGXS build.
#
# The version lives only in status_history.control; the install script for it
# is generated from sql/status_history.sql, and upgrade scripts are picked up
# by wildcard, so no list here is kept by hand.

EXTENSION  = status_history
EXTVERSION = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)

MODULE_big = $(EXTENSION)
OBJS       = $(patsubst %.c,%.o,$(wildcard src/*.c))

DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql
DATA       = $(wildcard sql/$(EXTENSION)--*--*.sql)

# pg_regress inputs are every sql/*.sql that is not an install or upgrade script.
REGRESS      = $(filter-out $(EXTENSION)%,$(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=.

# Isolation specs (concurrency with a fixed interleaving) live under test/.
ISOLATION      = $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec))
ISOLATION_OPTS = --inputdir=test

PG_CFLAGS  = -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers
EXTRA_CLEAN = sql/$(EXTENSION)--$(EXTVERSION).sql

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs 2>/dev/null)
ifneq ($(wildcard $(PGXS)),)
include $(PGXS)
else
# Without the server's build files, the scripts below still work: they
# install them first.
all install installcheck:
	@echo "PostgreSQL's build files are missing: apt-get install postgresql-server-dev-15, or run ./test/run.sh, which installs them" >&2
	@exit 1
endif

sql/$(EXTENSION)--$(EXTVERSION).sql: sql/$(EXTENSION).sql $(EXTENSION).control
	cp $< $@

.PHONY: test demo bench stress memcheck
# Scripts that install what they need, then build, install and run.
test:
	./test/run.sh
demo:
	./test/demo.sh
bench:
	./bench/run.sh
stress:
	./test/stress.sh
memcheck:
	./test/memcheck.sh
