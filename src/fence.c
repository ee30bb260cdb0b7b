/*
 * fence.c — fencing: reconnect() (and the floor raising and scope locking
 * retire_replica() shares); floors.c has how reporters read the floors.
 *
 * A fence is a generation below which reports are recorded stale.  Each
 * object has its own (status_history.objects.fence, raised by reconnect()
 * under the object's row lock).  A reconnect() without an object list also
 * raises a floor in status_history.floors: database-wide (no replica) or for
 * one replica.  A report is stale when its generation is below its object's
 * fence, the database-wide floor, or its replica's floor.  Floors close the
 * gap an object list cannot: an object whose first report is still in flight
 * is invisible to reconnect(), so it cannot be locked and fenced.
 *
 * Ordering floors against reports without a lock reporters wait on:
 * - every reporting transaction takes ROW EXCLUSIVE on status_history.floors
 *   (a fast-path lock, once per transaction) before it reads the floors;
 * - reporters read the floors with a dirty snapshot, so a floor being raised
 *   by a reconnect that has not committed yet already counts (if that
 *   reconnect then rolls back, the report was stale for nothing: recorded,
 *   never lost);
 * - reconnect() raises the floor first, then waits for every transaction that
 *   held that lock before (WaitForLockers, as CREATE INDEX CONCURRENTLY does)
 *   while holding no object lock, then locks its scope.  Reports that read the
 *   old floor have committed by then and their objects are in scope.
 *
 * Deadlocks: reconnect() locks its scope in one fixed order (bytewise by
 * object id, the order report_many() uses too), so a single-object
 * transaction or a sorted multi-object one cannot close a cycle with it.  It
 * refuses, without an object list, to run in a transaction that already
 * reported: it would wait for that transaction's fellow reporters while
 * holding what they may wait for.  While it waits for one object it releases
 * the rest after status_history.reconnect_lock_timeout, waits without holding
 * anything, and starts again: one long transaction cannot freeze reports on
 * the objects reconnect() had already locked.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "parser/parse_relation.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/tuplestore.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_reconnect);

/* status_history.reconnect_lock_timeout, in milliseconds; 0: never back off. */
static int	reconnect_lock_timeout = 200;

/* ---- reconnect() ---- */

/* A retired replica never comes back. */
static void
refuse_retired(Datum replica_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("replica \"%s\" is retired", TextDatumGetCString(replica_id)),
			 errdetail("retire_replica() retired it; its reports are recorded stale."),
			 errhint("Give the new replica an id of its own.")));
}

/*
 * Refuse a generation no report or controller may have: negative, or the
 * largest bigint (the floor of a retired replica, above every generation).
 */
void
sh_check_generation(int64 generation, const char *hint)
{
	if (generation < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("generation must not be negative, got " INT64_FORMAT, generation),
				 errhint("%s", hint)));
	if (generation == SH_RETIRED)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("generation must be below " INT64_FORMAT, generation),
				 errdetail("That generation stands for a retired replica, above every generation."),
				 errhint("%s", hint)));
}

void
sh_fence_refuse(int64 generation, int64 fence, const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("generation " INT64_FORMAT " is below the fence " INT64_FORMAT " of %s",
					generation, fence, what),
			 errdetail("A controller with a newer generation has already reconnected."),
			 errhint("This controller is superseded: stop it, or reconnect with a generation at least as high as the fence.")));
}

/*
 * Refuse before raising the database-wide floor when an object's fence is
 * higher already: the scope locked later would refuse anyway, but meanwhile
 * reports would count the floor being raised (inside spi, as the owner).
 */
static void
refuse_fenced_objects(int64 generation)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(generation)};
	bool		isnull;

	if (plan == NULL)
		plan = sh_prepare_kept("SELECT o.object_id, o.fence FROM status_history.objects AS o"
							   " WHERE o.fence OPERATOR(pg_catalog.>) $1"
							   " ORDER BY o.fence DESC LIMIT 1", 1, types);
	if (sh_execute_latest(plan, args, NULL, true, 1) == SPI_OK_SELECT && SPI_processed == 1)
		sh_fence_refuse(generation,
					  DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull)),
					  psprintf("object \"%s\"",
							   TextDatumGetCString(SPI_getbinval(SPI_tuptable->vals[0],
																 SPI_tuptable->tupdesc, 1, &isnull))));
}

