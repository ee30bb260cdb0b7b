/*
 * status_history.h — declarations shared by the files in src/.
 *
 * module.c   loading, running SPI as the extension owner, kept SPI plans
 * clock.c    the monotonic clock (monotonic_now)
 * objects.c  per-object state: the fence and the current report, cached per statement
 * history.c  the triggers on status_history.history, and report()
 * latest.c   the latest() set-returning function
 */
#ifndef STATUS_HISTORY_H
#define STATUS_HISTORY_H

#include "postgres.h"
#include "executor/spi.h"
#include "utils/timestamp.h"

#define SH_SCHEMA "status_history"

/* module.c */
typedef struct ShSavedUser
{
	Oid			userid;
	int			sec_context;
} ShSavedUser;

extern Oid	sh_relation_oid(const char *relname);
extern void sh_become_owner(Oid relid, ShSavedUser *saved);
extern void sh_restore_user(const ShSavedUser *saved);
extern SPIPlanPtr sh_prepare_kept(const char *sql, int nargs, Oid *argtypes);

/* clock.c */
extern void sh_clock_init(void);
extern TimestampTz sh_clock_next(void);
extern void sh_clock_observe(TimestampTz stamp);

/* objects.c */
typedef struct ShObjectState
{
	int64		fence;
	bool		has_current;	/* has a non-stale report */
	TimestampTz current_at;		/* its stamp */
	TimestampTz status_since;
	char		status[16];		/* its status; "" without one */
} ShObjectState;

typedef struct ShReport
{
	Datum		object_id;		/* text */
	Datum		status;			/* text */
	Datum		error;			/* text, or NULL */
	Datum		details;		/* jsonb, or NULL */
	Datum		replica_id;		/* text, or NULL */
	Datum		reported_at;	/* timestamptz, or NULL */
	bool		error_null;
	bool		details_null;
	bool		replica_null;
	bool		reported_null;
	int64		generation;
	TimestampTz occurred_at;
} ShReport;

extern void sh_objects_init(void);
extern void sh_objects_statement_begin(void);
extern void sh_objects_statement_end(void);
extern ShObjectState *sh_objects_lock(Datum object_id);
extern void sh_objects_prefetch(Datum object_ids);
extern void sh_objects_set_current(ShObjectState *state, const ShReport *report,
								   TimestampTz status_since);

#endif							/* STATUS_HISTORY_H */
