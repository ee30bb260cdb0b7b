/*
 * history.c — the triggers that make status_history.history append-only.
 *
 * The insert trigger is the hot path of the extension.  For each new row it
 * validates the report, locks the object (serializing reports on it), takes a
 * stamp from the clock, decides whether the report is stale (below the
 * object's fence, or after the object was dropped) and, when it is the newest
 * non-stale report, makes it the object's current report (objects.c caches
 * that per statement; the statement trigger brackets it).  Only the table's
 * owner may supply occurred_at (import and restore); the clock then continues
 * above it.  Another trigger refuses UPDATE, DELETE and TRUNCATE.
 *
 * Also here: report(), which is exactly a plain INSERT with a kept plan, and
 * the SQL entry point of the prefetch that reconnect() uses.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_insert_trigger);
PG_FUNCTION_INFO_V1(status_history_statement_trigger);
PG_FUNCTION_INFO_V1(status_history_refuse_change);
PG_FUNCTION_INFO_V1(status_history_report);
PG_FUNCTION_INFO_V1(status_history_prefetch);

static const char *const known_statuses[] = {
	"starting", "running", "paused", "stalled", "ceased", "dropped"
};

/* Attribute numbers (0-based) of the columns, found by name. */
typedef struct HistoryColumns
{
	int			occurred_at;
	int			object_id;
	int			status;
	int			error;
	int			details;
	int			replica_id;
	int			generation;
	int			reported_at;
	int			stale;
} HistoryColumns;

static int
column_index(TupleDesc desc, const char *name)
{
	int			attnum = SPI_fnumber(desc, name);

	if (attnum <= 0)
		elog(ERROR, "status_history: column \"%s\" is missing from the history", name);
	return attnum - 1;
}

static void
lookup_columns(TupleDesc desc, HistoryColumns *cols)
{
	cols->occurred_at = column_index(desc, "occurred_at");
	cols->object_id = column_index(desc, "object_id");
	cols->status = column_index(desc, "status");
	cols->error = column_index(desc, "error");
	cols->details = column_index(desc, "details");
	cols->replica_id = column_index(desc, "replica_id");
	cols->generation = column_index(desc, "generation");
	cols->reported_at = column_index(desc, "reported_at");
	cols->stale = column_index(desc, "stale");
}

/* Find the columns by name; cached, as the trigger runs for every row. */
static void
history_columns(Relation rel, HistoryColumns *cols)
{
	static Oid	cached_relid = InvalidOid;
	static int	cached_natts = 0;
	static HistoryColumns cached;
	TupleDesc	desc = RelationGetDescr(rel);

	/* Positions change only when columns are added (dropped ones stay put). */
	if (RelationGetRelid(rel) != cached_relid || desc->natts != cached_natts)
	{
		cached_relid = InvalidOid;
		lookup_columns(desc, &cached);
		cached_relid = RelationGetRelid(rel);
		cached_natts = desc->natts;
	}
	*cols = cached;
}

/* True when the text equals the C string, without copying either. */
static bool
text_equals(Datum value, const char *s)
{
	text	   *t = DatumGetTextPP(value);
	size_t		len = VARSIZE_ANY_EXHDR(t);

	return len == strlen(s) && memcmp(VARDATA_ANY(t), s, len) == 0;
}

/* Refuse a call that is not a row-level BEFORE trigger of the given event. */
static void
check_trigger_call(FunctionCallInfo fcinfo, const char *funcname)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s: not called by trigger manager", funcname)));
	if (!TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s: must be fired before the event", funcname)));
}

/* A short, encoding-safe excerpt of a possibly huge value for messages. */
static char *
excerpt(text *value)
{
	char	   *s = VARDATA_ANY(value);
	int			len = VARSIZE_ANY_EXHDR(value);

	return pnstrdup(s, pg_mbcliplen(s, len, Min(len, 64)));
}

static bool
known_status(Datum status)
{
	for (int i = 0; i < lengthof(known_statuses); i++)
		if (text_equals(status, known_statuses[i]))
			return true;
	return false;
}

/* Refuse anything that is not a valid report; messages say how to fix it. */
static void
validate_report(Datum *values, bool *nulls, const HistoryColumns *cols)
{
	if (nulls[cols->object_id])
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("object_id must not be null"),
				 errhint("Every report names the object it is about.")));
	if (VARSIZE_ANY_EXHDR(DatumGetTextPP(values[cols->object_id])) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("object_id must not be empty"),
				 errhint("Every report names the object it is about.")));
	if (nulls[cols->status])
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("status must not be null"),
				 errhint("Use one of starting, running, paused, stalled, ceased, dropped.")));
	if (!known_status(values[cols->status]))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid status \"%s\"", excerpt(DatumGetTextPP(values[cols->status]))),
				 errhint("Use one of starting, running, paused, stalled, ceased, dropped.")));

	if (nulls[cols->generation])
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("generation must not be null"),
				 errhint("Omit generation to report with generation 0.")));
	if (DatumGetInt64(values[cols->generation]) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("generation must not be negative, got " INT64_FORMAT,
						DatumGetInt64(values[cols->generation])),
				 errhint("Generations start at 0 and only grow.")));
}

