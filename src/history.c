/*
 * history.c — the triggers that make status_history.history append-only,
 * and the two ways of writing to it from C: report() and report_many().
 *
 * The insert trigger is the hot path of the extension.  For each new row it
 * validates the report, locks the object (serializing reports on it), takes a
 * stamp from the clock, decides whether the report is stale (below the
 * object's fence or a generation floor, or after the object was dropped) and,
 * when it is the newest non-stale report, makes it the object's current
 * report (objects.c caches that and writes it back; the AFTER STATEMENT
 * trigger is the usual write-back point).  Only the table's owner may supply
 * occurred_at (import and restore); the clock then continues above it.
 * Another trigger refuses UPDATE, DELETE and TRUNCATE (all but prune()'s
 * own DELETE, see prune.c).
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

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_insert_trigger);
PG_FUNCTION_INFO_V1(status_history_statement_trigger);
PG_FUNCTION_INFO_V1(status_history_refuse_change);
PG_FUNCTION_INFO_V1(status_history_report);
PG_FUNCTION_INFO_V1(status_history_report_many);
PG_FUNCTION_INFO_V1(status_history_prefetch);

/* The statuses a report may carry; questions.c counts time per status by index. */
const char *const sh_statuses[SH_NSTATUSES] = {
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
	return sh_attnum(desc, "history", name) - 1;
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

/* The index of a status in sh_statuses, or -1 for an unknown one. */
int
sh_status_index(Datum status)
{
	for (int i = 0; i < SH_NSTATUSES; i++)
		if (text_equals(status, sh_statuses[i]))
			return i;
	return -1;
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
	if (sh_status_index(values[cols->status]) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid status \"%s\"", excerpt(DatumGetTextPP(values[cols->status]))),
				 errhint("Use one of starting, running, paused, stalled, ceased, dropped.")));

	if (!nulls[cols->replica_id] &&
		VARSIZE_ANY_EXHDR(DatumGetTextPP(values[cols->replica_id])) == 0 &&
		nulls[cols->occurred_at])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("replica_id must not be empty"),
				 errhint("Pass NULL for a report without a replica: an empty id could not be fenced or retired.")));
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

/*
 * status_history.max_import_lead, in milliseconds: how far ahead of the
 * server clock an imported stamp may be (-1: no limit).  Every later stamp
 * comes after an imported one, so one far in the future would freeze the
 * clock there.
 */
static int	max_import_lead = 10000;

/* status_history.deduplicate: a repeat appends no row, it moves last_seen_at. */
static bool deduplicate = true;

static void history_relcache_callback(Datum arg, Oid relid);

/*
 * A stamp already taken, committed or not, by a different report (another
 * object or status).  The same report again (a re-import) is left to the
 * primary key, so that ON CONFLICT DO NOTHING can skip it.
 */
static bool
stamp_taken(Relation rel, TimestampTz stamp, Datum object_id, Datum status,
			const HistoryColumns *cols)
{
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		taken = false;

	if (sh_history_find_stamp(rel, stamp, slot))
	{
		bool		isnull;
		Datum		o = slot_getattr(slot, cols->object_id + 1, &isnull);
		Datum		st = slot_getattr(slot, cols->status + 1, &isnull);

		taken = !DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, o, object_id)) ||
			!DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, st, status));
	}
	ExecDropSingleTupleTableSlot(slot);
	return taken;
}

/*
 * Only the owner may supply occurred_at: finite, not too far ahead of the
 * server clock (unless the clock is already past it), not taken.
 */
