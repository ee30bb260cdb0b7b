/*
 * objects.c — per-object state in status_history.objects: the fence and a
 * copy of the current (newest non-stale) report, and the write-back cache
 * that keeps maintaining it cheap.
 *
 * The rule this file is built around: after every statement, each object's
 * row equals what a brute-force query over the history gives (its newest
 * non-stale row, and the start of the unbroken run of that status).  The
 * cache may delay a write; it never holds the only copy of a change at a
 * point where PostgreSQL can drop it.
 *
 * - Locking.  The insert trigger locks the object's row before it takes a
 *   stamp, so reports on one object are serialized and stamp order equals
 *   commit order for that object.  The row is found and locked directly
 *   (index scan + table_tuple_lock) against the newest committed version,
 *   as RI triggers do, so REPEATABLE READ and SERIALIZABLE reporters do not
 *   fail merely because another reporter committed a newer version.
 *
 * - Cache.  The state of every locked object is kept in a hash table for the
 *   rest of the transaction: nobody else can change a row we hold locked, and
 *   our own SQL on the table (anything but this file's writes) first writes
 *   the cache back and invalidates it (the statement trigger on objects).
 *   A report only records its stamp and status in the entry; the write-back
 *   copies the report itself from the history row with that stamp, so the
 *   cache holds no report data and its size does not depend on it.
 *
 * - Write-back happens after each INSERT statement (AFTER STATEMENT trigger),
 *   after every executor run (ExecutorFinish: an executor stopped early by a
 *   row limit fires no AFTER STATEMENT trigger) and utility command (COPY),
 *   before commit and prepare, and before any other SQL touches the table.  A report whose row was not
 *   inserted after all (ON CONFLICT DO NOTHING, a later BEFORE trigger that
 *   returned NULL) or an imported row older than the current one makes the
 *   object's state be recomputed from the history instead.
 *
 * - Undo log.  Before an entry is changed inside a subtransaction, its prior
 *   image is saved for that nest level.  When the subtransaction aborts, its
 *   rows, row locks and writes vanish, and so do the entries it locked and
 *   the changes it made to older entries (their images are restored, dirty
 *   again if the write-back is what was rolled back).  On subtransaction
 *   commit the images move to the parent level.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "parser/parsetree.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_objects_guard);
PG_FUNCTION_INFO_V1(status_history_restore_merge);

/* Write-backs go in set-based UPDATEs of at most this many objects. */
#define FLUSH_CHUNK 4096

/*
 * status_history.cache_max_objects: entries kept at most; past it clean
 * entries are dropped (and read again when needed).
 */
static int	cache_max_objects = 262144;

/* An entry's state as it was before a subtransaction changed it. */
typedef struct UndoImage
{
	struct UndoImage *next;		/* older image (lower level) */
	int			level;			/* the nest level whose abort restores this */
	bool		valid;
	bool		dirty;
	bool		recompute;
	bool		fence_dirty;
	ShObjectState state;
	ShKeyState *keys;			/* a copy of the entry's keys */
	int			nkeys;
	bool		keys_recompute;
} UndoImage;

typedef struct CachedObject
{
	text	   *key;			/* object id, copied into the cache context */
	int			lock_level;		/* nest level of the subtransaction that locked it */
	bool		valid;			/* false: read the row again before use */
	bool		dirty;			/* current report changed, not yet written */
	bool		recompute;		/* write back by recomputing from the history */
	bool		fence_dirty;	/* fence raised, not yet written */
	ShObjectState state;
	ShKeyState *keys;			/* the keys of this object used so far */
	int			nkeys;
	int			maxkeys;
	bool		keys_recompute; /* write its keys back by recomputing them */
	UndoImage  *undo;			/* newest first, levels strictly decreasing */
	dlist_node	dirty_node;		/* in dirty_list while dirty */
	dlist_node	nested_node;	/* in nested_list while lock_level > 1 or undo */
	bool		in_nested;
} CachedObject;

static MemoryContext cache_context = NULL;
static HTAB *cache = NULL;
static dlist_head dirty_list;
static dlist_head nested_list;
static int	dirty_count = 0;
static bool writing = false;	/* our own SQL on objects is running */
static Oid	cache_relid = InvalidOid;	/* the objects table the cache describes */
static bool cache_recheck = false;	/* that table may have been dropped */

/*
 * The entry the last report was applied to: its row may be "in flight",
 * neither inserted nor skipped yet (later BEFORE triggers, CHECK constraints
 * and row security run queries in between).  A write-back from inside that
 * window must not conclude the row is missing.  One per trigger depth: a
 * report made inside that window (a user's trigger or CHECK reporting on
 * another object) runs the insert trigger one level deeper, and its rows
 * must not settle the outer row.  Deeper nesting shares the last level.
 */
#define INFLIGHT_DEPTHS 16
typedef struct InFlight
{
	CachedObject *entry;
	TimestampTz stamp;			/* the stamp of that row */
} InFlight;
static InFlight inflight[INFLIGHT_DEPTHS];

/* The trigger depth we run at, as an in-flight slot's index. */
static int
inflight_depth(void)
{
	int			depth = DatumGetInt32(DirectFunctionCall1(pg_trigger_depth, (Datum) 0));

	return Min(Max(depth, 0), INFLIGHT_DEPTHS - 1);
}

/* The statements whose rows were in slots from depth on are done. */
static void
settle_inflight_from(int depth)
{
	for (int i = Max(depth, 0); i < INFLIGHT_DEPTHS; i++)
		inflight[i].entry = NULL;
}

static void
set_inflight(CachedObject *entry, TimestampTz stamp)
{
	InFlight   *f = &inflight[inflight_depth()];

	f->entry = entry;
	f->stamp = stamp;
}

static void
forget_inflight(CachedObject *entry)
{
	for (int i = 0; i < INFLIGHT_DEPTHS; i++)
		if (entry == NULL || inflight[i].entry == entry)
			inflight[i].entry = NULL;
}

/*
 * A copy of the last report made current (one report, whatever the number
 * of objects: the cache itself holds no report data).  A statement that
 * changed one object with one report -- report(), the common case -- is
 * written back from it, with a plain UPDATE, once its row is seen stored.
 */
static MemoryContext last_context = NULL;
static CachedObject *last_entry = NULL;
static TimestampTz last_stamp;
static ShReportValues last_report;

static SPIPlanPtr create_plan = NULL;
static SPIPlanPtr write_one_plan = NULL;
static SPIPlanPtr write_many_plan = NULL;
static SPIPlanPtr recompute_plan = NULL;
static SPIPlanPtr write_values_plan = NULL;
static SPIPlanPtr write_trusted_plan = NULL;
static SPIPlanPtr write_fences_plan = NULL;

static ExecutorFinish_hook_type prev_executor_finish = NULL;
static ProcessUtility_hook_type prev_process_utility = NULL;

/* Attribute numbers of the columns of objects that locking reads. */
typedef struct ObjectColumns
{
	AttrNumber	fence;
	AttrNumber	occurred_at;
	AttrNumber	status;
	AttrNumber	status_since;
} ObjectColumns;

/* ---- plans ---- */

#define WRITE_SET \
	"   SET occurred_at = h.occurred_at, status = h.status, error = h.error," \
	"       details = h.details, replica_id = h.replica_id, generation = h.generation," \
	"       reported_at = h.reported_at, status_since = u.since," \
	"       fence = pg_catalog.int8larger(o.fence, u.fence)"

/*
 * The reports made current since the last write-back are all in the history
 * (one report: the join on its stamp has shown it is).
 */
#define ALL_THERE \
	"   AND (u.n OPERATOR(pg_catalog.=) 1 OR" \
	"        (SELECT pg_catalog.count(*) FROM status_history.history AS c" \
	"         WHERE c.object_id OPERATOR(pg_catalog.=) u.object_id AND NOT c.stale" \
	"           AND c.occurred_at OPERATOR(pg_catalog.>=) u.first" \
	"           AND c.occurred_at OPERATOR(pg_catalog.<=) u.stamp) OPERATOR(pg_catalog.=) u.n)"

/*
 * An object's report, found by its stamp: a probe of the primary key.  The
 * object id is compared by function, not operator, so that the planner
 * cannot probe (object_id, occurred_at) instead: comparing text at every
 * level of that index cost twice the probe by stamp.
 */
