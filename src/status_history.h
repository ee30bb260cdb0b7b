/*
 * status_history.h — declarations shared by the files in src/.
 *
 * module.c     loading: _PG_init
 * util.c       shared helpers: relations and columns by name, SPI as the extension owner,
 *              kept SPI plans, the version check
 * clock.c      the monotonic clock (monotonic_now)
 * history.c    the triggers on status_history.history
 * report.c     report() and report_many(); capturing the rows they stored
 * lock.c       locking an object's row; reading its row and its keys' rows
 * state.c      the transaction's per-object state: folding stored rows into it (the rule)
 * stored.c     an object's stored rows as the fold reads them: a row, a scan, a run
 * waiting.c    folded rows whose AFTER events are still due
 * imports.c    the objects this transaction imported into
 * writeback.c  writing an object's state back to its rows; notifying changes
 * rowwrite.c   writing one row by its TID (or a new one) without a statement; kept writers
 * utility.c    utility commands: GRANTs and owner changes refused on the extension's objects
 * restore.c    other SQL on the state tables: the guard, and merging restored rows
 * floors.c     the generation floors as reporters read them; what reconnect() must know
 * fence.c      reconnect(): raising floors and fences, locking a scope, re-stamped copies
 * copies.c     reconnect()'s copies of the current reports, read from the objects rows by TID
 * retire.c     retire_replica(): a replica gone for good
 * notify.c     NOTIFY status_history when an object's status changes
 * latest.c     the latest() set-returning function; copying history rows into a result
 * prune.c      prune(): removing old history, and the one DELETE the history lets through
 * lease.c      leases: checking them, when they run out, expire() recording the lapses
 * worker.c     the background worker that calls expire() in every database that has the extension
 * horizon.c    the change feed's horizon: stamps still held (per backend, prepared)
 * feed.c       stable_horizon() and changes(): the feed as SQL sees it
 * questions.c  history_of(), intervals() and time_in_status(): the history over a window
 */
#ifndef STATUS_HISTORY_H
#define STATUS_HISTORY_H

#include "postgres.h"
#include "access/genam.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "nodes/execnodes.h"
#include "utils/hsearch.h"
#include "utils/relcache.h"
#include "utils/resowner.h"
#include "utils/timestamp.h"

#define SH_SCHEMA "status_history"
#define SH_SEARCH_PATH "pg_catalog, pg_temp"

/* util.c */
typedef struct ShSavedUser
{
	Oid			userid;
	int			sec_context;
	int			guc_nest;		/* -1: search_path was already pinned */
} ShSavedUser;

extern void sh_check_version(void);
extern Oid	sh_relation_oid(const char *relname);
extern Oid	sh_relation_oid_if_exists(const char *relname);
extern void sh_become_owner(Oid relid, ShSavedUser *saved);
extern void sh_restore_user(const ShSavedUser *saved);
extern SPIPlanPtr sh_prepare_kept(const char *sql, int nargs, Oid *argtypes);
extern bool sh_history_find_stamp(Relation history, TimestampTz stamp, TupleTableSlot *slot);
extern uint32 sh_text_key_hash(const void *key, Size keysize);
extern int	sh_text_key_match(const void *key1, const void *key2, Size keysize);
extern void sh_check_id_list(Datum ids);
extern void sh_note_block(Relation rel, BlockNumber blk);
extern void sh_forget_blocks(void);
extern bool sh_fetch_hint(Relation rel, ItemPointer tid, TupleTableSlot *slot);
extern bool sh_written_by_this_command(TupleTableSlot *slot);
extern void sh_advance_command(void);
extern void sh_command_of_our_own(void);
extern int	sh_fnumber(TupleDesc desc, const char *column);
extern AttrNumber sh_attnum(TupleDesc desc, const char *table, const char *column);
extern ErrorData *sh_subxact_abort(MemoryContext cxt, ResourceOwner owner);
extern HTAB *sh_text_hash_create(const char *name, Size entrysize, MemoryContext cxt);
extern ArrayType *sh_text_array(const Datum *ids, int n);
extern int	sh_execute_latest(SPIPlanPtr plan, Datum *args, const char *nulls,
							  bool read_only, long count);
extern int	sh_read_ids(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *args,
						Datum **ids);

