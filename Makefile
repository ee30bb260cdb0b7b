# status_history — PGXS build.
#
# The version lives only in status_history.control; the install script for it
# is generated from sql/status_history.sql (into the top directory, so that
# sql/ holds only files under version control).  The install scripts of older
# versions (frozen as shipped) and the upgrade scripts are the files
# sql/status_history--*.sql, picked up by wildcard, so no list here is kept by
# hand.

EXTENSION  = status_history
EXTVERSION = $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)

MODULE_big = $(EXTENSION)
OBJS       = $(patsubst %.c,%.o,$(wildcard src/*.c))

DATA_built = $(EXTENSION)--$(EXTVERSION).sql
DATA       = $(wildcard sql/$(EXTENSION)--*.sql)

# pg_regress inputs are every sql/*.sql that is not an install or upgrade script.
REGRESS      = $(filter-out $(EXTENSION)%,$(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --inputdir=.

# Isolation specs (concurrency with a fixed interleaving) live under test/.
ISOLATION      = $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec))
ISOLATION_OPTS = --inputdir=test

# The library knows the one version it serves (src/module.c, sh_check_version).
PG_CPPFLAGS = -DSH_VERSION='"$(EXTVERSION)"'
PG_CFLAGS  = -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers
EXTRA_CLEAN = $(wildcard $(EXTENSION)--*.sql)

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

$(EXTENSION)--$(EXTVERSION).sql: sql/$(EXTENSION).sql $(EXTENSION).control
	cp $< $@

# The version is compiled in (SH_VERSION): a new one rebuilds what uses it;
# every file includes the shared header.
src/module.o: $(EXTENSION).control
$(OBJS): src/status_history.h

# A frozen install script for the version still being developed would be
# installed over the generated one.
ifneq ($(wildcard sql/$(EXTENSION)--$(EXTVERSION).sql),)
ifneq ($(filter-out clean distclean,$(or $(MAKECMDGOALS),all)),)
$(error sql/$(EXTENSION)--$(EXTVERSION).sql is the install script of $(EXTVERSION), the version being developed (default_version in $(EXTENSION).control): after a release raise default_version (README.md, Upgrading); a copy made by an older Makefile may be removed)
endif
endif

.PHONY: test quick doctest demo bench stress memcheck ha clients poolers monitoring
# Scripts that install what they need, then build, install and run.
test:
	./test/run.sh
# For development: pg_regress, isolation, pgTAP and the docs' SQL blocks (a few minutes).
quick:
	./test/run.sh quick
# Every SQL block of README.md and docs/, output compared.
doctest:
	./test/docs.sh
demo:
	./test/demo.sh
bench:
	./bench/run.sh
stress:
	./test/stress.sh
ha:
	./test/ha/run.sh
memcheck:
	./test/memcheck.sh
clients:
	./test/clients.sh
poolers:
	./test/poolers.sh
monitoring:
	./test/exporter.sh
