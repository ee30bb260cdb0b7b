/*
 * latest.c — status_history.latest(): each object's newest non-stale report.
 *
 * It reads the per-object current reports kept by the insert trigger, so its
 * cost follows the number of objects, not the length of the history, and it
 * never writes (it runs on hot standbys).  The executor hands its rows
 * straight to the result's tuplestore (a DestReceiver, no cursor), which
 * spills to disk past work_mem, so memory stays bounded however many objects
 * there are.
 *
 * Also: sh_put_history_rows(), running a plan whose rows are the history's
 * into a result of the history's row type (history_of() uses it too).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "nodes/params.h"
#include "tcop/dest.h"
#include "utils/tuplestore.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_latest);

/*
 * Same columns as status_history.history (copied by name), a lapsed lease
 * shown as the views show it (stalled, the lapse as error).
 */
#define LATEST_SELECT \
	"SELECT o.occurred_at, o.object_id," \
	"       CASE WHEN l.lapsed THEN 'stalled' ELSE o.status END AS status," \
	"       CASE WHEN l.lapsed" \
	"            THEN o.lapse_error" \
	"            ELSE o.error END AS error," \
	"       CASE WHEN l.lapsed THEN NULL ELSE o.details END AS details," \
	"       o.replica_id, o.generation," \
	"       CASE WHEN l.lapsed THEN o.expires_at ELSE o.reported_at END AS reported_at," \
	"       false AS stale," \
	"       CASE WHEN l.lapsed THEN NULL ELSE o.lease END AS lease" \
	"  FROM status_history.objects AS o" \
	" CROSS JOIN LATERAL (SELECT o.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed) AS l" \
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
 * A DestReceiver that puts the executor's rows into the result's tuplestore,
 * column by column by name: the result has the history's row type as it was
 * when the calling statement started, which may have dropped columns, or
 * columns added since (NULL here) or before (the query may not name them).
 */
typedef struct HistoryRowsReceiver
{
	DestReceiver pub;
	ReturnSetInfo *rsinfo;
	int		   *source;			/* per result column, its number in the rows; 0: none */
	Datum	   *values;
	bool	   *nulls;
} HistoryRowsReceiver;

/* Map the result's columns to the incoming rows' by name, once per run. */
static void
rows_startup(DestReceiver *self, int operation, TupleDesc typeinfo)
{
	HistoryRowsReceiver *r = (HistoryRowsReceiver *) self;
	TupleDesc	desc = r->rsinfo->setDesc;

	for (int a = 0; a < desc->natts; a++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, a);

		r->source[a] = 0;
		for (int i = 0; i < typeinfo->natts && !att->attisdropped; i++)
		{
			Form_pg_attribute in = TupleDescAttr(typeinfo, i);

			if (in->attisdropped || strcmp(NameStr(in->attname), NameStr(att->attname)) != 0)
				continue;
			/* A column of the same name and another type cannot be copied. */
			if (in->atttypid != att->atttypid)
				ereport(ERROR,
						(errcode(ERRCODE_DATATYPE_MISMATCH),
						 errmsg("column \"%s\" of status_history.history has changed type",
								NameStr(att->attname)),
						 errhint("Restore the column's type, or reinstall the extension.")));
			r->source[a] = i + 1;
			break;
		}
	}
}

/* One row: its columns in the result's order, then into the tuplestore. */
static bool
rows_receive(TupleTableSlot *slot, DestReceiver *self)
{
	HistoryRowsReceiver *r = (HistoryRowsReceiver *) self;
	TupleDesc	desc = r->rsinfo->setDesc;

	slot_getallattrs(slot);
	for (int a = 0; a < desc->natts; a++)
	{
		int			i = r->source[a] - 1;

		r->nulls[a] = i < 0 || slot->tts_isnull[i];
		r->values[a] = r->nulls[a] ? (Datum) 0 : slot->tts_values[i];
	}
	tuplestore_putvalues(r->rsinfo->setResult, desc, r->values, r->nulls);
	return true;
}

static void
rows_shutdown(DestReceiver *self)
{
}

static void
rows_destroy(DestReceiver *self)
{
	HistoryRowsReceiver *r = (HistoryRowsReceiver *) self;

	pfree(r->source);
	pfree(r->values);
	pfree(r->nulls);
	pfree(r);
}

/*
 * Run a kept plan (read-only) whose rows have the history's columns, and put
 * them into the result, a tuplestore of the history's row type (which spills
 * to disk past work_mem).  The executor hands each row to the receiver above,
 * as PL/pgSQL's RETURN QUERY does, with no copy through SPI's tuple table.
 * Shared with history_of() (questions.c).
 */
void
sh_put_history_rows(ReturnSetInfo *rsinfo, SPIPlanPtr plan, Datum *args)
{
	int			nargs = SPI_getargcount(plan);
	int			natts = rsinfo->setDesc->natts;
	ParamListInfo params = makeParamList(nargs);
	SPIExecuteOptions options = {0};
	HistoryRowsReceiver *dest = palloc0(sizeof(HistoryRowsReceiver));
	int			ret;

	for (int i = 0; i < nargs; i++)
	{
		params->params[i].value = args[i];
		params->params[i].isnull = false;
		params->params[i].pflags = PARAM_FLAG_CONST;
		params->params[i].ptype = SPI_getargtypeid(plan, i);
	}
	dest->pub.receiveSlot = rows_receive;
	dest->pub.rStartup = rows_startup;
	dest->pub.rShutdown = rows_shutdown;
	dest->pub.rDestroy = rows_destroy;
	dest->pub.mydest = DestTuplestore;	/* not DestNone: SPI would call the rows discarded */
	dest->rsinfo = rsinfo;
	dest->source = palloc(Max(natts, 1) * sizeof(int));
	dest->values = palloc(Max(natts, 1) * sizeof(Datum));
	dest->nulls = palloc(Max(natts, 1) * sizeof(bool));

	options.params = params;
	options.read_only = true;
	options.dest = (DestReceiver *) dest;
	ret = SPI_execute_plan_extended(plan, &options);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading rows failed: %s", SPI_result_code_string(ret));
	rows_destroy((DestReceiver *) dest);
}

/* SQL: status_history.latest(object_ids text[], include_dropped boolean) */
Datum
status_history_latest(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		listed = !PG_ARGISNULL(0);
	Datum		args[2];

	sh_check_version();
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
	SPI_connect();
	sh_put_history_rows(rsinfo, latest_plan(listed), args);
	SPI_finish();
	return (Datum) 0;
}