/* clock.c */
extern void sh_clock_init(void);
extern TimestampTz sh_clock_next(void);
extern void sh_clock_observe(TimestampTz stamp);
extern TimestampTz sh_clock_last(void);

/* The columns of status_history.history, found by name (attribute numbers). */
typedef struct ShHistoryCols
{
	AttrNumber	occurred_at;
	AttrNumber	object_id;
	AttrNumber	status;
	AttrNumber	error;
	AttrNumber	details;
	AttrNumber	replica_id;
	AttrNumber	generation;
	AttrNumber	reported_at;
	AttrNumber	stale;
	AttrNumber	lease;
} ShHistoryCols;

extern const ShHistoryCols *sh_history_cols(TupleDesc desc);

/* "No stamp": imported stamps may be anything finite, before 2000 included. */
#define SH_NO_STAMP DT_NOBEGIN

/*
 * The state of one key (object_id, replica_id) of an object, as folded from
 * its stored rows.  Stamps are SH_NO_STAMP while there is none.
 */
typedef struct ShKey
{
	text	   *replica_id;		/* NULL: the key of reports without a replica */
	bool		stored;			/* has a row in status_history.replica_state */
	bool		dirty;			/* differs from that row */
	ItemPointerData tid;		/* that row's newest version, if known (a hint) */
	TimestampTz last_at;		/* stamp of its newest row, stale or not */
	ItemPointerData last_tid;	/* that history row, if known (a hint) */
	TimestampTz last_seen_at;	/* when it last reported, repeats included */
	bool		has_current;	/* has a non-stale report */
	TimestampTz current_at;		/* stamp of its newest non-stale report */
	TimestampTz status_since;	/* start of that report's run of its status */
	TimestampTz expires_at;		/* when that report's lease runs out; SH_NO_STAMP: no lease */
	char		status[16];
} ShKey;

/*
 * One object's state in this transaction (state.c): its row, as locked,
 * with every stored row of it folded in up to last_at.
 */
typedef struct ShObject
{
	text	   *id;				/* hash key, in the state's memory */
	ItemPointerData tid;		/* its objects row's newest version (a hint) */
	int64		fence;
	bool		fence_unwritten;	/* raised by reconnect(), not written yet */
	SubTransactionId fence_raised_in;	/* the subtransaction that raised it */
	TimestampTz last_at;		/* newest row folded, stale or not */
	TimestampTz repeat_at;		/* newest repeat decided on its current report (a key's) */
	/*
	 * Rows folded while an AFTER event was due, in stamp order: those whose
	 * events have not come (nopen of them), and those whose events came
	 * meanwhile (a state read again must not wait for them).  Emptied when
	 * none is open.  Kept when the state is read again.
	 */
	struct ShWaiting *waiting;
	int			nwaiting;
	int			maxwaiting;
	int			nopen;
	/* Rows the insert trigger let go to be stored since all were folded. */
	TimestampTz handed_at;		/* the newest one's stamp */
	int			handed;			/* how many (2: at least that many, or not known) */
	bool		handed_dropped; /* one of them was handed over as dropped */
	/* The newest one as handed over: its status (sh_statuses) and stale flag. */
	int			handed_status;
	bool		handed_stale;
	bool		has_current;	/* has a non-stale report */
	TimestampTz current_at;		/* its stamp */
	ItemPointerData current_tid;	/* its history row, if known (a hint) */
	TimestampTz status_since;
	TimestampTz expires_at;		/* its key's expires_at; SH_NO_STAMP: no lease */
	char		status[16];		/* "" without one */
	bool		dirty;			/* the objects row differs from this */
	bool		has_written;	/* the status as last written: what a change is measured by */
	char		written[16];
	int			nkeys;
	int			maxkeys;
	ShKey	   *keys;
	bool		valid;			/* false: read it again before use */
	SubTransactionId touched;	/* newest subtransaction that read or changed it */
	TimestampTz came_at;		/* newest row whose own fold as stored came (kept when read again) */
	bool		pending;		/* folded since written back: to write at the statement's end */
	SubTransactionId pending_since; /* the subtransaction of the first such fold */
} ShObject;

/* A folded row, and whether its AFTER event came (state.c). */
typedef struct ShWaiting
{
	TimestampTz stamp;
	TransactionId xmin;			/* its (sub)transaction: an abort takes the row and its event */
	bool		came;
} ShWaiting;

