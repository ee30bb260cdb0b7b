/*
 * objects.c — per-object state in status_history.objects: the fence and a
 * copy of the current (newest non-stale) report.
 *
 * The insert trigger locks an object's row before it takes a stamp, so that
 * reports on one object are serialized and stamp order equals commit order
 * for that object.  The row lock is held to the end of the transaction, so
 * nobody else can change the row meanwhile; that is what makes the cache
 * below safe.
 *
 * Within one INSERT statement (bracketed by the statement triggers), object
 * states are cached in a hash table and written back once per object when
 * the statement ends, instead of once per report.  Updating one row many
 * times in one transaction builds HOT chains that every later lookup must
 * walk, so a bulk INSERT of many reports per object would otherwise slow
 * down with each report.  Where no statement trigger fires (logical
 * replication apply) every report is written through at once.
 *
 * A nested INSERT (one started while another is running) first writes back
 * and forgets the cache, as reconnect() changes fences with plain SQL.  An
 * aborted subtransaction forgets the cache too: its row locks are gone.
 *
 * The caller is connected to SPI and runs as the extension owner.  Plans are
 * prepared once per backend and kept.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "status_history.h"

/* Nesting deeper than this is served without the cache. */
#define MAX_STATEMENT_DEPTH 16

typedef struct CachedObject
{
	text	   *key;			/* object id, copied into the cache context */
	ShObjectState state;
	bool		dirty;			/* current report not yet written back */
	ShReport	current;		/* datums copied into the cache context */
} CachedObject;

static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr create_plan = NULL;
static SPIPlanPtr update_plan = NULL;

static MemoryContext cache_context = NULL;
static HTAB *cache = NULL;
static int	statement_depth = 0;
static int	statement_levels[MAX_STATEMENT_DEPTH];	/* subtransaction nest levels */
static ShObjectState direct_state;	/* the state when not caching */

/* Prepare a statement once for the life of the backend. */
static SPIPlanPtr
prepare_kept(const char *sql, int nargs, Oid *argtypes)
{
	SPIPlanPtr	plan = SPI_prepare(sql, nargs, argtypes);

	if (plan == NULL)
		elog(ERROR, "status_history: SPI_prepare failed: %s",
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "status_history: SPI_keepplan failed");
	return plan;
}

static void
prepare_plans(void)
{
	Oid			lock_types[1] = {TEXTOID};
	Oid			update_types[9] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
		TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID};

	if (lock_plan != NULL)
		return;
	lock_plan = prepare_kept(
							 "SELECT o.fence, o.occurred_at, o.status, o.status_since"
							 "  FROM status_history.objects AS o"
							 " WHERE o.object_id OPERATOR(pg_catalog.=) $1"
							 "   FOR UPDATE",
							 1, lock_types);
	/* Our own uncommitted row is as good as locked: others wait for us. */
	create_plan = prepare_kept(
							   "INSERT INTO status_history.objects AS o (object_id) VALUES ($1)"
							   "    ON CONFLICT (object_id) DO NOTHING"
							   " RETURNING o.fence, o.occurred_at, o.status, o.status_since",
							   1, lock_types);
	update_plan = prepare_kept(
							   "UPDATE status_history.objects"
							   "   SET occurred_at = $2, status = $3, error = $4, details = $5,"
							   "       replica_id = $6, generation = $7, reported_at = $8,"
							   "       status_since = $9"
							   " WHERE object_id OPERATOR(pg_catalog.=) $1",
							   9, update_types);
}

/* Copy the locked row into state. */
static void
read_state(HeapTuple tuple, TupleDesc desc, ShObjectState *state)
{
	bool		isnull;
	Datum		d;

	memset(state, 0, sizeof(ShObjectState));
	state->fence = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	d = SPI_getbinval(tuple, desc, 2, &isnull);
	state->has_current = !isnull;
	if (isnull)
		return;
	state->current_at = DatumGetTimestampTz(d);
	d = SPI_getbinval(tuple, desc, 3, &isnull);
	if (!isnull)
		text_to_cstring_buffer(DatumGetTextPP(d), state->status, sizeof(state->status));
	d = SPI_getbinval(tuple, desc, 4, &isnull);
	state->status_since = isnull ? state->current_at : DatumGetTimestampTz(d);
}