/* Only the owner may supply occurred_at, and only a finite one. */
static void
check_imported_stamp(Relation rel, TimestampTz stamp)
{
	if (!pg_class_ownercheck(RelationGetRelid(rel), GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("only the owner of status_history.history may supply occurred_at"),
				 errdetail("occurred_at is assigned by the database clock."),
				 errhint("Leave occurred_at out; put the reporter's own time in reported_at.")));
	if (TIMESTAMP_NOT_FINITE(stamp))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("occurred_at must be finite"),
				 errhint("Import the report with the time it actually occurred.")));
}

/* Gather what objects.c needs to store a current report. */
static void
fill_report(ShReport *report, Datum *values, bool *nulls, const HistoryColumns *cols)
{
	report->object_id = values[cols->object_id];
	report->status = values[cols->status];
	report->error = values[cols->error];
	report->error_null = nulls[cols->error];
	report->details = values[cols->details];
	report->details_null = nulls[cols->details];
	report->replica_id = values[cols->replica_id];
	report->replica_null = nulls[cols->replica_id];
	report->reported_at = values[cols->reported_at];
	report->reported_null = nulls[cols->reported_at];
	report->generation = DatumGetInt64(values[cols->generation]);
}

/* SQL: BEFORE INSERT FOR EACH ROW on status_history.history */
Datum
status_history_insert_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;
	HistoryColumns cols;
	Datum	   *values;
	bool	   *nulls;
	bool		imported;
	bool		stale;
	ShReport	report;
	ShObjectState *state;

	check_trigger_call(fcinfo, "history_insert_trigger");
	if (!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_insert_trigger: must be fired for each row on insert")));

	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	history_columns(rel, &cols);
	values = palloc(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	heap_deform_tuple(trigdata->tg_trigtuple, desc, values, nulls);

	validate_report(values, nulls, &cols);
	imported = !nulls[cols.occurred_at];
	if (imported)
		check_imported_stamp(rel, DatumGetTimestampTz(values[cols.occurred_at]));
	fill_report(&report, values, nulls, &cols);

	/* Lock first, then stamp: stamp order is commit order per object. */
	state = sh_objects_lock(report.object_id);
	if (imported)
	{
		report.occurred_at = DatumGetTimestampTz(values[cols.occurred_at]);
		sh_clock_observe(report.occurred_at);
	}
	else
		report.occurred_at = sh_clock_next();

	stale = (!nulls[cols.stale] && DatumGetBool(values[cols.stale])) ||
		report.generation < state->fence ||
		(state->has_current && strcmp(state->status, "dropped") == 0);

	if (!stale && (!state->has_current || report.occurred_at > state->current_at))
	{
		bool		same_status = state->has_current &&
			text_equals(report.status, state->status);

		sh_objects_set_current(state, &report,
							   same_status ? state->status_since : report.occurred_at);
	}

	values[cols.occurred_at] = TimestampTzGetDatum(report.occurred_at);
	nulls[cols.occurred_at] = false;
	values[cols.stale] = BoolGetDatum(stale);
	nulls[cols.stale] = false;
	return PointerGetDatum(heap_form_tuple(desc, values, nulls));
}

/* SQL: BEFORE and AFTER INSERT FOR EACH STATEMENT: the object cache's lifetime */
Datum
status_history_statement_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_statement_trigger: not called by trigger manager")));
	if (!TRIGGER_FIRED_FOR_STATEMENT(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_statement_trigger: must be fired for each statement on insert")));

	if (TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		sh_objects_statement_begin();
	else
		sh_objects_statement_end();
	return PointerGetDatum(NULL);
}

/* SQL: BEFORE UPDATE OR DELETE OR TRUNCATE FOR EACH STATEMENT */
Datum
status_history_refuse_change(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const char *what;

	check_trigger_call(fcinfo, "history_refuse_change");
	if (TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		what = "UPDATE";
	else if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		what = "DELETE";
	else
		what = "TRUNCATE";

	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("status_history.history is append-only"),
			 errdetail("%s would change or remove recorded reports.", what),
			 errhint("Append a new report with status_history.report() instead.")));
	PG_RETURN_NULL();
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
	Oid			types[7] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INT8OID, TIMESTAMPTZOID};
	Datum		args[7];
	char		nulls[7];
	int			ret;
	HeapTupleHeader row;

	for (int i = 0; i < 7; i++)
	{
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	SPI_connect();
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history"
							   " (object_id, status, error, details, replica_id, generation, reported_at)"
							   " VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING *",
							   7, types);
	ret = SPI_execute_plan(plan, args, nulls, false, 0);
	if (ret != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "status_history: report failed: %s", SPI_result_code_string(ret));
	row = SPI_returntuple(SPI_tuptable->vals[0], SPI_tuptable->tupdesc);
	SPI_finish();
	PG_RETURN_HEAPTUPLEHEADER(row);
}

/* SQL: status_history.history_prefetch(text[]) -- internal, for reconnect() */
Datum
status_history_prefetch(PG_FUNCTION_ARGS)
{
	sh_objects_prefetch(PG_GETARG_DATUM(0));
	PG_RETURN_VOID();
}