/* A stored row, as the fold reads it. */
typedef struct ShStoredRow
{
	TimestampTz stamp;
	ItemPointerData tid;
	TransactionId xmin;			/* the (sub)transaction that stored it */
	char		status[16];
	text	   *replica_id;		/* NULL: none (points into the slot) */
	int64		generation;
	bool		stale;
	int64		lease;			/* microseconds; 0: none */
} ShStoredRow;

/* An index scan of the object's stored rows (SnapshotSelf), above after unless SH_NO_STAMP. */
typedef struct ShRowScan
{
	Relation	rel;
	Relation	index;
	IndexScanDesc scan;
	TupleTableSlot *slot;
} ShRowScan;

/* The current report and its run of one status, found walking rows newest first. */
typedef struct ShRun
{
	bool		has_current;
	bool		open;			/* no other status met since the current report */
	TimestampTz current_at;
	TimestampTz since;
	ItemPointerData current_tid;
	char		status[16];
} ShRun;

/* stored.c */
extern void sh_read_stored(TupleTableSlot *slot, ShStoredRow *row);
extern void sh_refuse_row(const ShObject *obj, const ShStoredRow *row, const char *why) pg_attribute_noreturn();
extern void sh_rows_begin(ShRowScan *s, ShObject *obj, TimestampTz after);
extern void sh_rows_end(ShRowScan *s);
extern bool sh_stored_by_stamp(TimestampTz stamp, TupleTableSlot **slot, Relation *rel);
extern void sh_run_walk(ShRun *run, const ShStoredRow *row);

/* imports.c */
extern bool sh_state_imported(ShObject *obj);
extern void sh_imports_abort(SubTransactionId aborted);
extern void sh_imports_reset(void);

/* waiting.c */
extern bool sh_waiting_any(const ShObject *obj);
extern void sh_waiting_forget_aborted(ShObject *obj);
extern void sh_waiting_note(ShObject *obj, TimestampTz stamp, TransactionId xmin, bool came);
extern bool sh_waiting_came(ShObject *obj, TimestampTz stamp);
extern void sh_waiting_settled(ShObject *obj);

/* lock.c */
extern void sh_lock_prune_eagerly(bool on);
extern bool sh_lock_object(Datum object_id, int64 new_fence, ShObject *obj);
extern void sh_read_keys(ShObject *obj, MemoryContext cxt);

/* keys.c */
extern bool sh_same_replica(text *r, text *replica);
extern ShKey *sh_state_key(ShObject *obj, text *replica);
extern ShKey *sh_key_append(ShObject *obj, MemoryContext cxt);
extern ShKey *sh_key_for(ShObject *obj, text *replica, MemoryContext cxt);

/* state.c */
extern void sh_state_init(void);
extern ShObject *sh_state_lock(Datum object_id);
extern void sh_state_lock_row(Datum object_id);
extern int	sh_state_cache_max(void);
extern void sh_state_forget_settled(void);
extern void sh_state_catch_up(ShObject *obj);
extern bool sh_state_catch_up_for(ShObject *obj, int status, bool stale);
extern void sh_state_handed(ShObject *obj, TimestampTz stamp, int status, bool stale);
extern bool sh_state_stale(const ShObject *obj, int64 generation, int64 floor,
						   const char *status, TimestampTz stamp);
extern void sh_state_note_import(ShObject *obj, bool past);
extern bool sh_state_repeats_allowed(ShObject *obj);
extern void sh_state_seen(ShObject *obj, ShKey *key, TimestampTz seen, int64 lease);
extern void sh_state_stored(TupleTableSlot *slot);
extern void sh_state_flush(void);
extern void sh_state_queue(ShObject *obj);
extern MemoryContext sh_state_memory(void);
extern void sh_state_write_back(ShObject *obj, TupleTableSlot *row);
extern void sh_state_note_repeat(ShObject *obj, const ShKey *key, TimestampTz seen);
extern void sh_state_settle(void);
extern void sh_state_invalidate(void);
extern int	sh_execute_own(SPIPlanPtr plan, Datum *args, const char *nulls);
extern bool sh_own_write(void);

/* writeback.c */
extern void sh_write_object(ShObject *obj, TupleTableSlot *row);
typedef struct ShFenceWriter ShFenceWriter;
extern ShFenceWriter *sh_fence_writer_begin(void);
extern void sh_write_fence(ShFenceWriter *w, ShObject *obj);
extern void sh_fence_writer_end(ShFenceWriter *w);