#define FIND_REPORT \
	"    ON h.occurred_at OPERATOR(pg_catalog.=) u.stamp" \
	"   AND pg_catalog.texteq(h.object_id, u.object_id) AND NOT h.stale"

/* One object's row from the values of its report. */
#define WRITE_VALUES \
	"UPDATE status_history.objects" \
	"   SET occurred_at = $2, status = $3, error = $4, details = $5," \
	"       replica_id = $6, generation = $7, reported_at = $8," \
	"       status_since = $9, fence = pg_catalog.int8larger(fence, $10)" \
	" WHERE object_id OPERATOR(pg_catalog.=) $1"

/* The bulk write-back: one row per object, its report found by stamp. */
#define WRITE_MANY \
	"UPDATE status_history.objects AS o" WRITE_SET \
	"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)," \
	"                  pg_catalog.unnest($3), pg_catalog.unnest($4)," \
	"                  pg_catalog.unnest($5), pg_catalog.unnest($6))" \
	"       AS u(object_id, stamp, since, first, n, fence)" \
	"  JOIN status_history.history AS h" FIND_REPORT \
	" WHERE o.object_id OPERATOR(pg_catalog.=) u.object_id"

static void
prepare_plans(void)
{
	Oid			create_types[2] = {TEXTOID, INT8OID};
	Oid			one_types[6] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT4OID, INT8OID};
	Oid			many_types[6] = {TEXTARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID,
		TIMESTAMPTZARRAYOID, INT4ARRAYOID, INT8ARRAYOID};
	Oid			recompute_types[2] = {TEXTOID, INT8OID};
	Oid			values_types[10] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
		TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID};
	Oid			fence_types[2] = {TEXTARRAYOID, INT8ARRAYOID};

	if (create_plan != NULL)
		return;
	create_plan = sh_prepare_kept(
								  "INSERT INTO status_history.objects AS o (object_id, fence) VALUES ($1, $2)"
								  "    ON CONFLICT (object_id) DO NOTHING"
								  " RETURNING o.fence, o.occurred_at IS NULL, o.ctid",
								  2, create_types);
	/*
	 * The report is copied from its history row, which must be there,
	 * non-stale; and every report made current since the last write-back
	 * must be there too (one may have been skipped, e.g. by ON CONFLICT),
	 * else status_since, derived from them, may be wrong.  We hold the
	 * object's lock: nobody else adds rows to it meanwhile.
	 */
	write_one_plan = sh_prepare_kept(
									 "UPDATE status_history.objects AS o" WRITE_SET
									 "  FROM (SELECT $1::pg_catalog.text AS object_id, $2::pg_catalog.timestamptz AS stamp,"
									 "               $3::pg_catalog.timestamptz AS since, $4::pg_catalog.timestamptz AS first,"
									 "               $5::pg_catalog.int4 AS n, $6::pg_catalog.int8 AS fence) AS u"
									 "  JOIN status_history.history AS h" FIND_REPORT
									 " WHERE o.object_id OPERATOR(pg_catalog.=) u.object_id" ALL_THERE,
									 6, one_types);
	write_many_plan = sh_prepare_kept(
									  WRITE_MANY ALL_THERE,
									  6, many_types);
	write_trusted_plan = sh_prepare_kept(
										 WRITE_MANY,
										 6, many_types);
	/* Fences raised by reconnect() on objects that get no copy (no current report). */
	write_fences_plan = sh_prepare_kept(
										"UPDATE status_history.objects AS o"
										"   SET fence = pg_catalog.int8larger(o.fence, u.fence)"
										"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS u(object_id, fence)"
										" WHERE o.object_id OPERATOR(pg_catalog.=) u.object_id",
										2, fence_types);
	write_values_plan = sh_prepare_kept(WRITE_VALUES, 10, values_types);
	/* Brute force over one object's history: the definition of its state. */
	recompute_plan = sh_prepare_kept(
									 "UPDATE status_history.objects AS o"
									 "   SET fence = pg_catalog.int8larger(o.fence, $2),"
									 "       occurred_at = n.occurred_at, status = n.status, error = n.error,"
									 "       details = n.details, replica_id = n.replica_id,"
									 "       generation = n.generation, reported_at = n.reported_at,"
									 "       status_since = (SELECT pg_catalog.min(s.occurred_at)"
									 "                         FROM status_history.history AS s"
									 "                        WHERE s.object_id OPERATOR(pg_catalog.=) $1 AND NOT s.stale"
									 "                          AND s.status OPERATOR(pg_catalog.=) n.status"
									 "                          AND s.occurred_at OPERATOR(pg_catalog.>) COALESCE("
									 "                              (SELECT pg_catalog.max(b.occurred_at)"
									 "                                 FROM status_history.history AS b"
									 "                                WHERE b.object_id OPERATOR(pg_catalog.=) $1"
									 "                                  AND NOT b.stale"
									 "                                  AND b.status OPERATOR(pg_catalog.<>) n.status),"
									 "                              '-infinity'::pg_catalog.timestamptz))"
									 "  FROM (SELECT 1) AS one"
									 "  LEFT JOIN LATERAL (SELECT h.* FROM status_history.history AS h"
									 "                      WHERE h.object_id OPERATOR(pg_catalog.=) $1 AND NOT h.stale"
									 "                      ORDER BY h.occurred_at DESC LIMIT 1) AS n ON true"
									 " WHERE o.object_id OPERATOR(pg_catalog.=) $1"
									 " RETURNING o.occurred_at, o.status, o.status_since",
									 2, recompute_types);
}

/* Connect to SPI as the owner of the per-object state; our writes are ours. */
static void
spi_begin(ShSavedUser *saved)
{
	SPI_connect();
	sh_become_owner(sh_relation_oid("objects"), saved);
	prepare_plans();
}

static void
spi_end(const ShSavedUser *saved)
{
	sh_restore_user(saved);
	SPI_finish();
}

/* Run one of our own statements on our tables, without tripping the guards. */
int
sh_execute_own(SPIPlanPtr plan, Datum *args, const char *nulls)
{
	int			ret;
	bool		was_writing = writing;

	writing = true;
	PG_TRY();
	{
		ret = sh_execute_latest(plan, args, nulls, false, 0);
	}
	PG_FINALLY();
	{
		writing = was_writing;
	}
	PG_END_TRY();
	return ret;
}

/* ---- locking a row directly ---- */

static void
object_columns(TupleDesc desc, ObjectColumns *cols)
{
	cols->fence = sh_attnum(desc, "objects", "fence");
	cols->occurred_at = sh_attnum(desc, "objects", "occurred_at");
	cols->status = sh_attnum(desc, "objects", "status");
	cols->status_since = sh_attnum(desc, "objects", "status_since");
}

/* Copy the locked row's state out of the slot. */
static void
read_state(TupleTableSlot *slot, const ObjectColumns *cols, ShObjectState *state)
{
	bool		isnull;
	Datum		d;

	memset(state, 0, sizeof(ShObjectState));
	state->fence = DatumGetInt64(slot_getattr(slot, cols->fence, &isnull));
	d = slot_getattr(slot, cols->occurred_at, &isnull);
	state->has_current = !isnull;
	if (isnull)
		return;
	state->current_at = DatumGetTimestampTz(d);
	d = slot_getattr(slot, cols->status, &isnull);
	if (!isnull)
		text_to_cstring_buffer(DatumGetTextPP(d), state->status, sizeof(state->status));
	d = slot_getattr(slot, cols->status_since, &isnull);
	state->status_since = isnull ? state->current_at : DatumGetTimestampTz(d);
	state->has_written = true;
	strlcpy(state->written, state->status, sizeof(state->written));
}

/*
 * Find the object's row and lock its newest version (waiting for whoever
 * holds it).  Returns false when there is no row.
 */
