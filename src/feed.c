/*
 * feed.c — the change feed as SQL sees it: stable_horizon(), and
 * changes(after, max_rows, skip_pruned), the rows between a consumer's
 * position and the horizon (horizon.c), read with one snapshot taken after
 * it, and refused when prune() removed rows after that position.
 */
#include "postgres.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/subtrans.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "commands/sequence.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_stable_horizon);
PG_FUNCTION_INFO_V1(status_history_changes);

/* SQL: status_history.stable_horizon() */
Datum
status_history_stable_horizon(PG_FUNCTION_ARGS)
{
	sh_check_version();
	PG_RETURN_TIMESTAMPTZ(sh_horizon_now());
}

/* Has prune() removed rows after this position? (Then a consumer there lost rows.) */
static TimestampTz
pruned_through(void)
{
	ShSavedUser saved;
	TimestampTz t = DT_NOBEGIN;
	bool		isnull;
	int			ret;

	/* (The extension's table: read as its owner.) */
	sh_become_owner(sh_relation_oid("feed"), &saved);
	ret = SPI_execute("SELECT f.pruned_through FROM status_history.feed AS f", true, 1);
	if (ret == SPI_OK_SELECT && SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			t = DatumGetTimestampTz(d);
	}
	sh_restore_user(&saved);
	return t;
}

/*
 * SQL: status_history.changes(after timestamptz, max_rows integer,
 * skip_pruned boolean) -- the history rows with after < occurred_at <
 * stable_horizon(), oldest first, at most max_rows, read with a snapshot
 * taken after the horizon.
 */
Datum
status_history_changes(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TimestampTz after = PG_ARGISNULL(0) ? DT_NOBEGIN : PG_GETARG_TIMESTAMPTZ(0);
	bool		skip = !PG_ARGISNULL(2) && PG_GETARG_BOOL(2);
	Oid			types[3] = {TIMESTAMPTZOID, TIMESTAMPTZOID, INT8OID};
	Datum		args[3];
	TimestampTz h;
	TimestampTz through;

	sh_check_version();
	if (PG_ARGISNULL(1) || PG_GETARG_INT32(1) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be at least 1"),
				 errhint("Pass how many rows one call may return, e.g. 1000.")));
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	h = sh_horizon_now();
	/*
	 * One snapshot, taken after the horizon, for how far prune() went and
	 * for the rows: every row below the horizon that committed is in it, and
	 * a prune either is (with its pruned_through) or is not.
	 */
	PushActiveSnapshot(GetLatestSnapshot());
	SPI_connect();
	through = pruned_through();
	if (after < through && !skip)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the history after %s was pruned", PG_ARGISNULL(0) ? "the beginning" : timestamptz_to_str(after)),
				 errdetail("prune() removed rows stamped up to %s; some of them may not have been read.",
						   timestamptz_to_str(through)),
				 errhint("Resynchronize (e.g. from status_history.statuses), then go on from a recent position; or pass skip_pruned => true to go on knowing rows were lost.")));
	if (plan == NULL)
		plan = sh_prepare_kept("SELECT h.* FROM status_history.history AS h"
							   " WHERE h.occurred_at OPERATOR(pg_catalog.>) $1"
							   "   AND h.occurred_at OPERATOR(pg_catalog.<) $2"
							   " ORDER BY h.occurred_at LIMIT $3", 3, types);
	args[0] = TimestampTzGetDatum(after);
	args[1] = TimestampTzGetDatum(h);
	args[2] = Int64GetDatum((int64) PG_GETARG_INT32(1));
	sh_put_history_rows(rsinfo, plan, args);
	SPI_finish();
	PopActiveSnapshot();
	return (Datum) 0;
}