static void
check_imported_stamp(Relation rel, TimestampTz stamp, Datum *values, const HistoryColumns *cols)
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
	if (max_import_lead >= 0 &&
		stamp > GetCurrentTimestamp() + (int64) max_import_lead * 1000 &&
		stamp > sh_clock_last())
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("occurred_at is more than %d ms ahead of the server clock", max_import_lead),
				 errdetail("Every later stamp would come after it: the clock would stand still until then."),
				 errhint("Fix the source's clock, or raise status_history.max_import_lead (-1: no limit) for this import.")));
	if (stamp_taken(rel, stamp, values[cols->object_id], values[cols->status], cols))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("occurred_at is already the stamp of another report"),
				 errdetail("Stamps are unique: they order the reports of every object."),
				 errhint("Spread equal stamps of an import apart by a microsecond each, in the order they should sort (README: Importing history).")));
}

void
sh_history_init(void)
{
	CacheRegisterRelcacheCallback(history_relcache_callback, (Datum) 0);
	DefineCustomIntVariable("status_history.max_import_lead",
							"How far ahead of the server clock an imported occurred_at may be.",
							"-1 allows any stamp; a stamp far ahead holds every later stamp back until then.",
							&max_import_lead, 10000, -1, INT_MAX,
							PGC_USERSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomBoolVariable("status_history.deduplicate",
							 "A report that repeats its key's newest row appends no row.",
							 "It moves the key's last_seen_at instead; off records every report.",
							 &deduplicate, true, PGC_USERSET, 0, NULL, NULL, NULL);
}

/*
 * The rows report() and report_many() insert, as the insert trigger formed
 * them: they return them without RETURNING, which would need SELECT on the
 * history, a privilege a reporter does not need otherwise.
 */
static Tuplestorestate *capture = NULL;
static uint64 captured_new = 0;	/* of which rows to be inserted (not repeats) */

static void
capture_row(HeapTuple tuple, bool is_new)
{
	if (capture != NULL)
	{
		tuplestore_puttuple(capture, tuple);
		captured_new += is_new;
	}
}

/*
 * The captured rows that are in the history: a row a later trigger of the
 * user's skipped (RETURN NULL, ON CONFLICT DO NOTHING) was captured before
 * it was dropped.  A rare path: one probe by stamp per row.
 */
static Tuplestorestate *
keep_stored(Tuplestorestate *store, TupleDesc desc)
{
	Tuplestorestate *kept = tuplestore_begin_heap(false, false, work_mem);
	Relation	history = table_open(sh_relation_oid("history"), AccessShareLock);
	TupleTableSlot *row = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	TupleTableSlot *found = table_slot_create(history, NULL);
	AttrNumber	stamp = sh_attnum(desc, "history", "occurred_at");

	CommandCounterIncrement();	/* our rows of the INSERT just run */
	tuplestore_rescan(store);
	while (tuplestore_gettupleslot(store, true, false, row))
	{
		bool		isnull;
		Datum		at = slot_getattr(row, stamp, &isnull);

		if (!isnull && sh_history_find_stamp(history, DatumGetTimestampTz(at), found))
			tuplestore_puttupleslot(kept, row);
	}
	ExecDropSingleTupleTableSlot(found);
	ExecDropSingleTupleTableSlot(row);
	table_close(history, AccessShareLock);
	tuplestore_end(store);
	return kept;
}

/*
 * Run an INSERT of ours, collecting the rows it stores (or, for a repeat,
 * the row it repeats) into store.  True when a row was skipped after it was
 * captured: then keep_stored() must filter store (outside SPI, in store's
 * memory context).
 */
static bool
execute_capturing(SPIPlanPtr plan, Datum *args, const char *nulls, Tuplestorestate *store)
{
	Tuplestorestate *outer = capture;
	uint64		outer_new = captured_new;
	uint64		inserted_new;
	int			ret;

	capture = store;
	captured_new = 0;
	PG_TRY();
	{
		ret = SPI_execute_plan(plan, args, nulls, false, 0);
	}
	PG_FINALLY();
	{
		inserted_new = captured_new;
		capture = outer;
		captured_new = outer_new;
	}
	PG_END_TRY();
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: inserting reports failed: %s", SPI_result_code_string(ret));
	return SPI_processed < inserted_new;
}

/*
 * Can a row be skipped after this trigger stamped it: is there another
 * BEFORE ROW INSERT trigger (it may return NULL) or another unique or
 * exclusion index (ON CONFLICT DO NOTHING may skip on it)?  Imported stamps may also conflict
 * with the primary key.  Cached per relation until its relcache entry goes.
 */
static Oid	skip_relid = InvalidOid;
static bool skip_valid = false;
static bool skip_cached;

static bool
rows_may_skip(Relation rel)
{
	TriggerDesc *td = rel->trigdesc;
	List	   *indexes;
	ListCell   *lc;
	bool		may = false;

	if (skip_valid && skip_relid == RelationGetRelid(rel))
		return skip_cached;
	for (int i = 0; td != NULL && i < td->numtriggers && !may; i++)
	{
		Trigger    *t = &td->triggers[i];

		may = TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_BEFORE(t->tgtype) &&
			TRIGGER_FOR_INSERT(t->tgtype) && strcmp(t->tgname, "history_insert") != 0;
	}
	indexes = RelationGetIndexList(rel);
	foreach(lc, indexes)
	{
		HeapTuple	tup = SearchSysCache1(INDEXRELID, ObjectIdGetDatum(lfirst_oid(lc)));

		if (HeapTupleIsValid(tup))
		{
			Form_pg_index index = (Form_pg_index) GETSTRUCT(tup);

			/* ON CONFLICT DO NOTHING arbitrates on unique and exclusion indexes alike. */
			may |= (index->indisunique && !index->indisprimary) || index->indisexclusion;
			ReleaseSysCache(tup);
		}
	}
	list_free(indexes);
	skip_relid = RelationGetRelid(rel);
	skip_cached = may;
	skip_valid = true;
	return may;
}

static void
history_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == skip_relid)
		skip_valid = false;
}