static bool
lock_row(Relation rel, Relation index, Datum object_id, ShObjectState *state)
{
	ObjectColumns cols;
	Snapshot	snapshot;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *found = table_slot_create(rel, NULL);
	TupleTableSlot *locked = table_slot_create(rel, NULL);
	bool		have = false;

	object_columns(RelationGetDescr(rel), &cols);
	CommandCounterIncrement();	/* see our own latest write */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, object_id);
	key.sk_collation = index->rd_indcollation[0];

	scan = index_beginscan(rel, index, snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, found))
	{
		TM_FailureData tmfd;
		ItemPointerData tid = found->tts_tid;
		TM_Result	result;

		result = table_tuple_lock(rel, &tid, snapshot, locked,
								  GetCurrentCommandId(false),
								  LockTupleNoKeyExclusive, LockWaitBlock,
								  TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (result == TM_Ok)
		{
			read_state(locked, &cols, state);
			state->tid = locked->tts_tid;
			have = true;
			break;
		}
		/* Our own changes are visible after the increment above. */
		if (result != TM_Deleted)
			elog(ERROR, "status_history: unexpected result %d locking an object", (int) result);
		/* Deleted meanwhile (only by hand): treat as missing. */
	}
	index_endscan(scan);
	UnregisterSnapshot(snapshot);
	ExecDropSingleTupleTableSlot(found);
	ExecDropSingleTupleTableSlot(locked);
	return have;
}

/*
 * Insert the object's row; a concurrent creator's row makes this a no-op.
 * True, with the new row's state, when this call inserted it.
 */
static bool
insert_object_row(Datum object_id, int64 fence, ShObjectState *state)
{
	Datum		args[2] = {object_id, Int64GetDatum(fence)};
	ShSavedUser saved;
	bool		created = false;
	bool		isnull;
	int			ret;

	spi_begin(&saved);
	ret = sh_execute_own(create_plan, args, NULL);
	if (ret != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "status_history: creating object failed: %s", SPI_result_code_string(ret));
	/* As inserted: a fence and no report (else read it as any row). */
	if (SPI_processed == 1 &&
		DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)))
	{
		HeapTuple	row = SPI_tuptable->vals[0];

		memset(state, 0, sizeof(ShObjectState));
		state->fence = DatumGetInt64(SPI_getbinval(row, SPI_tuptable->tupdesc, 1, &isnull));
		state->tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(row, SPI_tuptable->tupdesc, 3, &isnull));
		created = true;
	}
	spi_end(&saved);
	return created;
}

/*
 * Create the object's row.  True, with the new row's state, when this call
 * inserted it: a row our transaction inserted needs no lock (nobody else
 * sees it before we commit, and a concurrent creator waits for us on the
 * unique index), so the lock's row version and WAL record are saved on
 * every first report.  False: the caller locks the row someone else made.
 *
 * Under REPEATABLE READ or SERIALIZABLE, ON CONFLICT DO NOTHING fails with
 * 40001 when the conflicting row was committed after the transaction's
 * snapshot -- a concurrent first report on the same object, which is no
 * conflict for us: we lock that row instead, as in READ COMMITTED.  There the
 * INSERT runs in a subtransaction, and that failure means "created by
 * someone else" -- once (first_try): a second one is a real serialization
 * failure (SERIALIZABLE's own checks raise 40001 too), and is raised.
 */
static bool
create_row(Datum object_id, int64 fence, ShObjectState *state, bool first_try)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	volatile bool created = false;

	if (!IsolationUsesXactSnapshot())
		return insert_object_row(object_id, fence, state);
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		created = insert_object_row(object_id, fence, state);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
	}
	PG_CATCH();
	{
		ErrorData  *edata = sh_subxact_abort(cxt, owner);

		if (edata->sqlerrcode != ERRCODE_T_R_SERIALIZATION_FAILURE || !first_try)
			ReThrowError(edata);
		FreeErrorData(edata);
	}
	PG_END_TRY();
	return created;
}

/* Lock the object's row, creating it on first report, and read its state. */
static void
lock_and_read(Datum object_id, int64 new_fence, ShObjectState *state)
{
	Oid			relid = sh_relation_oid("objects");
	Relation	rel = table_open(relid, RowExclusiveLock);
	Relation	index = index_open(RelationGetPrimaryKeyIndex(rel), RowExclusiveLock);

	for (int attempt = 0; !lock_row(rel, index, object_id, state); attempt++)
	{
		if (attempt > 2)
			elog(ERROR, "status_history: object row vanished while being locked");
		if (create_row(object_id, new_fence, state, attempt == 0))
			break;
	}
	index_close(index, NoLock);
	table_close(rel, NoLock);
}

/* ---- the cache ---- */

/* The cache lives in the transaction's memory; it dies with it. */
static void
cache_create(void)
{
	cache_context = AllocSetContextCreate(TopTransactionContext,
										  "status_history object cache",
										  ALLOCSET_DEFAULT_SIZES);
	cache = sh_text_hash_create("status_history object cache", sizeof(CachedObject), cache_context);
	dlist_init(&dirty_list);
	dlist_init(&nested_list);
	dirty_count = 0;
	forget_inflight(NULL);
	last_entry = NULL;
	cache_relid = sh_relation_oid("objects");
	cache_recheck = false;
}

/* Forget everything without writing: the table it describes is gone. */
static void
cache_discard(void)
{
	if (cache_context != NULL)
		MemoryContextDelete(cache_context);
	cache_context = NULL;
	cache = NULL;
	dirty_count = 0;
	forget_inflight(NULL);
	last_entry = NULL;
}

/* DROP and CREATE EXTENSION in one transaction: a new objects table. */
static void
cache_check_table(void)
{
	if (cache != NULL && cache_recheck)
	{
		cache_recheck = false;
		if (sh_relation_oid_if_exists("objects") != cache_relid)
			cache_discard();
	}
}

static void
objects_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == cache_relid)
		cache_recheck = true;
}

static CachedObject *
entry_of(ShObjectState *state)
{
	return (CachedObject *) ((char *) state - offsetof(CachedObject, state));
}

/* Keep the entry on the short list the subtransaction callbacks walk. */
static void
track_nested(CachedObject *entry)
{
	bool		needed = entry->lock_level > 1 || entry->undo != NULL;

	if (needed && !entry->in_nested)
		dlist_push_tail(&nested_list, &entry->nested_node);
	else if (!needed && entry->in_nested)
		dlist_delete(&entry->nested_node);
	entry->in_nested = needed;
}

static void
set_dirty(CachedObject *entry, bool dirty)
{
	if (dirty && !entry->dirty)
	{
		dlist_push_tail(&dirty_list, &entry->dirty_node);
		dirty_count++;
	}
	else if (!dirty && entry->dirty)
	{
		dlist_delete(&entry->dirty_node);
		dirty_count--;
	}
	entry->dirty = dirty;
}

/*
 * About to change the entry: save its image for the current nest level,
 * unless one is saved already or the entry itself vanishes with this level.
 */
static void
entry_save(CachedObject *entry)
{
	int			level = GetCurrentTransactionNestLevel();
	UndoImage  *img;

	if (level <= entry->lock_level ||
		(entry->undo != NULL && entry->undo->level >= level))
		return;
	img = MemoryContextAlloc(cache_context, sizeof(UndoImage));
	img->next = entry->undo;
	img->level = level;
	img->valid = entry->valid;
	img->dirty = entry->dirty;
	img->recompute = entry->recompute;
	img->fence_dirty = entry->fence_dirty;
	img->state = entry->state;
	img->nkeys = entry->nkeys;
	img->keys = entry->nkeys == 0 ? NULL :
		MemoryContextAlloc(cache_context, entry->nkeys * sizeof(ShKeyState));
	if (entry->nkeys > 0)
		memcpy(img->keys, entry->keys, entry->nkeys * sizeof(ShKeyState));
	img->keys_recompute = entry->keys_recompute;
	entry->undo = img;
	track_nested(entry);
}

static void
image_free(UndoImage *img)
{
	if (img->keys != NULL)
		pfree(img->keys);
	pfree(img);
}

/* Put the keys of an image back (the entry's own array goes). */
static void
keys_restore(CachedObject *entry, UndoImage *img)
{
	if (entry->keys != NULL)
		pfree(entry->keys);
	entry->keys = img->keys;
	entry->nkeys = img->nkeys;
	entry->maxkeys = img->nkeys;
	entry->keys_recompute = img->keys_recompute;
	img->keys = NULL;
}

static void
entry_remove(CachedObject *entry)
{
	text	   *key = entry->key;

	forget_inflight(entry);
	if (last_entry == entry)
		last_entry = NULL;
	set_dirty(entry, false);
	if (entry->in_nested)
		dlist_delete(&entry->nested_node);
	while (entry->undo != NULL)
	{
		UndoImage  *img = entry->undo;

		entry->undo = img->next;
		image_free(img);
	}
	if (entry->keys != NULL)
		pfree(entry->keys);
	hash_search(cache, &key, HASH_REMOVE, NULL);
	pfree(key);
}

