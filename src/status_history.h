/*
 * status_history.h — declarations shared by the files in src/.
 *
 * module.c   loading, running SPI as the extension owner, kept SPI plans
 * clock.c    the monotonic clock (monotonic_now)
 * objects.c  per-object state: locking, the write-back cache and its undo log
 * rowwrite.c writing one object's or key's row by its TID, without a statement
 * keys.c     per-key state (object_id, replica_id): reading, writing back, recomputing
 * fence.c    generation floors and reconnect()
 * retire.c   retire_replica(): a replica gone for good
 * notify.c   NOTIFY status_history when an object's status changes
 * history.c  the triggers on status_history.history, report() and report_many()
 * latest.c   the latest() set-returning function; copying history rows into a result
 * prune.c    prune(): removing old history, and the one DELETE the history lets through
 * questions.c  history_of(), intervals() and time_in_status(): the history over a window
 */
#ifndef STATUS_HISTORY_H
#define STATUS_HISTORY_H

#include "postgres.h"
#include "executor/spi.h"
#include "nodes/execnodes.h"
#include "utils/hsearch.h"
#include "utils/relcache.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#define SH_SCHEMA "status_history"
#define SH_SEARCH_PATH "pg_catalog, pg_temp"

/* module.c */
typedef struct ShSavedUser
{
	Oid			userid;
	int			sec_context;
	int			guc_nest;		/* -1: search_path was already pinned */
} ShSavedUser;

extern Oid	sh_relation_oid(const char *relname);
extern Oid	sh_relation_oid_if_exists(const char *relname);
extern void sh_become_owner(Oid relid, ShSavedUser *saved);
extern void sh_restore_user(const ShSavedUser *saved);
extern SPIPlanPtr sh_prepare_kept(const char *sql, int nargs, Oid *argtypes);
extern bool sh_history_find_stamp(Relation history, TimestampTz stamp, TupleTableSlot *slot);
extern uint32 sh_text_key_hash(const void *key, Size keysize);
extern int	sh_text_key_match(const void *key1, const void *key2, Size keysize);
extern void sh_check_id_list(Datum ids);
extern AttrNumber sh_attnum(TupleDesc desc, const char *table, const char *column);
extern ErrorData *sh_subxact_abort(MemoryContext cxt, ResourceOwner owner);
extern HTAB *sh_text_hash_create(const char *name, Size entrysize, MemoryContext cxt);
extern int	sh_execute_latest(SPIPlanPtr plan, Datum *args, const char *nulls,
							  bool read_only, long count);

/* clock.c */
extern void sh_clock_init(void);
extern TimestampTz sh_clock_next(void);
extern void sh_clock_observe(TimestampTz stamp);
extern TimestampTz sh_clock_last(void);

/* objects.c */
typedef struct ShObjectState
{
	int64		fence;
	bool		has_current;	/* has a non-stale report */
	TimestampTz current_at;		/* its stamp */
	TimestampTz status_since;
	char		status[16];		/* its status; "" without one */
	/* Reports made current since the last write-back, and the first's stamp. */
	int32		pending;
	TimestampTz pending_first;
	bool		pending_may_skip;	/* one of them may have been skipped */
	/* The status as last written (or read): what a change is measured against. */
	bool		has_written;
	char		written[16];
	ItemPointerData tid;		/* its row's newest version, if known (a hint) */
} ShObjectState;

/*
 * The state of one key (object_id, replica_id), kept in its object's cache
 * entry.  Stamps are 0 while there is none.
 */
typedef struct ShKeyState
{
	text	   *replica_id;		/* NULL: the key of reports without a replica */
	bool		stored;			/* has a row in status_history.replica_state */
	bool		dirty;			/* changed since the last write-back */
	TimestampTz last_at;		/* stamp of its newest row, stale or not */
	TimestampTz last_seen_at;	/* when it last reported, repeats included */
	bool		has_current;	/* has a non-stale report */
	TimestampTz current_at;		/* stamp of its newest non-stale report */
	TimestampTz status_since;	/* start of that report's run of its status */
	char		status[16];
	ItemPointerData tid;		/* its row's newest version, if known (a hint) */
} ShKeyState;

extern void sh_objects_init(void);
extern ShKeyState *sh_objects_key(ShObjectState *state, Datum replica_id, bool replica_null);
extern void sh_objects_prefetch_keys(Datum *ids, int n, Datum replica_id, bool all);
extern void sh_objects_key_report(ShObjectState *state, ShKeyState *key, TimestampTz stamp,
								  bool stale, const char *status, bool may_skip, bool seen);
