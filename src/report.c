/*
 * report.c — report() and report_many(), the two ways of writing to the
 * history from C (each is exactly a plain INSERT, as the caller, with its
 * plan kept), and what they return: the rows as stored (or the row a
 * repeat repeats), captured by the triggers of the INSERT they run
 * (history.c calls sh_capture_before() and sh_capture_stored()).
 */
#include "postgres.h"
#include "access/table.h"
#include "access/htup_details.h"
#include "access/tableam.h"
#include "access/relscan.h"
#include "access/genam.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/guc.h"
#include "utils/fmgroids.h"
#include "executor/tuptable.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "catalog/pg_index.h"
#include "catalog/pg_trigger.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "replication/logicalworker.h"
#include "storage/proc.h"
#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_report);
PG_FUNCTION_INFO_V1(status_history_report_many);

/* ---- what report() and report_many() return ---- */

/*
 * report() and report_many() return the rows their INSERT stored (or, for a
 * repeat, the row it repeats) without RETURNING, which would need SELECT on
 * the history, a privilege a reporter does not need otherwise.  Their INSERT
 * is recognized by its command id (rows it stores carry it as cmin) and the
 * trigger depth its triggers fire at; a nested INSERT (from a trigger or a
 * constraint) has a later command id or a greater depth.
 */
typedef struct Captured
{
	const void *query;			/* the INSERT's trigger array (its result relation) */
	bool		repeat;			/* a repeat: tuple is the row it repeats */
	TimestampTz stamp;			/* else the stamp the insert trigger gave it */
	HeapTuple	tuple;
} Captured;

typedef struct Capture
{
	int			depth;			/* trigger depth of the INSERT's triggers */
	CommandId	cid;			/* the INSERT's command id */
	MemoryContext cxt;
	List	   *before;			/* Captured, in the order the insert trigger saw them */
	List	   *stored;			/* Captured, in the order they were stored */
} Capture;

static Capture *capture = NULL;

/* The trigger array of the query whose trigger this is: one per INSERT. */
static const void *
query_of(TriggerData *td)
{
	TriggerDesc *desc = td->tg_relation->trigdesc;

	for (int i = 0; desc != NULL && i < desc->numtriggers; i++)
		if (desc->triggers[i].tgoid == td->tg_trigger->tgoid)
			return td->tg_trigger - i;
	return td->tg_trigger;
}

static int
trigger_depth(void)
{
	return DatumGetInt32(DirectFunctionCall1(pg_trigger_depth, (Datum) 0));
}

/* The insert trigger's outcome for a row of the capturing INSERT. */
void
sh_capture_before(TriggerData *td, TimestampTz stamp, HeapTuple repeated)
{
	MemoryContext old;
	Captured   *c;

	if (capture == NULL || trigger_depth() != capture->depth)
		return;
	old = MemoryContextSwitchTo(capture->cxt);
	c = palloc0(sizeof(Captured));
	c->query = query_of(td);
	c->repeat = repeated != NULL;
	c->stamp = stamp;
	c->tuple = repeated != NULL ? heap_copytuple(repeated) : NULL;
	capture->before = lappend(capture->before, c);
	MemoryContextSwitchTo(old);
}

/*
 * A row just stored (the fold trigger's WHEN, which PostgreSQL evaluates
 * one trigger level above the trigger's own calls): keep it if it is a row
 * of the capturing INSERT -- its command id, at its depth.  Which INSERT's
 * trigger array it belongs to is not known here; the insert trigger's
 * outcome with the same stamp tells (execute_capturing()).
 */
void
sh_capture_stored(HeapTuple tuple, TimestampTz stamp)
{
	MemoryContext old;
	Captured   *c;

	if (capture == NULL || trigger_depth() + 1 != capture->depth ||
		HeapTupleHeaderGetCmin(tuple->t_data) != capture->cid)
		return;
	old = MemoryContextSwitchTo(capture->cxt);
	c = palloc0(sizeof(Captured));
	c->stamp = stamp;
	c->tuple = heap_copytuple(tuple);
	capture->stored = lappend(capture->stored, c);
	MemoryContextSwitchTo(old);
}

/*
 * Run our INSERT (plan), then hand its rows in order to put(): each stored
 * row as stored, each repeat as the row it repeats; a row skipped (by a
 * trigger of the user's, ON CONFLICT) is left out.
 */
static void
execute_capturing(SPIPlanPtr plan, Datum *args, const char *nulls,
				  void (*put) (HeapTuple tuple, void *arg), void *arg)
{
	Capture		mine;
	Capture    *outer = capture;
	ListCell   *lc;
	const void *query;
	volatile int ret = 0;

	mine.depth = trigger_depth() + 1;
	mine.cxt = AllocSetContextCreate(CurrentMemoryContext, "status_history capture",
									 ALLOCSET_DEFAULT_SIZES);
	mine.before = mine.stored = NIL;
	/* The INSERT's command id: SPI's increment before it is then a no-op. */
	CommandCounterIncrement();
	mine.cid = GetCurrentCommandId(false);
	capture = &mine;
	PG_TRY();
	{
		ret = SPI_execute_plan(plan, args, nulls, false, 0);
	}
	PG_FINALLY();
	{
		capture = outer;
	}
	PG_END_TRY();
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: inserting reports failed: %s", SPI_result_code_string(ret));

	/* The INSERT's own trigger array: the one its first stored row was let go by. */
	query = NULL;
	if (mine.stored != NIL)
	{
		TimestampTz first = ((Captured *) linitial(mine.stored))->stamp;

		foreach(lc, mine.before)
			if (!((Captured *) lfirst(lc))->repeat && ((Captured *) lfirst(lc))->stamp == first)
				query = ((Captured *) lfirst(lc))->query;
	}
	foreach(lc, mine.before)
	{
		Captured   *b = (Captured *) lfirst(lc);
		ListCell   *sc;

		if (query != NULL && b->query != query)
			continue;			/* a nested INSERT's, from a constraint */
		if (b->repeat)
		{
			put(b->tuple, arg);
			continue;
		}
		foreach(sc, mine.stored)
		{
			Captured   *s = (Captured *) lfirst(sc);

			if (s->stamp == b->stamp)
			{
				put(s->tuple, arg);
				mine.stored = foreach_delete_current(mine.stored, sc);
				break;
			}
		}
	}
	MemoryContextDelete(mine.cxt);
}