/*
 * Raise the database-wide floor (replica NULL) or a replica's, then wait for
 * every transaction that may have read the old one.  No-list reconnects take
 * the database-wide row first, so they queue there holding nothing another
 * reconnect's wait could be waiting for.
 */
static bool
raise_floor(int64 generation, Datum replica_id, bool replica_null, bool retire)
{
	static SPIPlanPtr lock_all = NULL;
	static SPIPlanPtr raise_all = NULL;
	static SPIPlanPtr lock_one = NULL;
	static SPIPlanPtr raise_one = NULL;
	static SPIPlanPtr retire_one = NULL;
	bool		changed = true;
	Oid			types[2] = {INT8OID, TEXTOID};
	Datum		args[2] = {Int64GetDatum(generation), replica_id};
	ShSavedUser saved;
	LOCKTAG		tag;
	Oid			relid = sh_relation_oid("floors");
	bool		isnull;
	int64		current_all;
	int			ret;

	SPI_connect();
	sh_become_owner(relid, &saved);
	/*
	 * Only the row lock may be taken before waiting for another reconnect:
	 * preparing (or running) the UPDATE takes ROW EXCLUSIVE on floors, which
	 * that reconnect's WaitForLockers would wait for in turn.
	 */
	if (lock_all == NULL)
		lock_all = sh_prepare_kept("SELECT f.generation FROM status_history.floors AS f"
								   " WHERE f.replica_id IS NULL FOR UPDATE", 0, NULL);
	ret = sh_execute_latest(lock_all, NULL, NULL, false, 0);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("the database-wide row of status_history.floors is missing"),
				 errhint("Restore it: INSERT INTO status_history.floors VALUES (NULL, 0), as the extension owner.")));
	current_all = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (raise_all == NULL)
	{
		raise_all = sh_prepare_kept("UPDATE status_history.floors AS f SET generation = $1"
									" WHERE f.replica_id IS NULL"
									"   AND f.generation OPERATOR(pg_catalog.<) $1", 1, types);
		raise_one = sh_prepare_kept("INSERT INTO status_history.floors AS f (replica_id, generation)"
									" VALUES ($2, $1) ON CONFLICT (replica_id) DO UPDATE"
									" SET generation = pg_catalog.int8larger(f.generation, $1)",
									2, types);
	}
	if (lock_one == NULL)
	{
		lock_one = sh_prepare_kept("SELECT f.generation, f.retired_at FROM status_history.floors AS f"
								   " WHERE f.replica_id OPERATOR(pg_catalog.=) $2 FOR UPDATE", 2, types);
		retire_one = sh_prepare_kept("INSERT INTO status_history.floors AS f (replica_id, generation, retired_at)"
									 " VALUES ($2, 0, status_history.monotonic_now())"
									 " ON CONFLICT (replica_id) DO UPDATE"
									 " SET retired_at = status_history.monotonic_now()"
									 " WHERE f.retired_at IS NULL",
									 2, types);
	}
	if (replica_null)
	{
		if (current_all > generation)
			sh_fence_refuse(generation, current_all, "every object (database-wide)");
		refuse_fenced_objects(generation);
		ret = sh_execute_own(raise_all, args, NULL);
	}
	else
	{
		ret = sh_execute_latest(lock_one, args, NULL, false, 0);
		if (ret == SPI_OK_SELECT && SPI_processed == 1)
		{
			int64		current = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
															  SPI_tuptable->tupdesc, 1, &isnull));

			(void) SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
			if (!isnull && !retire)
				refuse_retired(replica_id);
			if (!isnull)
				changed = false;	/* retired already: retiring again is a no-op */
			else if (current > generation && !retire)
				sh_fence_refuse(generation, current,
							  psprintf("replica \"%s\"", TextDatumGetCString(replica_id)));
		}
		ret = !changed ? SPI_OK_UPDATE :
			sh_execute_own(retire ? retire_one : raise_one, args, NULL);
	}
	if (ret != SPI_OK_UPDATE && ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: raising a floor failed: %s", SPI_result_code_string(ret));
	sh_restore_user(&saved);
	SPI_finish();
	if (!changed)
		return false;

	/* Our own reports must see it too. */
	sh_fence_forget_floors();

	SET_LOCKTAG_RELATION(tag, MyDatabaseId, relid);
	WaitForLockers(tag, ShareLock, false);
	return true;
}

