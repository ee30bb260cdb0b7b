/*
 * prune.c — status_history.prune(): the one sanctioned way to remove rows
 * from the append-only history, and the one-shot permission that lets its
 * own DELETE past the refusing trigger (history.c).
 *
 * What goes: per key (object_id, replica_id; a NULL replica is a key of its
 * own), every row but the newest keep_last, and, with older_than, also rows
 * stamped before now() - older_than.  What stays whatever the arguments:
 * each key's newest row, each key's newest non-stale row, and each object's
 * current report (status_history.objects.occurred_at).  The per-object state
 * (objects, floors) is never touched.
 *
 * The door: direct DELETE and TRUNCATE stay refused for everyone.  prune()
 * opens the refusing trigger for exactly one firing, at the trigger depth its
 * own DELETE fires it at, just around that DELETE; the first firing closes it
 * again.  A DELETE issued from inside that statement (an owner's trigger on
 * the history) fires the trigger at another depth or after it closed, and is
 * refused.  No setting opens it.
 *
 * Concurrency: prune takes no lock a reporter or reconnect() waits for.  It
 * never locks rows of status_history.objects (it only reads them), reporters
 * never lock history rows, and two prunes are serialized by a self-conflicting
 * lock on the function itself, which nothing else takes.  Every batch runs
 * under one snapshot taken after that lock: rows committed after prune
 * started (reports, re-stamped copies, imports with old stamps) are invisible
 * to it and cannot be removed, and the rows it protects are decided from one
 * consistent view.  The work goes in batches of objects (keyset pagination
 * over status_history.objects), each one DELETE whose candidates come from a
 * window function over that batch's rows read through the history's
 * (object_id, occurred_at) index: memory and statement size stay bounded.
 */
#include "postgres.h"

#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_prune);

/* Objects per DELETE. */
#define PRUNE_BATCH_OBJECTS 1000

/*
 * The trigger depth at which prune's own DELETE fires history_refuse_change,
 * while that DELETE runs; -1 otherwise.
 */
static int	prune_delete_depth = -1;

static int
trigger_depth(void)
{
	return DatumGetInt32(DirectFunctionCall1(pg_trigger_depth, (Datum) 0));
}

/* The statement-level firing of prune's DELETE has been let through. */
static bool prune_statement_taken = false;

/*
 * Called by history_refuse_change on every firing of a DELETE: true only
 * while prune's DELETE runs, at the depth that DELETE fires it at -- once
 * for the statement-level trigger, and for each row of its row-level one.
 * A DELETE from inside it (an owner's trigger) fires at another depth.
 */
bool
sh_prune_take_delete(bool row)
{
	if (prune_delete_depth < 0 || trigger_depth() != prune_delete_depth)
		return false;
	if (row)
		return true;
	if (prune_statement_taken)
		return false;
	prune_statement_taken = true;
	return true;
}

/*
 * An older_than reaching before the oldest timestamp PostgreSQL has (4713
 * BC): nothing is that old, so it removes nothing beyond keep_last (rather
 * than failing to compute now() - older_than).
 */
static bool
older_than_everything(Datum older_than)
{
	Interval	limit = {0};

	limit.month = 6000 * MONTHS_PER_YEAR;
	return DatumGetInt32(DirectFunctionCall2(interval_cmp, older_than,
											 IntervalPGetDatum(&limit))) > 0;
}

/* Refuse arguments prune() cannot honour; the messages say how to call it. */
static void
check_prune_args(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0) || PG_GETARG_INT32(0) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("keep_last must be at least 1"),
				 errdetail("Each key's newest report is always kept."),
				 errhint("Pass the number of newest reports to keep per object and replica, e.g. keep_last => 5.")));
	if (!PG_ARGISNULL(1))
	{
		Interval	zero = {0};

		if (DatumGetInt32(DirectFunctionCall2(interval_cmp, PG_GETARG_DATUM(1),
											  IntervalPGetDatum(&zero))) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("older_than must not be negative"),
					 errhint("Pass how old a report must be to go, e.g. older_than => '30 days', or NULL to keep_last only.")));
	}
}

/* The batch's upper bound: the PRUNE_BATCH_OBJECTS-th object after lo; NULL when none is left. */
static bool
next_bound(SPIPlanPtr plan, Datum lo, Snapshot snapshot, MemoryContext cxt, Datum *hi)
{
	Datum		args[2] = {lo, Int32GetDatum(PRUNE_BATCH_OBJECTS)};
	bool		isnull;
	Datum		d;
	int			ret;

	ret = SPI_execute_snapshot(plan, args, NULL, snapshot, InvalidSnapshot, true, false, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "status_history: reading the objects to prune failed: %s",
			 SPI_result_code_string(ret));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (!isnull)
	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		*hi = datumCopy(d, false, -1);
		MemoryContextSwitchTo(old);
	}
	SPI_freetuptable(SPI_tuptable);
	return !isnull;
}

/*
 * Run one batch's DELETE with the door open for it; returns the rows
 * removed, and raises *newest to the newest stamp removed.
 */
static uint64
delete_batch(SPIPlanPtr plan, Datum *args, const char *nulls, Snapshot snapshot,
			 TimestampTz *newest)
{
	int			ret;

	prune_delete_depth = trigger_depth() + 1;
	prune_statement_taken = false;
	PG_TRY();
	{
		ret = SPI_execute_snapshot(plan, args, nulls, snapshot, InvalidSnapshot, false, true, 0);
	}
	PG_FINALLY();
	{
		prune_delete_depth = -1;
	}
	PG_END_TRY();
	if (ret != SPI_OK_DELETE_RETURNING)
		elog(ERROR, "status_history: pruning failed: %s", SPI_result_code_string(ret));
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		TimestampTz stamp = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[i],
															  SPI_tuptable->tupdesc, 1, &isnull));

		*newest = Max(*newest, stamp);
	}
	SPI_freetuptable(SPI_tuptable);
	return SPI_processed;
}

