/*
 * objects.c — per-object state in status_history.objects: the fence and a
 * copy of the current (newest non-stale) report.
 *
 * The insert trigger locks an object's row before it takes a stamp, so that
 * reports on one object are serialized and stamp order equals commit order
 * for that object.  The plans are prepared once per backend and kept; the
 * caller is connected to SPI and runs as the extension owner.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/builtins.h"

#include "status_history.h"

static SPIPlanPtr lock_plan = NULL;
static SPIPlanPtr create_plan = NULL;
static SPIPlanPtr update_plan = NULL;

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
	create_plan = prepare_kept(
							   "INSERT INTO status_history.objects (object_id) VALUES ($1)"
							   "    ON CONFLICT (object_id) DO NOTHING",
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

/*
 * Lock the object's row, creating it on first report, and read its state.
 * The row lock is held to the end of the transaction.
 */
void
sh_objects_lock(Datum object_id, ShObjectState *state)
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
		if (ret != SPI_OK_INSERT)
			elog(ERROR, "status_history: creating object failed: %s",
				 SPI_result_code_string(ret));
	}
}

/* Make report the object's current report. */
void
sh_objects_set_current(const ShReport *report, TimestampTz status_since)
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