/*
 * Retire a replica: from now on its reports are stale (its floor is above
 * every generation), once every reporter that read its floor before is
 * done.  False when it was retired already.
 */
bool
sh_fence_retire(Datum replica_id)
{
	return raise_floor(0, replica_id, false, true);
}

/* Bytewise order of object ids: the one order every batch locks in. */
static int
compare_ids(const void *a, const void *b)
{
	text	   *x = DatumGetTextPP(*(const Datum *) a);
	text	   *y = DatumGetTextPP(*(const Datum *) b);
	int			lx = VARSIZE_ANY_EXHDR(x);
	int			ly = VARSIZE_ANY_EXHDR(y);
	int			c = memcmp(VARDATA_ANY(x), VARDATA_ANY(y), Min(lx, ly));

	return c != 0 ? c : (lx > ly) - (lx < ly);
}

/* Sort ids and drop duplicates; returns the new count. */
int
sh_sort_ids(Datum *ids, int n)
{
	int			m = 0;

	qsort(ids, n, sizeof(Datum), compare_ids);
	for (int i = 0; i < n; i++)
		if (m == 0 || compare_ids(&ids[m - 1], &ids[i]) != 0)
			ids[m++] = ids[i];
	return m;
}

/* The ids of the objects in scope, read with the newest committed state. */
static int
scope_ids(Datum replica_id, bool replica_null, Datum **ids)
{
	static SPIPlanPtr all_plan = NULL;
	static SPIPlanPtr replica_plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {replica_id};

	if (replica_null)
		return sh_read_ids(&all_plan, "SELECT o.object_id FROM status_history.objects AS o",
						   0, NULL, NULL, ids);
	return sh_read_ids(&replica_plan, "SELECT k.object_id FROM status_history.replica_state AS k"
					   " WHERE k.replica_id OPERATOR(pg_catalog.=) $1", 1, types, args, ids);
}

/*
 * Lock one object with a blocking wait, then let it go: the holder is done.
 * An error while waiting (lock_timeout, a cancel, a deadlock) closes the
 * subtransaction before it goes on: else a caller's exception block would
 * close the wrong one and leave the session inside this transaction.
 */
static void
wait_for_object(Datum object_id)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		(void) sh_state_lock(object_id);
	}
	PG_CATCH();
	{
		ErrorData  *edata = sh_subxact_abort(cxt, owner);

		ReThrowError(edata);
	}
	PG_END_TRY();
	RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
}