extern void sh_objects_key_seen(ShObjectState *state, ShKeyState *key, TimestampTz seen);
extern ShObjectState *sh_objects_lock(Datum object_id, int64 new_fence);
/* The columns of a report that the per-object state copies. */
#define SH_REPORT_COLS 7		/* status, error, details, replica_id, generation, reported_at, object_id */
typedef struct ShReportValues
{
	Datum		values[SH_REPORT_COLS];
	bool		nulls[SH_REPORT_COLS];
} ShReportValues;

extern void sh_objects_set_current(ShObjectState *state, TimestampTz stamp,
								   const char *status, const ShReportValues *report,
								   bool may_skip);
extern void sh_objects_raise_fences(Datum *ids, int n, int64 fence);
extern void sh_objects_mark_recompute(ShObjectState *state, TimestampTz stamp);
extern void sh_objects_flush(bool closing);
extern void sh_objects_statement_end(void);
extern void sh_objects_row_begin(Datum object_id);
extern int	sh_execute_own(SPIPlanPtr plan, Datum *args, const char *nulls);
extern bool sh_own_write(void);
extern void sh_objects_invalidate(void);

/* rowwrite.c */
typedef bool (*ShRowModify) (TupleDesc desc, Datum *values, bool *isnull, void *arg);
typedef struct ShRowWriter ShRowWriter;
extern ShRowWriter *sh_rowwriter_begin(Oid relid);
extern bool sh_rowwriter_update(ShRowWriter *w, ItemPointer tid, ShRowModify modify, void *arg);
extern void sh_rowwriter_end(ShRowWriter *w);
extern bool sh_rowwrite(Oid relid, ItemPointer tid, ShRowModify modify, void *arg);
extern bool sh_row_text_is(TupleDesc desc, Datum *values, bool *isnull, const char *name, text *t);
extern bool sh_row_set(TupleDesc desc, Datum *values, bool *isnull, const char *name,
					   Datum value, bool null);

/* keys.c */
extern bool sh_keys_enabled(void);
extern void sh_keys_read(Datum object_id, ShKeyState *key);
typedef void (*ShKeyFound) (int i, const ShKeyState *row, void *arg);
extern void sh_keys_read_many(Datum *object_ids, int n, text *replica_id, bool every_replica,
							  ShKeyFound found, void *arg);
extern void sh_keys_params(text *object_id, const ShKeyState *k, Datum *values, char *nulls);
extern char *sh_keys_update_sql(int first, bool null_replica);
extern void sh_keys_write(text **object_ids, ShKeyState **keys, int n);
extern void sh_keys_recompute(text *object_id, ShKeyState *cached, int ncached);

/* notify.c */
extern void sh_notify_init(void);
extern bool sh_notify_wanted(void);
extern void sh_notify_change(text *object_id, const char *status, const char *previous,
							 TimestampTz at, const char *replica, bool known);
extern void sh_notify_pre_commit(void);
extern void sh_notify_reset(void);
extern void sh_notify_subxact(bool commit);

/* history.c */
#define SH_NSTATUSES 6
extern const char *const sh_statuses[SH_NSTATUSES];
extern int	sh_status_index(Datum status);
extern void sh_history_init(void);

/* latest.c */
extern void sh_put_history_rows(ReturnSetInfo *rsinfo, SPIPlanPtr plan, Datum *args);

/* fence.c */
extern void sh_fence_init(void);
extern int64 sh_fence_floor(Datum replica_id, bool replica_null);
extern int64 sh_fence_new_object(void);
extern void sh_fence_forget_floors(void);
extern bool sh_fence_in_reconnect(void);
extern void sh_fence_note_report(void);
extern int	sh_sort_ids(Datum *ids, int n);
/* The floor of a retired replica: above every generation. */
#define SH_RETIRED PG_INT64_MAX
extern bool sh_fence_retire(Datum replica_id);
extern void sh_fence_lock_scope(Datum *ids, int n);
extern void sh_fence_put_returned_rows(ReturnSetInfo *rsinfo);
extern void sh_fence_refuse(int64 generation, int64 fence, const char *what);
extern void sh_fence_set_in_reconnect(bool on);
extern void sh_fence_check_unreported(const char *what);

/* prune.c */
extern bool sh_prune_take_delete(void);

#endif							/* STATUS_HISTORY_H */
