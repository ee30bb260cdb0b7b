/*
 * module.c — loading status_history: the module magic, and _PG_init, which
 * sets up each file's hooks, callbacks and settings (every setting is
 * status_history.*).  The files and what each owns: status_history.h.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "status_history.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

/* Set up the clock's shared memory hooks and the worker when preloaded, the cache's callbacks, the utility hook. */
void
_PG_init(void)
{
	sh_clock_init();
	sh_state_init();
	sh_history_init();
	sh_floors_init();
	sh_fence_init();
	sh_notify_init();
	sh_utility_init();
	sh_lease_init();
	sh_horizon_init();
	sh_worker_init();
	/* After every setting is defined: a misspelt one is an error, a placeholder set before loading is kept. */
	MarkGUCPrefixReserved("status_history");
}