/* Subtransaction at level aborted: its locks, rows and writes are gone. */
static void
cache_abort_level(int level)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, &nested_list)
	{
		CachedObject *entry = dlist_container(CachedObject, nested_node, iter.cur);
		UndoImage  *restore = NULL;

		if (entry->lock_level >= level)
		{
			entry_remove(entry);
			continue;
		}
		while (entry->undo != NULL && entry->undo->level >= level)
		{
			if (restore != NULL)
				image_free(restore);
			restore = entry->undo;
			entry->undo = restore->next;
		}
		if (restore != NULL)
		{
			entry->valid = restore->valid;
			entry->recompute = restore->recompute;
			entry->fence_dirty = restore->fence_dirty;
			entry->state = restore->state;
			keys_restore(entry, restore);
			set_dirty(entry, restore->dirty);
			image_free(restore);
		}
		track_nested(entry);
	}
}

/* Subtransaction at level committed: what it did now belongs to its parent. */
static void
cache_commit_level(int level)
{
	dlist_mutable_iter iter;

	dlist_foreach_modify(iter, &nested_list)
	{
		CachedObject *entry = dlist_container(CachedObject, nested_node, iter.cur);
		UndoImage **link;

		if (entry->lock_level == level)
			entry->lock_level = level - 1;
		if (entry->undo != NULL && entry->undo->level == level)
		{
			UndoImage  *img = entry->undo;

			if (img->next != NULL && img->next->level == level - 1)
			{
				/* The parent's own image is the older one: keep that. */
				entry->undo = img->next;
				image_free(img);
			}
			else
				img->level = level - 1;
		}
		/* Images at or below the locking level are never restored. */
		for (link = &entry->undo; *link != NULL; link = &(*link)->next)
			if ((*link)->level <= entry->lock_level)
			{
				while (*link != NULL)
				{
					UndoImage  *img = *link;

					*link = img->next;
					image_free(img);
				}
				break;
			}
		track_nested(entry);
	}
}

/* Drop clean entries without undo images: always safe, they are re-read. */
static void
cache_shrink(void)
{
	HASH_SEQ_STATUS seq;
	CachedObject *entry;

	hash_seq_init(&seq, cache);
	while ((entry = hash_seq_search(&seq)) != NULL)
		if (!entry->dirty && entry->undo == NULL)
			entry_remove(entry);
}

/* ---- write-back ---- */

static void write_objects(CachedObject **batch, int n);

/* One column of the set-based write-back, as an array. */
static Datum
column_array(Datum *elems, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_array(elems, n, elemtype, typlen, typbyval, typalign));
}

/* Recompute the entry's state from the history (inside spi_begin). */
static void
recompute(CachedObject *entry)
{
	Datum		args[2] = {PointerGetDatum(entry->key), Int64GetDatum(entry->state.fence)};
	int			ret = sh_execute_own(recompute_plan, args, NULL);
	TupleDesc	desc;
	HeapTuple	tuple;
	bool		isnull;
	Datum		d;

	if (ret != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
		elog(ERROR, "status_history: recomputing an object's state failed: %s",
			 SPI_result_code_string(ret));
	desc = SPI_tuptable->tupdesc;
	tuple = SPI_tuptable->vals[0];
	d = SPI_getbinval(tuple, desc, 1, &isnull);
	entry->state.has_current = !isnull;
	entry->state.current_at = isnull ? 0 : DatumGetTimestampTz(d);
	entry->state.status[0] = '\0';
	d = SPI_getbinval(tuple, desc, 2, &isnull);
	if (!isnull)
		text_to_cstring_buffer(DatumGetTextPP(d), entry->state.status,
							   sizeof(entry->state.status));
	d = SPI_getbinval(tuple, desc, 3, &isnull);
	entry->state.status_since = isnull ? entry->state.current_at : DatumGetTimestampTz(d);
}

/* Is a row with this stamp in the history (ours included, in flight excluded)? */
static bool
stamp_stored(TimestampTz stamp)
{
	Relation	rel = table_open(sh_relation_oid("history"), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		found = sh_history_find_stamp(rel, stamp, slot);

	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * Can the entry be written from the copy of its report?  When that is the
 * only report made current since the last write-back and its row is stored.
 * Not when another trigger may have changed the row after ours copied it
 * (pending_may_skip): then the stored row is the one to copy.  Otherwise
 * nothing can skip the row, and a row in flight is held back by the caller
 * (sh_objects_flush): it is stored, no need to look.
 */
static bool
copy_is_current(CachedObject *entry)
{
	return entry == last_entry && last_stamp == entry->state.current_at &&
		entry->state.pending == 1 && !entry->state.pending_may_skip;
}

/* The ten parameters of WRITE_VALUES, from the copy of the report. */
static void
copy_params(CachedObject *entry, Datum *args, char *nulls)
{
	args[0] = PointerGetDatum(entry->key);
	nulls[0] = ' ';
	args[1] = TimestampTzGetDatum(last_stamp);
	nulls[1] = ' ';
	for (int i = 0; i < 6; i++)
	{
		args[2 + i] = last_report.values[i];
		nulls[2 + i] = last_report.nulls[i] ? 'n' : ' ';
	}
	args[8] = TimestampTzGetDatum(entry->state.status_since);
	nulls[8] = ' ';
	args[9] = Int64GetDatum(entry->state.fence);
	nulls[9] = ' ';
}

/* Write one entry from the copy of its report, when copy_is_current(). */
static bool
write_from_copy(CachedObject *entry)
{
	Datum		args[10];
	char		nulls[10];
	int			ret;

	if (!copy_is_current(entry))
		return false;
	copy_params(entry, args, nulls);
	ret = sh_execute_own(write_values_plan, args, nulls);
	if (ret != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "status_history: writing back an object failed: %s", SPI_result_code_string(ret));
	return true;
}

/*
 * What both by-TID writes of an object's row set from the entry, after
 * checking the row is the entry's: the fence (it only grows, as int8larger()
 * in the statements) and status_since.
 */
static bool
object_row_from_entry(TupleDesc desc, Datum *values, bool *isnull, CachedObject *entry)
{
	int			fence = SPI_fnumber(desc, "fence");

	if (fence <= 0 || isnull[fence - 1] ||
		!sh_row_text_is(desc, values, isnull, "object_id", entry->key))
		return false;
	return sh_row_set(desc, values, isnull, "fence",
					  Int64GetDatum(Max(DatumGetInt64(values[fence - 1]), entry->state.fence)), false) &&
		sh_row_set(desc, values, isnull, "status_since",
				   TimestampTzGetDatum(entry->state.status_since), false);
}

/* sh_rowwrite's modify(): the object's row from the copy of its report. */
static bool
object_from_copy(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	static const char *const report_cols[6] = {"status", "error", "details", "replica_id",
	"generation", "reported_at"};
	CachedObject *entry = (CachedObject *) arg;
	bool		ok;

	ok = object_row_from_entry(desc, values, isnull, entry) &&
		sh_row_set(desc, values, isnull, "occurred_at", TimestampTzGetDatum(last_stamp), false);
	for (int i = 0; ok && i < 6; i++)
		ok = sh_row_set(desc, values, isnull, report_cols[i],
						last_report.values[i], last_report.nulls[i]);
	return ok;
}

/*
 * The one-report statement (a report() call): the object's row from the
 * copy and its one dirty, stored key.  Written directly by TID when the
 * rows' TIDs are known (rowwrite.c); else in a single statement (a
 * data-modifying CTE) instead of two.  False, having written nothing or
 * what the caller writes again to the same values, when the entry is not
 * that simple or a row was not there.
 */
static bool
write_object_and_key(CachedObject *entry)
{
	static SPIPlanPtr plans[2] = {NULL, NULL};
	ShKeyState *key = NULL;
	Datum		args[17];
	char		nulls[17];
	int			which;
	int			ret;
	bool		isnull;

	if (entry->recompute || entry->keys_recompute || !copy_is_current(entry))
		return false;
	for (int k = 0; k < entry->nkeys; k++)
		if (entry->keys[k].dirty)
		{
			if (key != NULL)
				return false;
			key = &entry->keys[k];
		}
	if (key == NULL || !key->stored)
		return false;
	if (sh_rowwrite(sh_relation_oid("objects"), &entry->state.tid, object_from_copy, entry))
	{
		sh_keys_write(&entry->key, &key, 1);	/* by TID too, when known */
		CommandCounterIncrement();	/* as after a statement */
	}
	else
	{
		which = key->replica_id == NULL ? 0 : 1;
		if (plans[which] == NULL)
		{
			Oid			types[17] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
				TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID,
				TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID};

			plans[which] = sh_prepare_kept(psprintf("WITH o AS (" WRITE_VALUES " RETURNING 1) %s"
													" RETURNING (SELECT pg_catalog.count(*) FROM o)",
													sh_keys_update_sql(11, which == 0)),
										   17, types);
		}
		copy_params(entry, args, nulls);
		sh_keys_params(entry->key, key, args + 10, nulls + 10);
		ret = sh_execute_own(plans[which], args, nulls);
		if (ret != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "status_history: writing back an object failed: %s", SPI_result_code_string(ret));
		ItemPointerSetInvalid(&entry->state.tid);	/* the statement moved the rows */
		ItemPointerSetInvalid(&key->tid);
		if (SPI_processed != 1 ||
			DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) != 1)
			return false;
	}
	entry->state.pending = 0;
	entry->fence_dirty = false;
	key->dirty = false;
	return true;
}

/* Write one entry; false when its report is not in the history as expected. */
static bool
write_one(CachedObject *entry)
{
	Datum		args[6];
	int			ret;

	args[0] = PointerGetDatum(entry->key);
	args[1] = TimestampTzGetDatum(entry->state.current_at);
	args[2] = TimestampTzGetDatum(entry->state.status_since);
	args[3] = TimestampTzGetDatum(entry->state.pending_first);
	args[4] = Int32GetDatum(entry->state.pending);
	args[5] = Int64GetDatum(entry->state.fence);
	ret = sh_execute_own(write_one_plan, args, NULL);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "status_history: writing back an object failed: %s",
			 SPI_result_code_string(ret));
	return SPI_processed == 1;
}

