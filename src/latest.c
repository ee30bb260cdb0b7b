/*
 * latest.c — status_history.latest(): each object's newest non-stale report.
 *
 * It reads the per-object current reports kept by the insert trigger, so its
 * cost follows the number of objects, not the length of the history, and it
 * never writes (it runs on hot standbys).  Rows are fetched through a cursor
 * in batches and handed to a tuplestore, which spills to disk past work_mem,
 * so memory stays bounded however many objects there are.
 *
 * Also: sh_put_history_rows(), copying rows of the history's columns from a
 * cursor into a result of the history's row type (history_of() uses it too).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/tuplestore.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_latest);

#define LATEST_BATCH 1000

/* Same columns, in the same order, as status_history.history. */
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
 * Copy every row of an open cursor whose columns are named like the history's
 * into the result, a tuplestore of the history's row type (which spills to
 * disk past work_mem).  Columns are mapped by name: the history's row type may
 * have dropped or added columns.  Shared with history_of() (questions.c).
 */
void
sh_put_history_rows(ReturnSetInfo *rsinfo, Portal portal)
{
	int			natts = rsinfo->setDesc->natts;
	Datum	   *values = palloc0(natts * sizeof(Datum));
	bool	   *nulls = palloc(natts * sizeof(bool));
	int		   *source = palloc(natts * sizeof(int));	/* per result column, its number in the query */

	for (int a = 0; a < natts; a++)
	{
		Form_pg_attribute att = TupleDescAttr(rsinfo->setDesc, a);

		source[a] = att->attisdropped ? SPI_ERROR_NOATTRIBUTE :
			SPI_fnumber(portal->tupDesc, NameStr(att->attname));
	}
	for (;;)
	{
		SPI_cursor_fetch(portal, true, LATEST_BATCH);
		if (SPI_processed == 0)
			break;
		for (uint64 i = 0; i < SPI_processed; i++)
		{
			/* Columns the history may gain later stay NULL here. */
			for (int a = 0; a < natts; a++)
			{
				nulls[a] = true;
				if (source[a] > 0)
					values[a] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
											  source[a], &nulls[a]);
			}
			tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		}
		SPI_freetuptable(SPI_tuptable);
	}
	pfree(values);
	pfree(nulls);
	pfree(source);
}

/* SQL: status_history.latest(object_ids text[], include_dropped boolean) */
Datum
status_history_latest(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		listed = !PG_ARGISNULL(0);
	Datum		args[2];
	Portal		portal;

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
	portal = SPI_cursor_open(NULL, latest_plan(listed), args, NULL, true);
	sh_put_history_rows(rsinfo, portal);
	SPI_cursor_close(portal);
	SPI_finish();
	return (Datum) 0;
}
