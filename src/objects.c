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
 * reconnect() fills the cache for its own INSERT in one query (prefetch).
 *
 * SPI is used only on a cache miss and at write-back, as the extension owner
 * (reporters have no privileges on this table).  Plans are prepared once per
 * backend and kept.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "status_history.h"

/* Nesting deeper than this is served without the cache. */
#define MAX_STATEMENT_DEPTH 16

/* Write-backs of more objects than this go in one set-based UPDATE. */
#define SET_FLUSH_MIN 8

/*
 * status_history.cache_max_objects: objects cached at most (a few hundred
 * bytes each); past it the cache is written back and forgotten, and objects
 * seen again are read again.
 */
static int	cache_max_objects = 262144;

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
static SPIPlanPtr update_many_plan = NULL;
static SPIPlanPtr prefetch_plan = NULL;

static MemoryContext cache_context = NULL;
static HTAB *cache = NULL;
static int	statement_depth = 0;
static int	statement_levels[MAX_STATEMENT_DEPTH];	/* subtransaction nest levels */
static ShObjectState direct_state;	/* the state when not caching */

static void
prepare_plans(void)
{
	Oid			lock_types[1] = {TEXTOID};
	Oid			prefetch_types[1] = {TEXTARRAYOID};
	Oid			update_types[9] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
		TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Oid			array_types[9] = {TEXTARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID,
		TEXTARRAYOID, JSONBARRAYOID, TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID,
	TIMESTAMPTZARRAYOID};

	if (lock_plan != NULL)
		return;
	lock_plan = sh_prepare_kept(
							 "SELECT o.fence, o.occurred_at, o.status, o.status_since"
							 "  FROM status_history.objects AS o"
							 " WHERE o.object_id OPERATOR(pg_catalog.=) $1"
							 "   FOR UPDATE",
							 1, lock_types);
	/* Same columns as lock_plan, then the object id. */
	prefetch_plan = sh_prepare_kept(
								 "SELECT o.fence, o.occurred_at, o.status, o.status_since, o.object_id"
								 "  FROM status_history.objects AS o"
								 "  JOIN pg_catalog.unnest($1) AS s(id)"
								 "    ON o.object_id OPERATOR(pg_catalog.=) s.id"
								 "   FOR UPDATE OF o",
								 1, prefetch_types);
	/* Our own uncommitted row is as good as locked: others wait for us. */
	create_plan = sh_prepare_kept(
							   "INSERT INTO status_history.objects AS o (object_id) VALUES ($1)"
							   "    ON CONFLICT (object_id) DO NOTHING"
							   " RETURNING o.fence, o.occurred_at, o.status, o.status_since",
							   1, lock_types);
	update_plan = sh_prepare_kept(
							   "UPDATE status_history.objects"
							   "   SET occurred_at = $2, status = $3, error = $4, details = $5,"
							   "       replica_id = $6, generation = $7, reported_at = $8,"
							   "       status_since = $9"
							   " WHERE object_id OPERATOR(pg_catalog.=) $1",
							   9, update_types);
	update_many_plan = sh_prepare_kept(
									"UPDATE status_history.objects AS o"
									"   SET occurred_at = u.occurred_at, status = u.status, error = u.error,"
									"       details = u.details, replica_id = u.replica_id,"
									"       generation = u.generation, reported_at = u.reported_at,"
									"       status_since = u.status_since"
									"  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
									"                  pg_catalog.unnest($3), pg_catalog.unnest($4),"
									"                  pg_catalog.unnest($5), pg_catalog.unnest($6),"
									"                  pg_catalog.unnest($7), pg_catalog.unnest($8),"
									"                  pg_catalog.unnest($9))"
									"       AS u(object_id, occurred_at, status, error, details,"
									"            replica_id, generation, reported_at, status_since)"
									" WHERE o.object_id OPERATOR(pg_catalog.=) u.object_id",
									9, array_types);
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

/* Connect to SPI as the owner of the per-object state. */
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

/* Lock the object's row, creating it on first report, and read its state. */
static void
lock_and_read(Datum object_id, ShObjectState *state)
{
	Datum		args[1] = {object_id};
	ShSavedUser saved;

	spi_begin(&saved);
	for (int attempt = 0;; attempt++)
	{
		int			ret = SPI_execute_plan(lock_plan, args, NULL, false, 1);

		if (ret != SPI_OK_SELECT)
			elog(ERROR, "status_history: locking object failed: %s",
				 SPI_result_code_string(ret));
		if (SPI_processed == 1)
			break;
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
			break;
		/* Someone else created it meanwhile: lock theirs. */
	}
	read_state(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, state);
	spi_end(&saved);
}

/* Write report to the object's row as its current report; inside spi_begin. */
static void
write_current(const ShReport *report, TimestampTz status_since)
{
	Datum		args[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	int			ret;

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
	cache = hash_create("status_history object cache", 64, &ctl,
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

/* One column of the set-based write-back, as an array. */
static Datum
column_array(Datum *elems, bool *nulls, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1] = {n};
	int			lbs[1] = {1};

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

/* Write many objects back with one UPDATE ... FROM unnest(arrays). */
static void
write_many(CachedObject **entries, int n)
{
	Oid			types[9] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
		TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[9];
	Datum	   *elems = palloc(n * sizeof(Datum));
	bool	   *nulls = palloc(n * sizeof(bool));
	int			ret;

	for (int col = 0; col < 9; col++)
	{
		for (int i = 0; i < n; i++)
		{
			ShReport   *r = &entries[i]->current;

			nulls[i] = false;
			switch (col)
			{
				case 0: elems[i] = r->object_id; break;
				case 1: elems[i] = TimestampTzGetDatum(r->occurred_at); break;
				case 2: elems[i] = r->status; break;
				case 3: elems[i] = r->error; nulls[i] = r->error_null; break;
				case 4: elems[i] = r->details; nulls[i] = r->details_null; break;
				case 5: elems[i] = r->replica_id; nulls[i] = r->replica_null; break;
				case 6: elems[i] = Int64GetDatum(r->generation); break;
				case 7: elems[i] = r->reported_at; nulls[i] = r->reported_null; break;
				default: elems[i] = TimestampTzGetDatum(entries[i]->state.status_since); break;
			}
		}
		args[col] = column_array(elems, nulls, n, types[col]);
	}
	ret = SPI_execute_plan(update_many_plan, args, NULL, false, 0);
	if (ret != SPI_OK_UPDATE || SPI_processed != n)
		elog(ERROR, "status_history: writing back %d objects failed: %s, " UINT64_FORMAT " updated",
			 n, SPI_result_code_string(ret), SPI_processed);
}

/* Write every dirty object back; the caller is not yet connected to SPI. */
static void
cache_flush(void)
{
	HASH_SEQ_STATUS seq;
	CachedObject *entry;
	CachedObject **dirty;
	int			n = 0;
	ShSavedUser saved;

	if (cache == NULL)
		return;
	dirty = palloc(hash_get_num_entries(cache) * sizeof(CachedObject *));
	hash_seq_init(&seq, cache);
	while ((entry = hash_seq_search(&seq)) != NULL)
		if (entry->dirty)
			dirty[n++] = entry;
	if (n == 0)
	{
		pfree(dirty);
		return;
	}

	spi_begin(&saved);
	if (n >= SET_FLUSH_MIN)
		write_many(dirty, n);
	else
		for (int i = 0; i < n; i++)
			write_current(&dirty[i]->current, dirty[i]->state.status_since);
	spi_end(&saved);
	for (int i = 0; i < n; i++)
		dirty[i]->dirty = false;
	pfree(dirty);
}

/* Replace *dst (a copy in the cache context, or nothing) by a copy of src. */
static void
keep_copy(Datum *dst, bool was_null, Datum src, bool is_null)
{
	if (!was_null && *dst != (Datum) 0)
		pfree(DatumGetPointer(*dst));
	*dst = is_null ? (Datum) 0 : datumCopy(src, false, -1);
}

/*
 * An INSERT into the history starts: cache for its duration.  At the
 * outermost level the cache is empty, or holds what sh_objects_prefetch read.
 */
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

/* A new entry: clean, with no current report of its own yet. */
static void
init_entry(CachedObject *entry)
{
	entry->dirty = false;
	memset(&entry->current, 0, sizeof(ShReport));
	entry->current.error_null = entry->current.details_null = true;
	entry->current.replica_null = entry->current.reported_null = true;
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
	DefineCustomIntVariable("status_history.cache_max_objects",
							"Objects whose state one INSERT into the history keeps in memory.",
							"Past it, the states are written back and read again when needed.",
							&cache_max_objects, 262144, 1, INT_MAX / 2,
							PGC_USERSET, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("status_history");
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
	if (cache != NULL && hash_get_num_entries(cache) >= cache_max_objects &&
		hash_search(cache, &key, HASH_FIND, NULL) == NULL)
	{
		cache_flush();
		cache_forget();
	}
	if (cache == NULL)
		cache_create();
	entry = hash_search(cache, &key, HASH_ENTER, &found);
	if (!found)
	{
		MemoryContext old;

		/* On error the (sub)transaction aborts and forgets the whole cache. */
		init_entry(entry);
		lock_and_read(object_id, &entry->state);
		/* The key still points into the row; give the entry its own copy. */
		old = MemoryContextSwitchTo(cache_context);
		entry->key = (text *) datumCopy(PointerGetDatum(key), false, -1);
		MemoryContextSwitchTo(old);
	}
	return &entry->state;
}

/*
 * Lock the listed objects and read their states into the cache for the next
 * INSERT into the history, in one query.  reconnect() locks its scope, raises
 * the fences and then inserts one copy per object; without this every copy
 * would look its object up by itself.  Only at the outermost level: a nested
 * INSERT starts from an empty cache anyway.
 */
void
sh_objects_prefetch(Datum object_ids)
{
	Datum		args[1] = {object_ids};
	ShSavedUser saved;
	int			ret;

	if (statement_depth > 0)
		return;
	if (cache == NULL)
		cache_create();
	spi_begin(&saved);
	ret = SPI_execute_plan(prefetch_plan, args, NULL, false, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "status_history: prefetching objects failed: %s",
			 SPI_result_code_string(ret));
	for (uint64 i = 0; i < SPI_processed && i < (uint64) cache_max_objects; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		bool		isnull;
		Datum		id = SPI_getbinval(tuple, SPI_tuptable->tupdesc, 5, &isnull);
		MemoryContext old = MemoryContextSwitchTo(cache_context);
		text	   *key = (text *) datumCopy(id, false, -1);
		CachedObject *entry;
		bool		found;

		MemoryContextSwitchTo(old);
		entry = hash_search(cache, &key, HASH_ENTER, &found);
		if (found)
			continue;
		init_entry(entry);
		read_state(tuple, SPI_tuptable->tupdesc, &entry->state);
	}
	spi_end(&saved);
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
	{
		ShSavedUser saved;

		spi_begin(&saved);
		write_current(report, status_since);
		spi_end(&saved);
	}
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