/* Lock the object's row, creating it on first report, and read its state. */
static void
lock_and_read(Datum object_id, ShObjectState *state)
{
	Datum		args[1] = {object_id};

	prepare_plans();
	for (int attempt = 0;; attempt++)
	{
		int			ret = SPI_execute_plan(lock_plan, args, NULL, false, 1);

		if (ret != SPI_OK_SELECT)
			elog(ERROR, "status_history: locking object failed: %s",
				 SPI_result_code_string(ret));
		if (SPI_processed == 1)
		{
			read_state(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, state);
			return;
		}
		if (attempt > 0)
			/* Created by a transaction our snapshot cannot see. */
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to a concurrent first report on object \"%s\"",
							TextDatumGetCString(object_id)),
					 errhint("Retry the transaction.")));
		ret = SPI_execute_plan(create_plan, args, NULL, false, 0);
		if (ret != SPI_OK_INSERT_RETURNING)
			elog(ERROR, "status_history: creating object failed: %s",
				 SPI_result_code_string(ret));
		if (SPI_processed == 1)
		{
			read_state(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, state);
			return;
		}
		/* Someone else created it meanwhile: lock theirs. */
	}
}

/* Write report to the object's row as its current report. */
static void
write_current(const ShReport *report, TimestampTz status_since)
{
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			ret;

	prepare_plans();
	args[0] = report->object_id;
	args[1] = TimestampTzGetDatum(report->occurred_at);
	args[2] = report->status;
	args[3] = report->error;
	nulls[3] = report->error_null ? 'n' : ' ';
	args[4] = report->details;
	nulls[4] = report->details_null ? 'n' : ' ';
	args[5] = report->replica_id;
	nulls[5] = report->replica_null ? 'n' : ' ';
	args[6] = Int64GetDatum(report->generation);
	args[7] = report->reported_at;
	nulls[7] = report->reported_null ? 'n' : ' ';
	args[8] = TimestampTzGetDatum(status_since);

	ret = SPI_execute_plan(update_plan, args, nulls, false, 0);
	if (ret != SPI_OK_UPDATE || SPI_processed != 1)
		elog(ERROR, "status_history: updating the current report failed: %s",
			 SPI_result_code_string(ret));
}

/* ---- the statement cache ---- */

static uint32
key_hash(const void *key, Size keysize)
{
	text	   *t = *(text *const *) key;

	return DatumGetUInt32(hash_any((const unsigned char *) VARDATA_ANY(t),
								   VARSIZE_ANY_EXHDR(t)));
}

static int
key_compare(const void *key1, const void *key2, Size keysize)
{
	text	   *a = *(text *const *) key1;
	text	   *b = *(text *const *) key2;
	Size		len = VARSIZE_ANY_EXHDR(a);

	if (len != VARSIZE_ANY_EXHDR(b))
		return 1;
	return memcmp(VARDATA_ANY(a), VARDATA_ANY(b), len);
}