static void
set_lock_timeout(int ms)
{
	(void) set_config_option("lock_timeout", psprintf("%d", ms),
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

/*
 * Lock every object in ids (sorted), creating missing ones; keep: and read
 * their states (else only their rows are locked).  One attempt runs
 * in a subtransaction whose lock waits may add up to reconnect_lock_timeout
 * (lock_timeout shrinks as it is spent); when a wait times out, everything
 * the attempt locked is released, the holder of that object is waited for
 * without holding anything, and the attempt starts over.
 */
void
sh_fence_lock_scope(Datum *ids, int n, bool keep)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	bool		back_off = reconnect_lock_timeout > 0 &&
		(LockTimeout == 0 || LockTimeout > reconnect_lock_timeout);

	for (;;)
	{
		volatile int at = 0;
		volatile bool timed_out = false;

		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(cxt);
		PG_TRY();
		{
			int			nest = NewGUCNestLevel();
			int64		waited = 0;	/* microseconds spent waiting, this attempt */
			int			timeout = reconnect_lock_timeout;

			if (back_off)
				set_lock_timeout(timeout);
			for (at = 0; at < n; at++)
			{
				TimestampTz start = back_off ? GetCurrentTimestamp() : 0;

				if (keep)
					(void) sh_state_lock(ids[at]);
				else
					sh_state_lock_row(ids[at]);
				if (back_off)
				{
					int64		took = GetCurrentTimestamp() - start;

					/* The budget is for waiting while holding the rest: spend it. */
					if (took > 1000)
						waited += took;
					if (reconnect_lock_timeout - waited / 1000 < timeout / 2)
					{
						timeout = Max(1, reconnect_lock_timeout - (int) (waited / 1000));
						set_lock_timeout(timeout);
					}
				}
			}
			AtEOXact_GUC(true, nest);
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(cxt);
			CurrentResourceOwner = owner;
		}
		PG_CATCH();
		{
			ErrorData  *edata = sh_subxact_abort(cxt, owner);

			if (!back_off || edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
				ReThrowError(edata);
			FreeErrorData(edata);
			timed_out = true;
		}
		PG_END_TRY();
		if (!timed_out)
			return;
		CHECK_FOR_INTERRUPTS();
		wait_for_object(ids[at]);
	}
}

/*
 * Hand the rows of an "INSERT ... RETURNING h" (one whole-row column of the
 * history's row type, dropped columns and all) to an SRF's tuplestore.
 */
void
sh_fence_put_returned_rows(ReturnSetInfo *rsinfo)
{
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		HeapTupleHeader row = DatumGetHeapTupleHeader(SPI_getbinval(SPI_tuptable->vals[i],
																	SPI_tuptable->tupdesc, 1, &isnull));
		HeapTupleData tuple;

		tuple.t_len = HeapTupleHeaderGetDatumLength(row);
		ItemPointerSetInvalid(&tuple.t_self);
		tuple.t_tableOid = InvalidOid;
		tuple.t_data = row;
		tuplestore_puttuple(rsinfo->setResult, &tuple);
	}
}

/*
 * Every live object's current report, as the view shows it, re-stamped:
 * the rows sh_copies_current() read, inserted from its arrays.
 */
static int
insert_current_copies(Datum *ids, int n, int64 generation)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[8] = {TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID, TEXTARRAYOID,
		TIMESTAMPTZARRAYOID, INTERVALARRAYOID, INT8OID};
	Datum		args[8];
	char		nulls[8];

	(void) sh_copies_current(ids, n, args, nulls);
	args[7] = Int64GetDatum(generation);
	nulls[7] = ' ';
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history AS h"
							   " (object_id, status, error, details, replica_id, generation, reported_at, lease)"
							   " SELECT pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3),"
							   "        pg_catalog.unnest($4), pg_catalog.unnest($5), $8,"
							   "        pg_catalog.unnest($6), pg_catalog.unnest($7)"
							   " RETURNING h", 8, types);
	return sh_execute_latest(plan, args, nulls, false, 0);
}

/* The replica's newest non-stale report of every live object, re-stamped. */
static int
insert_replica_copies(Datum *ids, int n, int64 generation, Datum replica_id)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTARRAYOID, INT8OID, TEXTOID};
	Datum		args[3];

	args[0] = PointerGetDatum(sh_text_array(ids, n));
	args[1] = Int64GetDatum(generation);
	args[2] = replica_id;
	if (plan == NULL)
		plan = sh_prepare_kept(
							   "INSERT INTO status_history.history AS h"
							   " (object_id, status, error, details, replica_id, generation, reported_at, lease)"
							   " SELECT o.object_id,"
							   "        CASE WHEN l.lapsed THEN 'stalled' ELSE r.status END,"
							   "        CASE WHEN l.lapsed THEN status_history.lapse_error(r.replica_id,"
							   "                 k.expires_at OPERATOR(pg_catalog.-) r.lease) ELSE r.error END,"
							   "        CASE WHEN l.lapsed THEN NULL ELSE r.details END,"
							   "        r.replica_id, $2,"
							   "        CASE WHEN l.lapsed THEN k.expires_at ELSE r.reported_at END,"
							   "        CASE WHEN l.lapsed THEN NULL ELSE r.lease END"
							   "   FROM pg_catalog.unnest($1) WITH ORDINALITY AS s(id, n)"
							   "   JOIN status_history.objects AS o ON o.object_id OPERATOR(pg_catalog.=) s.id"
							   "   JOIN status_history.replica_state AS k"
							   "     ON k.object_id OPERATOR(pg_catalog.=) o.object_id"
							   "    AND k.replica_id OPERATOR(pg_catalog.=) $3"
							   "   JOIN status_history.history AS r ON r.occurred_at OPERATOR(pg_catalog.=) k.occurred_at"
							   "  CROSS JOIN LATERAL (SELECT k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed) AS l"
							   "  WHERE o.occurred_at IS NOT NULL AND o.status OPERATOR(pg_catalog.<>) 'dropped'"
							   "  ORDER BY s.n"
							   " RETURNING h", 3, types);
	return sh_execute_latest(plan, args, NULL, false, 0);
}