/* The change feed learns how far rows were removed (consumers behind it lost some). */
static void
note_pruned_through(TimestampTz newest)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TIMESTAMPTZOID};
	Datum		args[1] = {TimestampTzGetDatum(newest)};

	if (plan == NULL)
		plan = sh_prepare_kept("UPDATE status_history.feed AS f"
							   "   SET pruned_through = pg_catalog.timestamptz_larger("
							   "           COALESCE(f.pruned_through, $1), $1)", 1, types);
	if (SPI_execute_plan(plan, args, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "status_history: recording how far prune() removed rows failed");
}

/*
 * SQL: status_history.prune(keep_last integer DEFAULT 5,
 *                           older_than interval DEFAULT NULL) RETURNS bigint
 * SECURITY DEFINER: the DELETE runs as the extension owner.
 */
Datum
status_history_prune(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr bound_plan = NULL;
	static SPIPlanPtr delete_plan = NULL;
	Oid			bound_types[2] = {TEXTOID, INT4OID};
	Oid			delete_types[4] = {TEXTOID, TEXTOID, INT4OID, TIMESTAMPTZOID};
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	MemoryContext bounds_cxt;
	Snapshot	snapshot;
	Datum		lo;
	Datum		hi = (Datum) 0;
	uint64		removed = 0;
	TimestampTz newest = DT_NOBEGIN;

	sh_check_version();
	check_prune_args(fcinfo);
	PreventCommandIfReadOnly("status_history.prune()");
	args[2] = PG_GETARG_DATUM(0);
	if (PG_ARGISNULL(1) || older_than_everything(PG_GETARG_DATUM(1)))
		nulls[3] = 'n';
	else
		args[3] = DirectFunctionCall2(timestamptz_mi_interval,
									  TimestampTzGetDatum(GetCurrentTransactionStartTimestamp()),
									  PG_GETARG_DATUM(1));

	/* This transaction's own reports: the state must show them before we read it. */
	sh_state_settle();
	/* One prune at a time; nothing else locks this function. */
	LockDatabaseObject(ProcedureRelationId, fcinfo->flinfo->fn_oid, 0, ExclusiveLock);
	/* Taken after the lock: an earlier prune's removals are committed and invisible. */
	snapshot = RegisterSnapshot(GetLatestSnapshot());

	bounds_cxt = AllocSetContextCreate(CurrentMemoryContext, "status_history prune bounds",
									   ALLOCSET_SMALL_SIZES);
	SPI_connect();
	if (bound_plan == NULL)
	{
		bound_plan = sh_prepare_kept("SELECT pg_catalog.max(p.object_id)"
									 "  FROM (SELECT o.object_id FROM status_history.objects AS o"
									 "         WHERE o.object_id OPERATOR(pg_catalog.>) $1"
									 "         ORDER BY o.object_id LIMIT $2) AS p",
									 2, bound_types);
		/*
		 * Per key, n counts the rows from the newest (1) down, live_n the
		 * non-stale ones among them: live_n = 1 on a non-stale row is the
		 * key's newest non-stale row.  Stamps are unique: no peers.
		 */
		delete_plan = sh_prepare_kept("DELETE FROM status_history.history AS h"
									  " USING (SELECT c.occurred_at"
									  "          FROM (SELECT x.occurred_at, x.object_id, x.stale,"
									  "                       pg_catalog.row_number() OVER w AS n,"
									  "                       pg_catalog.count(*) FILTER (WHERE NOT x.stale) OVER w AS live_n"
									  "                  FROM status_history.history AS x"
									  "                 WHERE x.object_id OPERATOR(pg_catalog.>) $1"
									  "                   AND x.object_id OPERATOR(pg_catalog.<=) $2"
									  "                WINDOW w AS (PARTITION BY x.object_id, x.replica_id"
									  "                             ORDER BY x.occurred_at DESC)) AS c"
									  "         WHERE c.n OPERATOR(pg_catalog.>) 1"
									  "           AND (c.stale OR c.live_n OPERATOR(pg_catalog.>) 1)"
									  "           AND (c.n OPERATOR(pg_catalog.>) $3"
									  "                OR c.occurred_at OPERATOR(pg_catalog.<) $4)"
									  "           AND NOT EXISTS (SELECT FROM status_history.objects AS o"
									  "                            WHERE o.object_id OPERATOR(pg_catalog.=) c.object_id"
									  "                              AND o.occurred_at OPERATOR(pg_catalog.=) c.occurred_at)"
									  "       ) AS d"
									  " WHERE h.occurred_at OPERATOR(pg_catalog.=) d.occurred_at"
									  " RETURNING h.occurred_at",
									  4, delete_types);
	}

	/* Object ids are never empty: every one sorts above ''. */
	lo = CStringGetTextDatum("");
	while (next_bound(bound_plan, lo, snapshot, bounds_cxt, &hi))
	{
		CHECK_FOR_INTERRUPTS();
		args[0] = lo;
		args[1] = hi;
		removed += delete_batch(delete_plan, args, nulls, snapshot, &newest);
		pfree(DatumGetPointer(lo));
		lo = hi;
	}

	if (removed > 0)
		note_pruned_through(newest);
	SPI_finish();
	UnregisterSnapshot(snapshot);
	MemoryContextDelete(bounds_cxt);
	PG_RETURN_INT64((int64) removed);
}