/* ---- report() and report_many() ---- */

/* execute_capturing's put() for report(): the first row. */
static void
put_first(HeapTuple tuple, void *arg)
{
	HeapTuple  *first = (HeapTuple *) arg;

	if (*first == NULL)
		*first = heap_copytuple(tuple);
}

/*
 * SQL: status_history.report(...) -- exactly a plain INSERT (the insert
 * trigger does the work), as the caller, with the plan kept: a SQL-language
 * function would be parsed and planned again for every calling query.
 */
Datum
status_history_report(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[8] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INT8OID, TIMESTAMPTZOID,
	INTERVALOID};
	Datum		args[8];
	char		nulls[8];
	TupleDesc	desc;
	HeapTuple	row = NULL;

	sh_check_version();
	for (int i = 0; i < 8; i++)
	{
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "status_history: report() must return the history's row type");
	SPI_connect();
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history"
							   " (object_id, status, error, details, replica_id, generation, reported_at, lease)"
							   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
							   8, types);
	execute_capturing(plan, args, nulls, put_first, &row);
	if (row != NULL)
		row = SPI_copytuple(row);
	SPI_finish();
	/* None: a trigger of the user's skipped it. */
	if (row == NULL)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(heap_copy_tuple_as_datum(row, desc));
}

/* One array argument of report_many(): NULL, or as long as object_ids. */
static Datum
batch_array(FunctionCallInfo fcinfo, int argno, int n, const char *name)
{
	ArrayType  *a;

	if (PG_ARGISNULL(argno))
		return (Datum) 0;
	a = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(a) > 1 || ArrayGetNItems(ARR_NDIM(a), ARR_DIMS(a)) != n)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array as long as object_ids", name),
				 errhint("Pass one element per report, NULL where a report has none, or NULL for the whole argument.")));
	return PointerGetDatum(a);
}

/* execute_capturing's put() for report_many(): every row, into the result. */
static void
put_result(HeapTuple tuple, void *arg)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) arg;

	tuplestore_puttuple(rsinfo->setResult, tuple);
}

/*
 * SQL: status_history.report_many(object_ids text[], statuses text[], ...)
 * -- a batch of reports that cannot deadlock with any other batch or with
 * reconnect(), whatever order the caller lists them in: every object is
 * locked first, in one fixed order, then the rows are inserted in the order
 * given (so one object's reports keep their order).
 */
Datum
status_history_report_many(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[8] = {TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID,
		TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID, INTERVALARRAYOID};
	const char *names[8] = {"object_ids", "statuses", "errors", "details",
		"replica_ids", "generations", "reported_at", "leases"};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *ids;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			n;
	Datum		args[8];
	char		nulls[8];

	sh_check_version();
	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("object_ids and statuses must not be null"),
				 errhint("Pass one object id and one status per report.")));
	ids = PG_GETARG_ARRAYTYPE_P(0);
	if (ARR_NDIM(ids) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("object_ids must be a one-dimensional array"),
				 errhint("Pass one object id per report.")));
	deconstruct_array(ids, TEXTOID, -1, false, TYPALIGN_INT, &elems, &elem_nulls, &n);
	for (int i = 0; i < 8; i++)
	{
		args[i] = i == 0 ? PointerGetDatum(ids) : batch_array(fcinfo, i, n, names[i]);
		nulls[i] = args[i] == (Datum) 0 ? 'n' : ' ';
	}

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	/* The INSERT would check this; checked first, no lock is taken without it. */
	if (pg_class_aclcheck(sh_relation_oid("history"), GetUserId(), ACL_INSERT) != ACLCHECK_OK)
		aclcheck_error(ACLCHECK_NO_PRIV, OBJECT_TABLE, "history");

	/* Lock in a fixed order first; NULL ids are refused by the insert itself. */
	{
		int			m = 0;

		for (int i = 0; i < n; i++)
			if (!elem_nulls[i] && VARSIZE_ANY_EXHDR(DatumGetTextPP(elems[i])) > 0)
				elems[m++] = elems[i];
		m = sh_sort_ids(elems, m);
		sh_fence_note_report();
		for (int i = 0; i < m; i++)
			(void) sh_state_lock(elems[i]);
	}

	SPI_connect();
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history AS h"
							   " (object_id, status, error, details, replica_id, generation, reported_at, lease)"
							   " SELECT u.o, u.s, u.e, u.d, u.r, COALESCE(u.g, 0), u.t, u.l"
							   "   FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
							   "                   pg_catalog.unnest($3), pg_catalog.unnest($4),"
							   "                   pg_catalog.unnest($5), pg_catalog.unnest($6),"
							   "                   pg_catalog.unnest($7), pg_catalog.unnest($8)) WITH ORDINALITY"
							   "        AS u(o, s, e, d, r, g, t, l, n)"
							   "  WHERE u.n OPERATOR(pg_catalog.<=) pg_catalog.cardinality($1)"
							   "  ORDER BY u.n",
							   8, types);
	execute_capturing(plan, args, nulls, put_result, rsinfo);
	SPI_finish();
	return (Datum) 0;
}