/* Append the re-stamped copies and hand them to the caller's tuplestore. */
static void
append_copies(ReturnSetInfo *rsinfo, Datum *ids, int n, int64 generation,
			  Datum replica_id, bool replica_null)
{
	int			ret;

	SPI_connect();
	/* Runs as the caller's definer (SECURITY DEFINER): the extension owner. */
	ret = replica_null ? insert_current_copies(ids, n, generation) :
		insert_replica_copies(ids, n, generation, replica_id);
	if (ret != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "status_history: re-stamping failed: %s", SPI_result_code_string(ret));
	sh_fence_put_returned_rows(rsinfo);
	SPI_finish();
}

/* Refuse what reconnect() cannot do; the messages say how to call it. */
static void
check_reconnect_args(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("generation must not be null"),
				 errhint("Pass the generation of the controller or deployment that is reconnecting.")));
	sh_check_generation(PG_GETARG_INT64(0), "Generations start at 0 and only grow.");
	if (!PG_ARGISNULL(1) && VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(1)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("replica_id must not be empty"),
				 errhint("Pass NULL to reconnect without naming a replica.")));
	if (!PG_ARGISNULL(2) && ARR_NDIM(PG_GETARG_ARRAYTYPE_P(2)) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("object_ids must be a one-dimensional array"),
				 errhint("List object ids only, or pass NULL to reconnect every object in scope.")));
	if (PG_ARGISNULL(2))
		sh_fence_check_unreported("reconnect() without object_ids");
}

/* The listed ids, checked. */
static int
listed_ids(ArrayType *listed, Datum **ids)
{
	bool	   *nulls;
	int			n;

	deconstruct_array(listed, TEXTOID, -1, false, TYPALIGN_INT, ids, &nulls, &n);
	for (int i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("object_ids must not contain NULL"),
					 errhint("List object ids only, or pass NULL to reconnect every object in scope.")));
		if (VARSIZE_ANY_EXHDR(DatumGetTextPP((*ids)[i])) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("object_ids must not contain an empty object id"),
					 errhint("Object ids are non-empty strings.")));
	}
	return n;
}

/*
 * SQL: status_history.reconnect(generation, replica_id, object_ids)
 * Scope: the listed objects; else those replica_id reported on; else all.
 * Raises the floor (without a list), locks the scope, refuses when a fence
 * is above generation, raises the fences, and re-stamps each live object's
 * current report (or the replica's newest non-stale one) so it sorts last.
 */