/* Two nullable column values are equal (texts byte for byte, jsonb as jsonb). */
static bool
same_value(Datum a, bool a_null, Datum b, bool b_null, PGFunction eq)
{
	if (a_null || b_null)
		return a_null && b_null;
	return DatumGetBool(DirectFunctionCall2Coll(eq, C_COLLATION_OID, a, b));
}

/*
 * Does the report equal the stored row at stamp in status, error, details
 * and generation (and, when check_stale, in stale)?  The row's copy goes to
 * *row when asked for.
 */
static bool
same_report(Relation rel, TimestampTz stamp, Datum *values, bool *nulls, const HistoryColumns *cols,
			bool check_stale, bool stale, HeapTuple *row)
{
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		same = false;

	if (sh_history_find_stamp(rel, stamp, slot))
	{
		bool		isnull;
		bool		n1,
					n2;
		Datum		status = slot_getattr(slot, cols->status + 1, &isnull);
		Datum		error = slot_getattr(slot, cols->error + 1, &n1);
		Datum		details = slot_getattr(slot, cols->details + 1, &n2);
		Datum		generation = slot_getattr(slot, cols->generation + 1, &isnull);
		Datum		row_stale = slot_getattr(slot, cols->stale + 1, &isnull);

		same = same_value(status, false, values[cols->status], false, texteq) &&
			same_value(error, n1, values[cols->error], nulls[cols->error], texteq) &&
			same_value(details, n2, values[cols->details], nulls[cols->details], jsonb_eq) &&
			DatumGetInt64(generation) == DatumGetInt64(values[cols->generation]) &&
			(!check_stale || DatumGetBool(row_stale) == stale);
		if (same && row != NULL)
			*row = ExecCopySlotHeapTuple(slot);
	}
	ExecDropSingleTupleTableSlot(slot);
	return same;
}

/*
 * A repeat: the report equals its key's newest row (stale flag included)
 * and, unless stale, the object's current report too (so that an old
 * deployment's repeated stalled after the new one's running still becomes
 * current).  Returns the row it repeats, or NULL.
 */