/* rowwrite.c */
typedef bool (*ShRowModify) (TupleDesc desc, Datum *values, bool *isnull, void *arg);
typedef struct ShRowWriter ShRowWriter;
extern ShRowWriter *sh_rowwriter_begin(Oid relid);
extern bool sh_rowwriter_update(ShRowWriter *w, ItemPointer tid, ShRowModify modify, void *arg);
extern bool sh_rowwriter_insert_new(ShRowWriter *w, Oid arbiter, ShRowModify fill, void *arg,
									ItemPointer tid);
extern void sh_rowwriter_end(ShRowWriter *w);
extern void sh_rowwriter_release(void);
extern void sh_rowwriter_forget(bool close);
extern bool sh_kept_relation(Oid relid, Oid indexid, Relation *rel, Relation *index);
extern void sh_rowwriter_subabort(SubTransactionId aborted);
extern void sh_rowwriter_invalidate(Oid relid);

/* utility.c */
extern void sh_utility_init(void);
extern bool sh_rowwrite(Oid relid, ItemPointer tid, ShRowModify modify, void *arg);
extern bool sh_row_text_is(TupleDesc desc, Datum *values, bool *isnull, const char *name, text *t);
extern bool sh_row_set(TupleDesc desc, Datum *values, bool *isnull, const char *name,
					   Datum value, bool null);

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
#define SH_DROPPED 5			/* sh_statuses[SH_DROPPED] is "dropped" */
extern const char *const sh_statuses[SH_NSTATUSES];
extern int	sh_status_index(Datum status);
extern void sh_history_init(void);

/* report.c */
extern void sh_capture_before(TriggerData *td, TimestampTz stamp, HeapTuple repeated);
extern void sh_capture_stored(HeapTuple tuple, TimestampTz stamp);

/* latest.c */
extern void sh_put_history_rows(ReturnSetInfo *rsinfo, SPIPlanPtr plan, Datum *args);

/* floors.c */
extern void sh_floors_init(void);
extern int64 sh_fence_floor(Datum replica_id, bool replica_null);
extern int64 sh_fence_new_object(void);
extern int64 sh_fence_committed_floor(Datum replica_id, bool replica_null);
extern void sh_fence_forget_floors(void);
extern bool sh_fence_in_reconnect(void);
extern void sh_fence_note_report(void);
extern void sh_fence_set_in_reconnect(bool on);
extern void sh_fence_check_unreported(const char *what);

/* fence.c */
extern void sh_state_raise_fences(Datum *ids, int n, int64 fence);
extern void sh_state_write_fences(Datum *ids, int n);
extern void sh_fence_init(void);
extern int	sh_sort_ids(Datum *ids, int n);
/* The floor of a retired replica: above every generation. */
#define SH_RETIRED PG_INT64_MAX
extern bool sh_fence_retire(Datum replica_id);
extern void sh_fence_lock_scope(Datum *ids, int n, bool keep);
extern void sh_fence_put_returned_rows(ReturnSetInfo *rsinfo);
extern void sh_fence_refuse(int64 generation, int64 fence, const char *what);
extern void sh_check_generation(int64 generation, const char *hint);

/* copies.c */
extern int	sh_copies_current(Datum *ids, int n, Datum *args, char *argnulls);

/* lease.c */
extern int64 sh_lease_check(Datum *lease, TimestampTz stamp, const char *status);
extern int64 sh_lease_usecs(Datum lease);
extern TimestampTz sh_lease_expiry(TimestampTz from, int64 lease);
extern bool sh_lease_in_expire(void);
extern bool sh_lease_still_due(ShObject *obj, ShKey *key, TimestampTz expected);
extern void sh_lease_init(void);

/* horizon.c */
extern bool sh_horizon_holding(void);
extern void sh_horizon_before_stamp(TimestampTz newest);
extern void sh_horizon_import(TimestampTz stamp, bool refusable);
extern TimestampTz sh_horizon_now(void);
extern void sh_horizon_init(void);

/* worker.c */
extern void sh_worker_init(void);

/* prune.c */
extern bool sh_prune_take_delete(bool row);

#endif							/* STATUS_HISTORY_H */
