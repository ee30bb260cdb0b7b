/*
 * latest.c — status_history.latest(): each object's newest non-stale report.
 *
 * It reads the per-object current reports kept by the insert trigger, so its
 * cost follows the number of objects, not the length of the history, and it
 * never writes (it runs on hot standbys).  The executor hands its rows
 * straight to the result's tuplestore, which spills to disk past work_mem, so
 * memory stays bounded however many objects there are.
 *
 * Also: sh_put_history_rows(), running a plan whose rows are the history's
 * into a result of the history's row type (history_of() uses it too).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "executor/tstoreReceiver.h"
#include "nodes/params.h"
#include "utils/tuplestore.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_latest);

/* Same columns, in the same order, as status_history.history. */
#define LATEST_COLUMNS 9
#define LATEST_SELECT \
	"SELECT o.occurred_at, o.object_id, o.status, o.error, o.details," \
	"       o.replica_id, o.generation, o.reported_at, false AS stale" \
	"  FROM status_history.objects AS o" \
	" WHERE o.occurred_at IS NOT NULL" \
	"   AND ($1 OR o.status OPERATOR(pg_catalog.<>) 'dropped')"

static SPIPlanPtr all_plan = NULL;
static SPIPlanPtr listed_plan = NULL;

/* The plan for all objects or for listed ones, prepared once and kept. */
static SPIPlanPtr
latest_plan(bool listed)
{
	SPIPlanPtr *slot = listed ? &listed_plan : &all_plan;
	Oid			types[2] = {BOOLOID, TEXTARRAYOID};

	if (*slot == NULL)
		*slot = sh_prepare_kept(listed ?
								LATEST_SELECT " AND o.object_id OPERATOR(pg_catalog.=) ANY ($2)" :
								LATEST_SELECT,
								listed ? 2 : 1, types);
	return *slot;
}

/*
 * Run a kept plan (read-only) and put its rows straight into the result's
 * tuplestore, which spills to disk past work_mem.  The plan's columns are the
 * result's by position (the history's row type, where dropped columns are
 * skipped); the executor's rows go to the tuplestore through a DestReceiver,
 * as PL/pgSQL's RETURN QUERY does, with no copy in between.  Shared with
 * history_of() (questions.c).
 */
void
sh_put_history_rows(ReturnSetInfo *rsinfo, SPIPlanPtr plan, Datum *args)
{
	int			nargs = SPI_getargcount(plan);
	ParamListInfo params = makeParamList(nargs);
	SPIExecuteOptions options = {0};
	DestReceiver *dest = CreateDestReceiver(DestTuplestore);
	int			ret;

	for (int i = 0; i < nargs; i++)
	{
		params->params[i].value = args[i];
		params->params[i].isnull = false;
		params->params[i].pflags = PARAM_FLAG_CONST;
		params->params[i].ptype = SPI_getargtypeid(plan, i);
	}
	SetTuplestoreDestReceiverParams(dest, rsinfo->setResult,
									rsinfo->econtext->ecxt_per_query_memory, false,
									rsinfo->setDesc,
									"the history has columns this version of status_history does not know");
	options.params = params;
	options.read_only = true;
	options.dest = dest;
	ret = SPI_execute_plan_extended(plan, &options);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading rows failed: %s", SPI_result_code_string(ret));
	dest->rDestroy(dest);
}

/*
 * The result has the history's row type; a column someone added to the
 * history has no value here, so say so rather than guess.
 */
static void
check_result_columns(TupleDesc desc)
{
	int			live = 0;

	for (int a = 0; a < desc->natts; a++)
		if (!TupleDescAttr(desc, a)->attisdropped)
			live++;
	if (live != LATEST_COLUMNS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("status_history.history has %d columns, latest() knows %d", live, LATEST_COLUMNS),
				 errhint("Drop the columns added to status_history.history, or read status_history.statuses.")));
}

/* SQL: status_history.latest(object_ids text[], include_dropped boolean) */
Datum
status_history_latest(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		listed = !PG_ARGISNULL(0);
	Datum		args[2];

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("include_dropped must not be null"),
				 errhint("Pass true to include dropped objects, false to leave them out.")));
	if (listed)
		sh_check_id_list(PG_GETARG_DATUM(0));
	args[0] = PG_GETARG_DATUM(1);
	args[1] = listed ? PG_GETARG_DATUM(0) : (Datum) 0;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	check_result_columns(rsinfo->setDesc);
	SPI_connect();
	sh_put_history_rows(rsinfo, latest_plan(listed), args);
	SPI_finish();
	return (Datum) 0;
}