Datum
status_history_reconnect(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int64		generation;
	bool		replica_null = PG_ARGISNULL(1);
	Datum		replica_id = replica_null ? (Datum) 0 : PG_GETARG_DATUM(1);
	Datum	   *ids;
	int			n;
	int			part;

	sh_check_version();
	check_reconnect_args(fcinfo);
	generation = PG_GETARG_INT64(0);
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	sh_lock_prune_eagerly(true);
	PG_TRY();
	{
		if (PG_ARGISNULL(2))
		{
			(void) raise_floor(generation, replica_id, replica_null, false);
			n = scope_ids(replica_id, replica_null, &ids);
		}
		else
		{
			int64		floor = sh_fence_committed_floor(replica_id, replica_null);

			if (!replica_null && sh_fence_floor(replica_id, false) == SH_RETIRED)
				refuse_retired(replica_id);
			/* A stale controller cannot reconnect a list either. */
			if (floor > generation)
				sh_fence_refuse(generation, floor,
								replica_null ? "every object (database-wide)" :
								psprintf("replica \"%s\" (or every object, database-wide)",
										 TextDatumGetCString(replica_id)));
			n = listed_ids(PG_GETARG_ARRAYTYPE_P(2), &ids);
		}
		n = sh_sort_ids(ids, n);
		/*
		 * A scope larger than the cache (status_history.cache_max_objects)
		 * is locked whole, keeping no state, then done in parts of half the
		 * cache, each part's states dropped after it: else every pass below
		 * would read every state again (and write each fence on its own),
		 * and the copies' INSERT, whose objects all wait for their AFTER
		 * events, would hold more states than the cache at once.
		 */
		part = n <= sh_state_cache_max() ? Max(n, 1) : Max(sh_state_cache_max() / 2, 1);
		sh_fence_lock_scope(ids, n, part >= n);
		for (int from = 0; from < n; from += part)
		{
			Datum	   *p = ids + from;
			int			m = Min(part, n - from);

			for (int i = 0; i < m; i++)
			{
				ShObject   *obj = sh_state_lock(p[i]);

				sh_state_catch_up(obj);
				if (obj->fence > generation)
					sh_fence_refuse(generation, obj->fence,
									psprintf("object \"%s\"", TextDatumGetCString(p[i])));
			}
			/* The copies below are read from the state tables: bring them up to date. */
			sh_state_settle();
			/* Raised fences are written with the copies' write-backs, or after them. */
			sh_state_raise_fences(p, m, generation);
			/*
			 * Only now: the rows folded before (a caller's earlier reports)
			 * are reports, not copies.
			 */
			sh_fence_set_in_reconnect(true);
			append_copies(rsinfo, p, m, generation, replica_id, replica_null);
			sh_state_write_fences(p, m);
			sh_fence_set_in_reconnect(false);
			if (part < n)
				sh_state_forget_settled();
		}
	}
	PG_FINALLY();
	{
		sh_fence_set_in_reconnect(false);
		sh_lock_prune_eagerly(false);
	}
	PG_END_TRY();
	return (Datum) 0;
}

void
sh_fence_init(void)
{
	DefineCustomIntVariable("status_history.reconnect_lock_timeout",
							"How long reconnect() waits for one object while holding the others it locked.",
							"Past it, reconnect() releases its locks, waits for that object without holding anything, and starts over. 0 waits indefinitely.",
							&reconnect_lock_timeout, 200, 0, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS, NULL, NULL, NULL);
}

/*
 * reconnect(): raise the fence of every listed object (locked already) to
 * at least fence.  A fence is no function of stored rows: it is written with
 * the object's next write-back (a re-stamped copy's), or by
 * sh_state_write_fences(), and until then survives the state being read
 * again (unless the subtransaction that raised it aborts).
 */
void
sh_state_raise_fences(Datum *ids, int n, int64 fence)
{
	for (int i = 0; i < n; i++)
	{
		ShObject   *obj = sh_state_lock(ids[i]);

		if (obj->fence >= fence)
			continue;
		obj->fence = fence;
		obj->fence_unwritten = true;
		obj->fence_raised_in = GetCurrentSubTransactionId();
		obj->dirty = true;
	}
}

/* Write the raised fences no write-back has written yet (fences only, by TID). */
void
sh_state_write_fences(Datum *ids, int n)
{
	ShFenceWriter *w = NULL;

	for (int i = 0; i < n; i++)
	{
		ShObject   *obj = sh_state_lock(ids[i]);

		if (!obj->fence_unwritten)
			continue;
		if (w == NULL)
			w = sh_fence_writer_begin();
		sh_write_fence(w, obj);
		obj->fence_unwritten = false;
	}
	if (w != NULL)
		sh_fence_writer_end(w);
}