static HeapTuple
repeat_of(Relation rel, const ShObjectState *state, const ShKeyState *key,
		  Datum *values, bool *nulls, const HistoryColumns *cols, bool stale)
{
	HeapTuple	row = NULL;

	if (key->last_at == 0)
		return NULL;
	/* The newest row is the key's current report, of another status: no need to look. */
	if (key->has_current && key->current_at == key->last_at &&
		!text_equals(values[cols->status], key->status))
		return NULL;
	if (!same_report(rel, key->last_at, values, nulls, cols, true, stale, &row))
		return NULL;
	if (stale || (state->has_current && state->current_at == key->last_at))
		return row;
	if (state->has_current &&
		same_report(rel, state->current_at, values, nulls, cols, false, false, NULL))
		return row;
	heap_freetuple(row);
	return NULL;
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
	int64		generation;
	int64		floor;
	TimestampTz stamp;
	char		status[16];
	ShObjectState *state;
	ShKeyState *key = NULL;
	bool		may_skip;

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
		check_imported_stamp(rel, DatumGetTimestampTz(values[cols.occurred_at]), values, &cols);
	generation = DatumGetInt64(values[cols.generation]);
	text_to_cstring_buffer(DatumGetTextPP(values[cols.status]), status, sizeof(status));
	sh_fence_note_report();

	/* The previous row is settled now (inserted or skipped). */
	sh_objects_row_begin(values[cols.object_id]);
	/* Floors first: they may make a first report stale before its row exists. */
	floor = sh_fence_floor(values[cols.replica_id], nulls[cols.replica_id]);
	/* Lock first, then stamp: stamp order is commit order per object. */
	state = sh_objects_lock(values[cols.object_id], sh_fence_new_object());
	if (imported)
	{
		stamp = DatumGetTimestampTz(values[cols.occurred_at]);
		sh_clock_observe(stamp);
	}
	else
		stamp = sh_clock_next();

	if (imported && !nulls[cols.stale])
		/* A restore or an import that says what it was: keep it. */
		stale = DatumGetBool(values[cols.stale]);
	else
		stale = (!nulls[cols.stale] && DatumGetBool(values[cols.stale])) ||
			generation < state->fence || generation < floor || floor == SH_RETIRED ||
			(state->has_current && strcmp(state->status, "dropped") == 0) ||
		/* dropped is terminal: not before reports already recorded after it */
			(state->has_current && stamp < state->current_at &&
			 strcmp(status, "dropped") == 0);

	may_skip = imported || rows_may_skip(rel);
	if (sh_keys_enabled())
	{
		key = sh_objects_key(state, values[cols.replica_id], nulls[cols.replica_id]);
		if (deduplicate && !imported && !sh_fence_in_reconnect())
		{
			HeapTuple	repeated = repeat_of(rel, state, key, values, nulls, &cols, stale);

			if (repeated != NULL)
			{
				/* No row: the key was seen (report() returns the row repeated). */
				sh_objects_key_seen(state, key, stamp);
				capture_row(repeated, false);
				return PointerGetDatum(NULL);
			}
		}
		sh_objects_key_report(state, key, stamp, stale, status, may_skip,
							  !sh_fence_in_reconnect());
	}

	if (!stale)
	{
		if (!state->has_current || stamp > state->current_at)
		{
			ShReportValues report;
			int			cols_of[6] = {cols.status, cols.error, cols.details,
				cols.replica_id, cols.generation, cols.reported_at};

			for (int i = 0; i < 6; i++)
			{
				report.values[i] = values[cols_of[i]];
				report.nulls[i] = nulls[cols_of[i]];
			}
			sh_objects_set_current(state, stamp, status, &report, may_skip);
		}
		else
			/* An import into the past may break the current run of a status. */
			sh_objects_mark_recompute(state, stamp);
	}

	values[cols.occurred_at] = TimestampTzGetDatum(stamp);
	nulls[cols.occurred_at] = false;
	values[cols.stale] = BoolGetDatum(stale);
	nulls[cols.stale] = false;
	{
		HeapTuple	stored = heap_form_tuple(desc, values, nulls);

		capture_row(stored, true);
		return PointerGetDatum(stored);
	}
}