/* Write n entries with one UPDATE; false when some were not written. */
static bool
write_many(CachedObject **entries, int n, SPIPlanPtr plan)
{
	Datum	   *elems = palloc(n * sizeof(Datum));
	Datum		args[6];
	int			ret;

	for (int i = 0; i < n; i++)
		elems[i] = PointerGetDatum(entries[i]->key);
	args[0] = column_array(elems, n, TEXTOID);
	for (int i = 0; i < n; i++)
		elems[i] = TimestampTzGetDatum(entries[i]->state.current_at);
	args[1] = column_array(elems, n, TIMESTAMPTZOID);
	for (int i = 0; i < n; i++)
		elems[i] = TimestampTzGetDatum(entries[i]->state.status_since);
	args[2] = column_array(elems, n, TIMESTAMPTZOID);
	for (int i = 0; i < n; i++)
		elems[i] = TimestampTzGetDatum(entries[i]->state.pending_first);
	args[3] = column_array(elems, n, TIMESTAMPTZOID);
	for (int i = 0; i < n; i++)
		elems[i] = Int32GetDatum(entries[i]->state.pending);
	args[4] = column_array(elems, n, INT4OID);
	for (int i = 0; i < n; i++)
		elems[i] = Int64GetDatum(entries[i]->state.fence);
	args[5] = column_array(elems, n, INT8OID);
	ret = sh_execute_own(plan, args, NULL);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "status_history: writing back %d objects failed: %s",
			 n, SPI_result_code_string(ret));
	pfree(elems);
	for (int i = 0; i < 6; i++)
		pfree(DatumGetPointer(args[i]));
	return SPI_processed == (uint64) n;
}

/*
 * Write the keys of a batch of entries: from the cache, or, for an object one
 * of whose rows may have been skipped or arrived in the past, recomputed from
 * the history (its keys are then read again when next needed).
 */
static void
write_keys(CachedObject **batch, int n)
{
	text	  **ids = NULL;
	ShKeyState **keys = NULL;
	int			m = 0;
	int			max = 0;

	for (int i = 0; i < n; i++)
	{
		CachedObject *entry = batch[i];

		if (entry->keys_recompute)
		{
			sh_keys_recompute(entry->key, entry->keys, entry->nkeys);
			entry->keys_recompute = false;
			entry->nkeys = 0;
			continue;
		}
		for (int k = 0; k < entry->nkeys; k++)
		{
			if (!entry->keys[k].dirty)
				continue;
			if (m == max)
			{
				max = Max(16, max * 2);
				ids = ids ? repalloc(ids, max * sizeof(text *)) : palloc(max * sizeof(text *));
				keys = keys ? repalloc(keys, max * sizeof(ShKeyState *)) : palloc(max * sizeof(ShKeyState *));
			}
			ids[m] = entry->key;
			keys[m++] = &entry->keys[k];
		}
	}
	if (m == 0)
		return;
	sh_keys_write(ids, keys, m);	/* reorders ids and keys */
	for (int i = 0; i < m; i++)
	{
		keys[i]->dirty = false;
		keys[i]->stored = true;
	}
	pfree(ids);
	pfree(keys);
}

/*
 * Tell listeners about every written entry whose status is not the one it
 * had at its previous write-back (notify.c has the rule).
 */
static void
notify_changes(CachedObject **entries, int n)
{
	for (int i = 0; i < n; i++)
	{
		ShObjectState *state = &entries[i]->state;
		bool		known = entries[i] == last_entry && last_stamp == state->current_at;

		if (!state->has_current ||
			(state->has_written && strcmp(state->written, state->status) == 0))
			continue;
		if (sh_notify_wanted())
			sh_notify_change(entries[i]->key, state->status,
							 state->has_written ? state->written : NULL, state->current_at,
							 known && !last_report.nulls[3] ?
							 TextDatumGetCString(last_report.values[3]) : NULL, known);
		state->has_written = true;
		strlcpy(state->written, state->status, sizeof(state->written));
	}
}

/* Write the raised fences of entries with nothing else to write. */
static void
write_fences(CachedObject **entries, int n)
{
	Datum	   *elems;
	Datum		args[2];
	int			ret;

	if (n == 0)
		return;
	elems = palloc(n * sizeof(Datum));
	for (int i = 0; i < n; i++)
		elems[i] = PointerGetDatum(entries[i]->key);
	args[0] = column_array(elems, n, TEXTOID);
	for (int i = 0; i < n; i++)
		elems[i] = Int64GetDatum(entries[i]->state.fence);
	args[1] = column_array(elems, n, INT8OID);
	ret = sh_execute_own(write_fences_plan, args, NULL);
	if (ret != SPI_OK_UPDATE || SPI_processed != (uint64) n)
		elog(ERROR, "status_history: raising fences failed: %s", SPI_result_code_string(ret));
	pfree(elems);
	pfree(DatumGetPointer(args[0]));
	pfree(DatumGetPointer(args[1]));
}

/* Write a batch of dirty entries; entries were saved for undo already. */
static void
write_batch(CachedObject **batch, int n)
{
	CachedObject **objects = palloc(n * sizeof(CachedObject *));
	CachedObject **fences = palloc(n * sizeof(CachedObject *));
	int			m = 0;
	int			f = 0;

	if (n == 1 && write_object_and_key(batch[0]))
	{
		notify_changes(batch, 1);
		pfree(objects);
		pfree(fences);
		return;
	}

	/*
	 * An entry may be dirty only because of its keys or its fence.  Sorted
	 * before anything is written: writing an object's state clears its
	 * pending count, and its fence went with it.
	 */
	for (int i = 0; i < n; i++)
	{
		if (batch[i]->recompute || batch[i]->state.pending > 0)
			objects[m++] = batch[i];
		else if (batch[i]->fence_dirty)
			fences[f++] = batch[i];
	}
	write_objects(objects, m);		/* (writes the fence too) */
	notify_changes(objects, m);
	write_fences(fences, f);
	/* The statement moved these rows: their TIDs are no longer known. */
	for (int i = 0; i < f; i++)
		ItemPointerSetInvalid(&fences[i]->state.tid);
	for (int i = 0; i < n; i++)
		batch[i]->fence_dirty = false;
	pfree(objects);
	pfree(fences);
	write_keys(batch, n);
}

/* A report found by stamp, and the entry whose row it goes to. */
typedef struct ReportCopy
{
	CachedObject *entry;
	TupleTableSlot *report;
} ReportCopy;