static void
cache_create(void)
{
	HASHCTL		ctl;

	cache_context = AllocSetContextCreate(TopTransactionContext,
										  "status_history object cache",
										  ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = sizeof(text *);
	ctl.entrysize = sizeof(CachedObject);
	ctl.hash = key_hash;
	ctl.match = key_compare;
	ctl.hcxt = cache_context;
	cache = hash_create("status_history object cache", 1024, &ctl,
						HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

/* Forget the cache without writing it back (abort, or after a flush). */
static void
cache_forget(void)
{
	if (cache_context != NULL)
		MemoryContextDelete(cache_context);
	cache_context = NULL;
	cache = NULL;
}

/* Write every dirty object back; the caller is not yet connected to SPI. */
static void
cache_flush(void)
{
	HASH_SEQ_STATUS seq;
	CachedObject *entry;
	ShSavedUser saved;

	if (cache == NULL)
		return;
	SPI_connect();
	sh_become_owner(sh_relation_oid("objects"), &saved);
	hash_seq_init(&seq, cache);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		if (!entry->dirty)
			continue;
		write_current(&entry->current, entry->state.status_since);
		entry->dirty = false;
	}
	sh_restore_user(&saved);
	SPI_finish();
}

/* Replace *dst (a copy in the cache context, or nothing) by a copy of src. */
static void
keep_copy(Datum *dst, bool was_null, Datum src, bool is_null)
{
	if (!was_null && *dst != (Datum) 0)
		pfree(DatumGetPointer(*dst));
	*dst = is_null ? (Datum) 0 : datumCopy(src, false, -1);
}

/* An INSERT into the history starts: cache for its duration. */
void
sh_objects_statement_begin(void)
{
	if (statement_depth > 0)
	{
		/* Nested: SQL may have changed fences since the cache was filled. */
		cache_flush();
		cache_forget();
	}
	if (statement_depth < MAX_STATEMENT_DEPTH)
		statement_levels[statement_depth] = GetCurrentTransactionNestLevel();
	statement_depth++;
}

/* An INSERT into the history ends: write back what it changed. */
void
sh_objects_statement_end(void)
{
	cache_flush();
	if (statement_depth > 0)
		statement_depth--;
	if (statement_depth == 0)
		cache_forget();
}

static bool
caching(void)
{
	return statement_depth > 0 && statement_depth <= MAX_STATEMENT_DEPTH;
}

/* The transaction ended: the cache context is gone with it. */
static void
objects_xact_callback(XactEvent event, void *arg)
{
	cache_context = NULL;
	cache = NULL;
	statement_depth = 0;
}

/* A subtransaction aborted: its row locks are released, and its statements ended. */
static void
objects_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						 SubTransactionId parentSubid, void *arg)
{
	int			level;

	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	cache_forget();
	level = GetCurrentTransactionNestLevel();
	while (statement_depth > 0 &&
		   (statement_depth > MAX_STATEMENT_DEPTH ||
			statement_levels[statement_depth - 1] >= level))
		statement_depth--;
}

void
sh_objects_init(void)
{
	RegisterXactCallback(objects_xact_callback, NULL);
	RegisterSubXactCallback(objects_subxact_callback, NULL);
}

/*
 * Lock the object (creating its row on first report) and return its state.
 * The row lock is held to the end of the transaction.
 */
ShObjectState *
sh_objects_lock(Datum object_id)
{
	CachedObject *entry;
	text	   *key = DatumGetTextPP(object_id);
	bool		found;

	if (!caching())
	{
		lock_and_read(object_id, &direct_state);
		return &direct_state;
	}
	if (cache == NULL)
		cache_create();
	entry = hash_search(cache, &key, HASH_ENTER, &found);
	if (!found)
	{
		MemoryContext old;

		/* On error the (sub)transaction aborts and forgets the whole cache. */
		entry->dirty = false;
		memset(&entry->current, 0, sizeof(ShReport));
		entry->current.error_null = entry->current.details_null = true;
		entry->current.replica_null = entry->current.reported_null = true;
		lock_and_read(object_id, &entry->state);
		/* The key still points into the row; give the entry its own copy. */
		old = MemoryContextSwitchTo(cache_context);
		entry->key = (text *) datumCopy(PointerGetDatum(key), false, -1);
		MemoryContextSwitchTo(old);
	}
	return &entry->state;
}

/* Make report the object's current report (state is from sh_objects_lock). */
void
sh_objects_set_current(ShObjectState *state, const ShReport *report,
					   TimestampTz status_since)
{
	state->has_current = true;
	state->current_at = report->occurred_at;
	state->status_since = status_since;
	text_to_cstring_buffer(DatumGetTextPP(report->status), state->status,
						   sizeof(state->status));

	if (state == &direct_state)
		write_current(report, status_since);
	else
	{
		CachedObject *entry = (CachedObject *) ((char *) state - offsetof(CachedObject, state));
		ShReport   *cur = &entry->current;
		MemoryContext old = MemoryContextSwitchTo(cache_context);

		/* Keep copies: the report's datums die with its row. */
		keep_copy(&cur->object_id, cur->object_id == (Datum) 0, report->object_id, false);
		keep_copy(&cur->status, cur->status == (Datum) 0, report->status, false);
		keep_copy(&cur->error, cur->error_null, report->error, report->error_null);
		keep_copy(&cur->details, cur->details_null, report->details, report->details_null);
		keep_copy(&cur->replica_id, cur->replica_null, report->replica_id, report->replica_null);
		MemoryContextSwitchTo(old);
		cur->reported_at = report->reported_at;	/* timestamptz: by value */
		cur->error_null = report->error_null;
		cur->details_null = report->details_null;
		cur->replica_null = report->replica_null;
		cur->reported_null = report->reported_null;
		cur->generation = report->generation;
		cur->occurred_at = report->occurred_at;
		entry->dirty = true;
	}
}