/* SQL: AFTER INSERT FOR EACH STATEMENT: write the statement's state back */
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

	if (TRIGGER_FIRED_AFTER(trigdata->tg_event))
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
	/* prune()'s own DELETE, and nothing it sets off (prune.c). */
	if (sh_prune_take_delete() && TRIGGER_FIRED_BY_DELETE(trigdata->tg_event))
		return PointerGetDatum(NULL);
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
 * RETURNING the whole row keeps the table's row type, dropped columns and all.
 */
Datum
status_history_report(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[7] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INT8OID, TIMESTAMPTZOID};
	Datum		args[7];
	char		nulls[7];
	Tuplestorestate *store;
	TupleDesc	desc;
	TupleTableSlot *slot;
	Datum		row;
	bool		skipped;

	for (int i = 0; i < 7; i++)
	{
		args[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "status_history: report() must return the history's row type");
	store = tuplestore_begin_heap(false, false, work_mem);
	SPI_connect();
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history"
							   " (object_id, status, error, details, replica_id, generation, reported_at)"
							   " VALUES ($1, $2, $3, $4, $5, $6, $7)",
							   7, types);
	skipped = execute_capturing(plan, args, nulls, store);
	SPI_finish();
	if (skipped)
		store = keep_stored(store, desc);
	slot = MakeSingleTupleTableSlot(desc, &TTSOpsMinimalTuple);
	/* None: a trigger of the user's skipped it. */
	if (!tuplestore_gettupleslot(store, true, false, slot))
	{
		tuplestore_end(store);
		PG_RETURN_NULL();
	}
	row = ExecFetchSlotHeapTupleDatum(slot);
	tuplestore_end(store);
	PG_RETURN_DATUM(row);
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
	Oid			types[7] = {TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, JSONBARRAYOID,
		TEXTARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID};
	const char *names[7] = {"object_ids", "statuses", "errors", "details",
		"replica_ids", "generations", "reported_at"};
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	ArrayType  *ids;
	Datum	   *elems;
	bool	   *elem_nulls;
	int			n;
	Datum		args[7];
	char		nulls[7];

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
	for (int i = 0; i < 7; i++)
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
			sh_objects_lock(elems[i], sh_fence_new_object());
	}

	SPI_connect();
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history AS h"
							   " (object_id, status, error, details, replica_id, generation, reported_at)"
							   " SELECT u.o, u.s, u.e, u.d, u.r, COALESCE(u.g, 0), u.t"
							   "   FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2),"
							   "                   pg_catalog.unnest($3), pg_catalog.unnest($4),"
							   "                   pg_catalog.unnest($5), pg_catalog.unnest($6),"
							   "                   pg_catalog.unnest($7)) WITH ORDINALITY"
							   "        AS u(o, s, e, d, r, g, t, n)"
							   "  WHERE u.n OPERATOR(pg_catalog.<=) pg_catalog.cardinality($1)"
							   "  ORDER BY u.n",
							   7, types);
	if (execute_capturing(plan, args, nulls, rsinfo->setResult))
	{
		MemoryContext old;

		SPI_finish();
		old = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
		rsinfo->setResult = keep_stored(rsinfo->setResult, rsinfo->setDesc);
		MemoryContextSwitchTo(old);
	}
	else
		SPI_finish();
	return (Datum) 0;
}

/*
 * SQL (0.1.0 only): status_history.history_prefetch(text[]).  A database not
 * yet updated from 0.1.0 runs the old PL/pgSQL reconnect(), which changes
 * fences with plain SQL and then calls this: forget what the cache holds.
 */
Datum
status_history_prefetch(PG_FUNCTION_ARGS)
{
	sh_objects_invalidate();
	PG_RETURN_VOID();
}