/* sh_rowwrite's modify(): the object's row from its report's history row. */
static bool
object_from_report(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	static const char *const report_cols[7] = {"occurred_at", "status", "error", "details",
	"replica_id", "generation", "reported_at"};
	ReportCopy *c = (ReportCopy *) arg;
	TupleDesc	hdesc = c->report->tts_tupleDescriptor;
	bool		ok = object_row_from_entry(desc, values, isnull, c->entry);

	for (int i = 0; ok && i < 7; i++)
	{
		int			att = SPI_fnumber(hdesc, report_cols[i]);
		bool		null;
		Datum		d;

		if (att <= 0)
			return false;
		d = slot_getattr(c->report, att, &null);
		ok = sh_row_set(desc, values, isnull, report_cols[i], d, null);
	}
	return ok;
}

/* Is the history row in slot the entry's current report (its object's, not stale)? */
static bool
is_current_report(TupleTableSlot *slot, CachedObject *entry)
{
	TupleDesc	desc = slot->tts_tupleDescriptor;
	int			id = SPI_fnumber(desc, "object_id");
	int			stale = SPI_fnumber(desc, "stale");
	bool		null;
	text	   *t;

	if (id <= 0 || stale <= 0)
		return false;
	t = DatumGetTextPP(slot_getattr(slot, id, &null));
	if (null || sh_text_key_match(&t, &entry->key, 0) != 0)
		return false;
	return !DatumGetBool(slot_getattr(slot, stale, &null)) && !null;
}

/*
 * Write entries whose row's TID is known by that TID, each from its current
 * report's history row (found by stamp), without a statement (rowwrite.c).
 * Only for entries none of whose pending reports can have been skipped.
 * The others are moved to the front (by swapping); returns how many.
 */
static int
write_direct(CachedObject **entries, int n)
{
	Relation	history = NULL;
	TupleTableSlot *report = NULL;
	ShRowWriter *w = NULL;
	int			rest = 0;

	for (int i = 0; i < n; i++)
	{
		CachedObject *e = entries[i];
		ReportCopy	copy = {e, NULL};

		if (ItemPointerIsValid(&e->state.tid) && !e->state.pending_may_skip && e->state.has_current)
		{
			if (w == NULL)
			{
				CommandCounterIncrement();	/* this statement's reports must be visible */
				history = table_open(sh_relation_oid("history"), AccessShareLock);
				report = table_slot_create(history, NULL);
				w = sh_rowwriter_begin(sh_relation_oid("objects"));
			}
			copy.report = report;
			if (sh_history_find_stamp(history, e->state.current_at, report) &&
				is_current_report(report, e) &&
				sh_rowwriter_update(w, &e->state.tid, object_from_report, &copy))
				continue;
		}
		entries[i] = entries[rest];
		entries[rest++] = e;
	}
	if (w != NULL)
	{
		sh_rowwriter_end(w);
		ExecDropSingleTupleTableSlot(report);
		table_close(history, AccessShareLock);
	}
	return rest;
}

/* Write the per-object rows of a batch of entries. */
static void
write_objects(CachedObject **batch, int n)
{
	int			plain = 0;

	/* Recomputing is the rare path; the rest go set-based. */
	for (int i = 0; i < n; i++)
	{
		if (batch[i]->recompute)
		{
			recompute(batch[i]);
			batch[i]->recompute = false;
			batch[i]->state.pending = 0;
			ItemPointerSetInvalid(&batch[i]->state.tid);
		}
		else
			batch[plain++] = batch[i];
	}
	if (plain == 1 && write_direct(batch, 1) > 0)
	{
		if (!write_from_copy(batch[0]) && !write_one(batch[0]))
			recompute(batch[0]);
		ItemPointerSetInvalid(&batch[0]->state.tid);
	}
	else if (plain > 1)
	{
		/*
		 * Entries none of whose pending reports can have been skipped need
		 * not count them (the costly part of a bulk write-back), and those
		 * whose row's TID is known are written by it.
		 */
		int			checked = 0;
		int			trusted;

		for (int i = 0; i < plain; i++)
			if (batch[i]->state.pending_may_skip)
			{
				CachedObject *t = batch[checked];

				batch[checked++] = batch[i];
				batch[i] = t;
			}
		trusted = write_direct(batch + checked, plain - checked);
		if ((checked > 0 && !write_many(batch, checked, write_many_plan)) ||
			(trusted > 0 && !write_many(batch + checked, trusted, write_trusted_plan)))
		{
			/* Some report is not in the history as cached: find which. */
			for (int i = 0; i < plain; i++)
				if (!write_one(batch[i]))
					recompute(batch[i]);
			trusted = plain - checked;	/* (all moved) */
		}
		for (int i = 0; i < checked + trusted; i++)
			ItemPointerSetInvalid(&batch[i]->state.tid);
	}
	for (int i = 0; i < plain; i++)
		batch[i]->state.pending = 0;
}

/*
 * Write every dirty entry back.  Called after statements, executor runs, and
 * before commit; a no-op when nothing is dirty.  The writes belong to the
 * current subtransaction: the undo images make an abort of it re-dirty them.
 * closing: the statement run at this level (its rows' triggers ran one level
 * deeper) is done, so its rows are no longer in flight; rows of statements
 * further out (a report from a user's trigger while their row waits) still are.
 */
void
sh_objects_flush(bool closing)
{
	CachedObject **batch;
	CachedObject *held[INFLIGHT_DEPTHS];
	int			nheld = 0;
	ShSavedUser saved;
	int			n = 0;

	cache_check_table();
	if (closing)
		settle_inflight_from(inflight_depth() + 1);
	if (cache == NULL || dirty_count == 0 || writing)
		return;
	for (int i = 0; i < INFLIGHT_DEPTHS; i++)
	{
		CachedObject *entry = inflight[i].entry;
		bool		was_held = false;

		if (entry == NULL)
			continue;
		for (int h = 0; h < nheld; h++)
			was_held |= held[h] == entry;
		if (stamp_stored(inflight[i].stamp) || (!entry->dirty && !was_held))
		{
			inflight[i].entry = NULL;	/* its row was there, or nothing waits for it */
			continue;
		}
		/* Its row is not in the table yet: leave it for a later write-back. */
		if (!was_held)
		{
			held[nheld++] = entry;
			set_dirty(entry, false);
		}
	}
	if (dirty_count == 0)
	{
		for (int i = 0; i < nheld; i++)
			set_dirty(held[i], true);
		return;
	}
	batch = palloc(Min(dirty_count, FLUSH_CHUNK) * sizeof(CachedObject *));
	spi_begin(&saved);
	while (!dlist_is_empty(&dirty_list))
	{
		CachedObject *entry = dlist_container(CachedObject, dirty_node,
											  dlist_head_node(&dirty_list));

		entry_save(entry);
		set_dirty(entry, false);
		batch[n++] = entry;
		if (n == FLUSH_CHUNK)
		{
			write_batch(batch, n);
			n = 0;
		}
	}
	if (n > 0)
		write_batch(batch, n);
	spi_end(&saved);
	pfree(batch);
	for (int i = 0; i < nheld; i++)
		set_dirty(held[i], true);
}

/*
 * An INSERT into the history is done (its AFTER STATEMENT trigger, which runs
 * at the depth its rows' triggers ran at): its rows are settled; write back.
 */
void
sh_objects_statement_end(void)
{
	settle_inflight_from(inflight_depth());
	sh_objects_flush(false);
}

/* Write back and forget every entry's state: SQL is about to change rows. */
void
sh_objects_invalidate(void)
{
	HASH_SEQ_STATUS seq;
	CachedObject *entry;

	if (cache == NULL)
		return;
	sh_objects_flush(false);
	hash_seq_init(&seq, cache);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		/* (Only a row in flight is still dirty: it stays ours.) */
		if (!entry->valid || entry->dirty)
			continue;
		entry_save(entry);
		entry->valid = false;
	}
}

/* ---- entry points ---- */

/*
 * Lock the object (creating its row on first report, with fence new_fence)
 * and return its state; the row lock is held to the end of the transaction.
 */
ShObjectState *
sh_objects_lock(Datum object_id, int64 new_fence)
{
	CachedObject *entry;
	text	   *key = DatumGetTextPP(object_id);
	bool		found;

	cache_check_table();
	if (cache == NULL)
		cache_create();
	entry = hash_search(cache, &key, HASH_FIND, NULL);
	if (entry == NULL && hash_get_num_entries(cache) >= cache_max_objects)
	{
		/* Full: make room.  No caller holds a state pointer across this call. */
		sh_objects_flush(false);
		cache_shrink();
	}
	if (entry == NULL)
	{
		ShObjectState state;
		MemoryContext old;

		lock_and_read(object_id, new_fence, &state);
		old = MemoryContextSwitchTo(cache_context);
		key = (text *) DatumGetPointer(datumCopy(PointerGetDatum(key), false, -1));
		MemoryContextSwitchTo(old);
		entry = hash_search(cache, &key, HASH_ENTER, &found);
		entry->key = key;
		entry->lock_level = GetCurrentTransactionNestLevel();
		entry->valid = true;
		entry->dirty = false;
		entry->recompute = false;
		entry->fence_dirty = false;
		entry->state = state;
		entry->undo = NULL;
		entry->in_nested = false;
		entry->keys = NULL;
		entry->nkeys = entry->maxkeys = 0;
		entry->keys_recompute = false;
		track_nested(entry);
	}
	else if (!entry->valid)
	{
		ShObjectState state;

		lock_and_read(object_id, new_fence, &state);
		entry_save(entry);
		entry->state = state;
		entry->valid = true;
		/* Its keys are read again too (the image keeps the old array). */
		entry->keys = NULL;
		entry->nkeys = entry->maxkeys = 0;
		entry->keys_recompute = false;
	}
	return &entry->state;
}

/* The report stamped stamp with status is now the object's current report. */
void
sh_objects_set_current(ShObjectState *state, TimestampTz stamp, const char *status,
					   const ShReportValues *report, bool may_skip)
{
	CachedObject *entry = entry_of(state);
	bool		same = state->has_current && strcmp(state->status, status) == 0;
	MemoryContext old;

	/* Keep a copy of this one report (the previous copy goes). */
	if (last_context == NULL)
		last_context = AllocSetContextCreate(TopMemoryContext, "status_history last report",
											 ALLOCSET_SMALL_SIZES);
	MemoryContextReset(last_context);
	old = MemoryContextSwitchTo(last_context);
	for (int i = 0; i < 6; i++)
	{
		int16		typlen = (i == 4 || i == 5) ? 8 : -1;	/* generation, reported_at */

		last_report.nulls[i] = report->nulls[i];
		last_report.values[i] = report->nulls[i] ? (Datum) 0 :
			datumCopy(report->values[i], typlen == 8, typlen);
	}
	MemoryContextSwitchTo(old);
	last_entry = entry;
	last_stamp = stamp;

	entry_save(entry);
	if (state->pending++ == 0)
	{
		state->pending_first = stamp;
		state->pending_may_skip = false;
	}
	state->pending_may_skip |= may_skip;
	state->status_since = same ? state->status_since : stamp;
	state->has_current = true;
	state->current_at = stamp;
	strlcpy(state->status, status, sizeof(state->status));
	set_dirty(entry, true);
	set_inflight(entry, stamp);
}

/*
 * Raise the fence of every listed object (all locked by the caller) to at
 * least fence.  The cache has it at once; the table gets it with the
 * object's next write-back (reconnect()'s copies make one right away), so
 * an object re-stamped gets one new row version, not two.
 */
void
sh_objects_raise_fences(Datum *ids, int n, int64 fence)
{
	for (int i = 0; i < n; i++)
	{
		ShObjectState *state = sh_objects_lock(ids[i], 0);
		CachedObject *entry = entry_of(state);

		if (state->fence < fence)
		{
			entry_save(entry);
			state->fence = fence;
			entry->fence_dirty = true;
			set_dirty(entry, true);
		}
	}
}

/* The entry's key for replica (NULL: the NULL key), or NULL when not cached. */
static ShKeyState *
find_key(CachedObject *entry, text *replica)
{
	for (int i = 0; i < entry->nkeys; i++)
	{
		text	   *r = entry->keys[i].replica_id;

		if (r == NULL ? replica == NULL :
			(replica != NULL && sh_text_key_match(&r, &replica, 0) == 0))
			return &entry->keys[i];
	}
	return NULL;
}

/* Add an empty key to the entry (saved for undo first). */
static ShKeyState *
add_key(CachedObject *entry, text *replica)
{
	ShKeyState *key;

	entry_save(entry);
	if (entry->nkeys == entry->maxkeys)
	{
		entry->maxkeys = Max(4, entry->maxkeys * 2);
		entry->keys = entry->keys == NULL ?
			MemoryContextAlloc(cache_context, entry->maxkeys * sizeof(ShKeyState)) :
			repalloc(entry->keys, entry->maxkeys * sizeof(ShKeyState));
	}
	key = &entry->keys[entry->nkeys++];
	memset(key, 0, sizeof(ShKeyState));
	if (replica != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(cache_context);

		key->replica_id = (text *) DatumGetPointer(datumCopy(PointerGetDatum(replica), false, -1));
		MemoryContextSwitchTo(old);
	}
	return key;
}

/*
 * The state of one key of a locked object, read from its row on first use.
 * The pointer is good until the next key of this object is added.
 */
ShKeyState *
sh_objects_key(ShObjectState *state, Datum replica_id, bool replica_null)
{
	CachedObject *entry = entry_of(state);
	text	   *replica = replica_null ? NULL : DatumGetTextPP(replica_id);
	ShKeyState *key = find_key(entry, replica);

	if (key != NULL)
		return key;
	key = add_key(entry, replica);
	sh_keys_read(PointerGetDatum(entry->key), key);
	return key;
}

/* sh_objects_prefetch_keys' found(): a key of a locked object not in its entry yet. */
static void
prefetched_key(int i, const ShKeyState *row, void *arg)
{
	Datum	   *ids = (Datum *) arg;
	text	   *id = DatumGetTextPP(ids[i]);
	CachedObject *entry = hash_search(cache, &id, HASH_FIND, NULL);
	ShKeyState *key;
	text	   *replica;

	if (entry == NULL || !entry->valid || find_key(entry, row->replica_id) != NULL)
		return;
	key = add_key(entry, row->replica_id);
	replica = key->replica_id;
	*key = *row;
	key->replica_id = replica;
}

/*
 * Read the keys that reconnect() or retire_replica() is about to append
 * copies to, for locked objects, in one pass over the key index (instead of
 * one lookup per copy): the replica's keys, or (all) every key of each
 * object, the key of its current report among them.
 */
void
sh_objects_prefetch_keys(Datum *ids, int n, Datum replica_id, bool all)
{
	if (n == 0 || cache == NULL || !sh_keys_enabled())
		return;
	sh_keys_read_many(ids, n, all ? NULL : DatumGetTextPP(replica_id), all,
					  prefetched_key, ids);
}

/*
 * A row of this key was stamped (stale or not); may_skip: it may yet be
 * skipped; seen: the key's replica reported it (not a controller's copy).
 * An imported row older than the key's newest one is no sighting either: a
 * restore that loaded replica_state first keeps the dump's last_seen_at.
 */
void
sh_objects_key_report(ShObjectState *state, ShKeyState *key, TimestampTz stamp,
					  bool stale, const char *status, bool may_skip, bool seen)
{
	CachedObject *entry = entry_of(state);

	entry_save(entry);
	if (seen && stamp > key->last_at)
		key->last_seen_at = Max(key->last_seen_at, stamp);
	key->last_at = Max(key->last_at, stamp);
	if (!stale)
	{
		if (!key->has_current || stamp > key->current_at)
		{
			if (!key->has_current || strcmp(key->status, status) != 0)
				key->status_since = stamp;
			key->has_current = true;
			key->current_at = stamp;
			strlcpy(key->status, status, sizeof(key->status));
		}
		else
			entry->keys_recompute = true;	/* a non-stale row in its past */
	}
	entry->keys_recompute |= may_skip;
	key->dirty = true;
	set_dirty(entry, true);
	set_inflight(entry, stamp);
}

/* The key reported again what it reported last (a repeat: no row). */
void
sh_objects_key_seen(ShObjectState *state, ShKeyState *key, TimestampTz seen)
{
	CachedObject *entry = entry_of(state);

	entry_save(entry);
	key->last_seen_at = Max(key->last_seen_at, seen);
	key->dirty = true;
	set_dirty(entry, true);
}

/* A non-stale row older than the current one arrived: rederive the state. */
void
sh_objects_mark_recompute(ShObjectState *state, TimestampTz stamp)
{
	CachedObject *entry = entry_of(state);

	entry_save(entry);
	entry->recompute = true;
	set_dirty(entry, true);
	set_inflight(entry, stamp);
}

/*
 * A new row is about to be processed: the previous one has been inserted or
 * skipped by now.  When it was this object's and was skipped (ON CONFLICT DO
 * NOTHING, a later trigger), the state it left (e.g. dropped) must not decide
 * this row: write the entry back now, which recomputes it from the history.
 */
void
sh_objects_row_begin(Datum object_id)
{
	int			depth = inflight_depth();
	CachedObject *entry = inflight[depth].entry;
	TimestampTz stamp = inflight[depth].stamp;
	text	   *key;
	ShSavedUser saved;

	/* This level's previous row is settled; deeper levels' statements are done. */
	settle_inflight_from(depth);
	cache_check_table();
	if (entry == NULL || cache == NULL || !entry->dirty)
		return;
	key = DatumGetTextPP(object_id);
	if (sh_text_key_match(&key, &entry->key, 0) != 0 || stamp_stored(stamp))
		return;
	entry_save(entry);
	set_dirty(entry, false);
	spi_begin(&saved);
	write_batch(&entry, 1);
	spi_end(&saved);
}

/* ---- hooks ---- */

/* Does this query insert into the history (as its main statement)? */
static bool
inserts_history(QueryDesc *queryDesc)
{
	PlannedStmt *stmt = queryDesc->plannedstmt;
	Oid			history;
	ListCell   *lc;

	if (queryDesc->operation != CMD_INSERT || stmt == NULL)
		return false;
	history = sh_relation_oid_if_exists("history");
	foreach(lc, stmt->resultRelations)
		if (rt_fetch(lfirst_int(lc), stmt->rtable)->relid == history)
			return true;
	return false;
}

/*
 * An executor stopped early fires no AFTER STATEMENT trigger: write back
 * here.  Only an INSERT into the history closes its rows; other queries may
 * run while one of its rows is in flight (a trigger, a CHECK, a policy).
 */
static void
objects_executor_finish(QueryDesc *queryDesc)
{
	if (prev_executor_finish)
		prev_executor_finish(queryDesc);
	else
		standard_ExecutorFinish(queryDesc);
	if (cache != NULL && dirty_count > 0)
		sh_objects_flush(inserts_history(queryDesc));
}

/* COPY (and CALL, DO) run no executor of their own at the top: same here. */
static void
objects_process_utility(PlannedStmt *pstmt, const char *queryString,
						bool readOnlyTree, ProcessUtilityContext context,
						ParamListInfo params, QueryEnvironment *queryEnv,
						DestReceiver *dest, QueryCompletion *qc)
{
	if (prev_process_utility)
		prev_process_utility(pstmt, queryString, readOnlyTree, context,
							 params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context,
								params, queryEnv, dest, qc);
	/* A transaction-ending command leaves no transaction to write in. */
	if (IsTransactionState())
		sh_objects_flush(context == PROCESS_UTILITY_TOPLEVEL);
}

static void
objects_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* The safety net: nothing dirty may outlive the transaction. */
			sh_objects_flush(true);
			sh_notify_pre_commit();
			break;
		case XACT_EVENT_PRE_PREPARE:
			sh_objects_flush(true);
			sh_notify_reset();	/* a prepared transaction may not NOTIFY */
			break;
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
			break;
		default:
			/* The cache context is gone with the transaction. */
			cache_context = NULL;
			cache = NULL;
			dirty_count = 0;
			writing = false;
			forget_inflight(NULL);
			last_entry = NULL;
			sh_notify_reset();
			break;
	}
}

static void
objects_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB || event == SUBXACT_EVENT_COMMIT_SUB)
		sh_notify_subxact(event == SUBXACT_EVENT_COMMIT_SUB);
	if (cache == NULL)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
		cache_abort_level(GetCurrentTransactionNestLevel());
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		cache_commit_level(GetCurrentTransactionNestLevel());
}

/* True while the extension's own SQL writes its tables. */
bool
sh_own_write(void)
{
	return writing;
}

/*
 * SQL: BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE FOR EACH STATEMENT on
 * status_history.objects, floors and replica_state.  Statements other than this file's own (the
 * owner's, or a restore) see and change what the cache describes: write it
 * back first and read rows again afterwards.
 */
Datum
status_history_objects_guard(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("objects_guard: not called by trigger manager")));
	if (!writing)
	{
		sh_objects_invalidate();
		sh_fence_forget_floors();
	}
	return PointerGetDatum(NULL);
}

/*
 * SQL: BEFORE INSERT FOR EACH ROW on status_history.objects, floors and replica_state.  A
 * row the extension did not write is a restore (pg_restore, psql < dump) or
 * an owner's import: merge it into what exists instead of failing on the
 * key, keeping the higher fence or floor.  Restoring the history rebuilds
 * each object's current report, before or after this, as a series of imports.
 */
Datum
status_history_restore_merge(PG_FUNCTION_ARGS)
{
	/*
	 * Per table: keep the higher fence and the higher floor; a key's
	 * last_seen_at is the dump's (the history's restore counts controller
	 * copies as sightings, the dump knows better).
	 */
	static const char *const merges[3] = {
		"INSERT INTO status_history.objects AS o SELECT ($1).*"
		"    ON CONFLICT (object_id) DO UPDATE"
		"   SET fence = pg_catalog.int8larger(o.fence, excluded.fence)",
		"INSERT INTO status_history.floors AS f SELECT ($1).*"
		"    ON CONFLICT (replica_id) DO UPDATE"
		"   SET generation = pg_catalog.int8larger(f.generation, excluded.generation)",
		"INSERT INTO status_history.replica_state AS k SELECT ($1).*"
		"    ON CONFLICT (object_id, replica_id) DO UPDATE"
		"   SET last_seen_at = excluded.last_seen_at"
	};
	static SPIPlanPtr plans[3] = {NULL, NULL, NULL};
	static Oid	plan_types[3] = {InvalidOid, InvalidOid, InvalidOid};
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	int			which;
	Datum		args[1];
	Oid			types[1];
	ShSavedUser saved;
	SPIPlanPtr *plan;
	int			ret;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("restore_merge: must be fired before insert for each row")));
	if (writing)
		return PointerGetDatum(trigdata->tg_trigtuple);

	rel = trigdata->tg_relation;
	which = RelationGetRelid(rel) == sh_relation_oid("objects") ? 0 :
		RelationGetRelid(rel) == sh_relation_oid("floors") ? 1 : 2;
	/*
	 * A parallel restore loads the history (whose trigger locks object rows
	 * in history order) and this table (in its own order) at once: merge
	 * only while no reporter holds rows, so that the two cannot deadlock.
	 */
	LockRelationOid(RelationGetRelid(rel), ShareRowExclusiveLock);
	types[0] = rel->rd_rel->reltype;
	args[0] = heap_copy_tuple_as_datum(trigdata->tg_trigtuple, RelationGetDescr(rel));
	plan = &plans[which];
	SPI_connect();
	sh_become_owner(RelationGetRelid(rel), &saved);
	/* The row type is the plan's parameter: a recreated extension has a new one. */
	if (*plan != NULL && plan_types[which] != types[0])
	{
		SPI_freeplan(*plan);
		*plan = NULL;
	}
	plan_types[which] = types[0];
	if (*plan == NULL)
		*plan = sh_prepare_kept(merges[which], 1, types);
	ret = sh_execute_own(*plan, args, NULL);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: merging a restored row failed: %s", SPI_result_code_string(ret));
	sh_restore_user(&saved);
	SPI_finish();
	/* Merged: the original row is not inserted. */
	return PointerGetDatum(NULL);
}

void
sh_objects_init(void)
{
	DefineCustomIntVariable("status_history.cache_max_objects",
							"Objects whose state one transaction keeps in memory.",
							"Past it, clean states are forgotten and read again when needed.",
							&cache_max_objects, 262144, 1, INT_MAX / 2,
							PGC_USERSET, 0, NULL, NULL, NULL);
	RegisterXactCallback(objects_xact_callback, NULL);
	CacheRegisterRelcacheCallback(objects_relcache_callback, (Datum) 0);
	RegisterSubXactCallback(objects_subxact_callback, NULL);
	prev_executor_finish = ExecutorFinish_hook;
	ExecutorFinish_hook = objects_executor_finish;
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = objects_process_utility;
}
