/*
 * history.c — the triggers on status_history.history (report.c has the
 * two ways of writing to it from C, report() and report_many()).
 *
 * The write path, per row (docs/WRITE_PATH.md has the whole picture):
 *   BEFORE ROW (history_insert)  validates the report, locks its object
 *       (state.c; serializing reports on it), catches the object's state up
 *       with every stored row, takes a stamp from the clock, and decides,
 *       from stored rows and the locked row only, whether the report is
 *       stale (below a fence or floor, after dropped) or a repeat (no row:
 *       the key's last_seen_at moves instead, written at once).
 *   WHEN of AFTER ROW (history_fold: history_stored())  gets the row as
 *       PostgreSQL stores it: it is folded into the object's state
 *       (state.c), written back at the end of the statement, and handed
 *       to report() if it is one of its rows; no event is queued.
 * Only the table's owner may supply occurred_at (import and restore); the
 * clock then continues above it.  Another trigger refuses UPDATE, DELETE
 * and TRUNCATE (all but prune()'s own DELETE, see prune.c).
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
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/fmgrprotos.h"
#include "storage/itemptr.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_insert_trigger);
PG_FUNCTION_INFO_V1(status_history_fold_trigger);
PG_FUNCTION_INFO_V1(status_history_history_stored);
PG_FUNCTION_INFO_V1(status_history_history_written);
PG_FUNCTION_INFO_V1(status_history_refuse_change);

/* The statuses a report may carry; questions.c counts time per status by index. */
const char *const sh_statuses[SH_NSTATUSES] = {
	"starting", "running", "paused", "stalled", "ceased", "dropped"
};

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

/* values[] and nulls[] are 0-based: a column's slot in them. */
#define AT(att) ((att) - 1)

/* Refuse anything that is not a valid report; messages say how to fix it. */
static void
validate_report(Datum *values, bool *nulls, const ShHistoryCols *cols)
{
	if (nulls[AT(cols->object_id)])
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("object_id must not be null"),
				 errhint("Every report names the object it is about.")));
	if (VARSIZE_ANY_EXHDR(DatumGetTextPP(values[AT(cols->object_id)])) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("object_id must not be empty"),
				 errhint("Every report names the object it is about.")));
	if (nulls[AT(cols->status)])
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("status must not be null"),
				 errhint("Use one of starting, running, paused, stalled, ceased, dropped.")));
	if (sh_status_index(values[AT(cols->status)]) < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid status \"%s\"", excerpt(DatumGetTextPP(values[AT(cols->status)]))),
				 errhint("Use one of starting, running, paused, stalled, ceased, dropped.")));

	if (!nulls[AT(cols->replica_id)] &&
		VARSIZE_ANY_EXHDR(DatumGetTextPP(values[AT(cols->replica_id)])) == 0 &&
		nulls[AT(cols->occurred_at)])
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("replica_id must not be empty"),
				 errhint("Pass NULL for a report without a replica: an empty id could not be fenced or retired.")));
	if (nulls[AT(cols->generation)])
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("generation must not be null"),
				 errhint("Omit generation to report with generation 0.")));
	sh_check_generation(DatumGetInt64(values[AT(cols->generation)]), "Generations start at 0 and only grow.");
}

/*
 * status_history.max_import_lead, in milliseconds: how far ahead of the
 * server clock an imported stamp may be (-1: no limit).  Every later stamp
 * comes after an imported one, so one far in the future would freeze the
 * clock there.  Only a superuser may change it: an importer could otherwise
 * move every later stamp to the end of time (the clock's bound is
 * persisted before the import commits).
 */
static int	max_import_lead = 10000;

/* status_history.deduplicate: a repeat appends no row, it moves last_seen_at. */
static bool deduplicate = true;

/* status_history.notice_stale: a report recorded stale says so (NOTICE). */
static bool notice_stale = false;

/* Tell the reporter its report is recorded stale, and why (notice_stale). */
static void
report_stale(ShObject *obj, const char *status, int64 generation, int64 floor)
{
	const char *why;

	if (floor == SH_RETIRED)
		why = "its replica was retired";
	else if (generation < obj->fence)
		why = psprintf("its generation %lld is below the object's fence %lld",
					   (long long) generation, (long long) obj->fence);
	else if (generation < floor)
		why = psprintf("its generation %lld is below the floor %lld", (long long) generation,
					   (long long) floor);
	else if (obj->has_current && strcmp(obj->status, "dropped") == 0)
		why = "the object was dropped";
	else if (strcmp(status, "dropped") == 0)
		why = "a dropped report cannot come before reports already recorded";
	else
		why = "it was given as stale";
	ereport(NOTICE,
			(errmsg("report on object \"%s\" recorded stale: %s", text_to_cstring(obj->id), why),
			 errdetail("A stale report is kept in the history but never becomes current."),
			 errhint("A controller took over with a higher generation (reconnect()): report with its generation, or stop this reporter.")));
}

/*
 * A stamp already taken, committed or not, by a different report (another
 * object or status).  The same report again (a re-import) is left to the
 * primary key, so that ON CONFLICT DO NOTHING can skip it.
 */
static bool
stamp_taken(Relation rel, TimestampTz stamp, Datum object_id, Datum status,
			const ShHistoryCols *cols)
{
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		taken = false;

	if (sh_history_find_stamp(rel, stamp, slot))
	{
		bool		isnull;
		Datum		o = slot_getattr(slot, cols->object_id, &isnull);
		Datum		st = slot_getattr(slot, cols->status, &isnull);

		taken = !DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, o, object_id)) ||
			!DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, st, status));
	}
	ExecDropSingleTupleTableSlot(slot);
	return taken;
}

/*
 * The admin role of status_history.roles (InvalidOid: none), read once per
 * transaction: its members may import.
 */
static Oid
admin_role(void)
{
	static LocalTransactionId read_in = InvalidLocalTransactionId;
	static Oid	admin = InvalidOid;
	ShSavedUser saved;
	bool		isnull;

	if (read_in == MyProc->lxid)
		return admin;
	SPI_connect();
	sh_become_owner(sh_relation_oid("roles"), &saved);
	if (SPI_execute("SELECT r.admin FROM status_history.roles AS r", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading status_history.roles failed");
	admin = SPI_processed == 1 ?
		DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)) :
		InvalidOid;
	if (isnull)
		admin = InvalidOid;
	sh_restore_user(&saved);
	SPI_finish();
	read_in = MyProc->lxid;
	return admin;
}

/*
 * Importers: superusers, and members of the admin role (grant_roles()).
 * Not the table's owner as such: the tables belong to the extension's owner.
 */
static bool
may_import(void)
{
	Oid			admin;

	if (superuser())
		return true;
	admin = admin_role();
	return OidIsValid(admin) && has_privs_of_role(GetUserId(), admin);
}

/*
 * Only importers may supply occurred_at: finite, not too far ahead of the
 * server clock (unless the clock is already past it, or the row comes from
 * logical replication: the publisher's clock), not taken.
 */
static void
check_imported_stamp(Relation rel, TimestampTz stamp, Datum *values, const ShHistoryCols *cols)
{
	if (!may_import())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("only superusers and members of the admin role of status_history may supply occurred_at"),
				 errdetail("occurred_at is assigned by the database clock; the admin role is the one status_history.grant_roles() recorded."),
				 errhint("Leave occurred_at out; put the reporter's own time in reported_at.")));
	if (TIMESTAMP_NOT_FINITE(stamp))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("occurred_at must be finite"),
				 errhint("Import the report with the time it actually occurred.")));
	if (max_import_lead >= 0 && !IsLogicalWorker() &&
		stamp > GetCurrentTimestamp() + (int64) max_import_lead * 1000 &&
		stamp > sh_clock_last())
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("occurred_at is more than %d ms ahead of the server clock", max_import_lead),
				 errdetail("Every later stamp would come after it: the clock would stand still until then."),
				 errhint("Fix the source's clock, or raise status_history.max_import_lead (-1: no limit) for this import.")));
	if (stamp_taken(rel, stamp, values[AT(cols->object_id)], values[AT(cols->status)], cols))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("occurred_at is already the stamp of another report"),
				 errdetail("Stamps are unique: they order the reports of every object."),
				 errhint("Spread equal stamps of an import apart by a microsecond each, in the order they should sort (docs/REFERENCE.md: Importing history).")));
}

void
sh_history_init(void)
{
	DefineCustomIntVariable("status_history.max_import_lead",
							"How far ahead of the server clock an imported occurred_at may be.",
							"-1 allows any stamp; a stamp far ahead holds every later stamp back until then.",
							&max_import_lead, 10000, -1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomBoolVariable("status_history.deduplicate",
							 "A report that repeats its key's newest row appends no row.",
							 "It moves the key's last_seen_at instead; off records every report.",
							 &deduplicate, true, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("status_history.notice_stale",
							 "A report recorded stale raises a NOTICE saying why.",
							 "For development: a stale report is never current, and says nothing otherwise.",
							 &notice_stale, false, PGC_USERSET, 0, NULL, NULL, NULL);
}

/* ---- repeats ---- */

/* Two nullable column values are equal (texts byte for byte, jsonb as jsonb). */
static bool
same_value(Datum a, bool a_null, Datum b, bool b_null, PGFunction eq)
{
	if (a_null || b_null)
		return a_null && b_null;
	return DatumGetBool(DirectFunctionCall2Coll(eq, C_COLLATION_OID, a, b));
}

/* The stored row with this stamp (tid: a hint where it is), into slot. */
static bool
stored_row(Relation rel, TimestampTz stamp, ItemPointer tid, TupleTableSlot *slot)
{
	bool		isnull;

	if (tid != NULL && sh_fetch_hint(rel, tid, slot) &&
		DatumGetTimestampTz(slot_getattr(slot, sh_history_cols(RelationGetDescr(rel))->occurred_at,
										 &isnull)) == stamp)
		return true;
	return sh_history_find_stamp(rel, stamp, slot);
}

/*
 * Does the report equal the stored row at stamp in status, error, details,
 * lease and generation (and, when check_stale, in stale)?  The row's copy goes to
 * *row when asked for.
 */
static bool
same_report(Relation rel, TimestampTz stamp, ItemPointer tid, Datum *values, bool *nulls,
			const ShHistoryCols *cols, bool check_stale, bool stale, HeapTuple *row)
{
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	bool		same = false;

	if (stored_row(rel, stamp, tid, slot))
	{
		bool		isnull;
		bool		n1,
					n2;
		Datum		status = slot_getattr(slot, cols->status, &isnull);
		Datum		error = slot_getattr(slot, cols->error, &n1);
		Datum		details = slot_getattr(slot, cols->details, &n2);
		Datum		generation = slot_getattr(slot, cols->generation, &isnull);
		Datum		row_stale = slot_getattr(slot, cols->stale, &isnull);
		bool		n3;
		Datum		lease = slot_getattr(slot, cols->lease, &n3);

		same = same_value(status, false, values[AT(cols->status)], false, texteq) &&
			same_value(lease, n3, values[AT(cols->lease)], nulls[AT(cols->lease)], interval_eq) &&
			same_value(error, n1, values[AT(cols->error)], nulls[AT(cols->error)], texteq) &&
			same_value(details, n2, values[AT(cols->details)], nulls[AT(cols->details)], jsonb_eq) &&
			DatumGetInt64(generation) == DatumGetInt64(values[AT(cols->generation)]) &&
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
 * current).  Both are stored rows.  Returns the row it repeats, or NULL.
 */
static HeapTuple
repeat_of(Relation rel, ShObject *obj, ShKey *key,
		  Datum *values, bool *nulls, const ShHistoryCols *cols, bool stale)
{
	HeapTuple	row = NULL;

	if (key == NULL || key->last_at == SH_NO_STAMP)
		return NULL;
	/* The newest row is the key's current report, of another status: no need to look. */
	if (key->has_current && key->current_at == key->last_at &&
		!text_equals(values[AT(cols->status)], key->status))
		return NULL;
	if (!same_report(rel, key->last_at, &key->last_tid, values, nulls, cols, true, stale, &row))
		return NULL;
	if (stale || (obj->has_current && obj->current_at == key->last_at))
		return row;
	if (obj->has_current &&
		same_report(rel, obj->current_at, &obj->current_tid, values, nulls, cols, false, false, NULL))
		return row;
	heap_freetuple(row);
	return NULL;
}

/* Is the report stale?  Given by a restore or an import that says what it was, else by the rules. */
static bool
decide_stale(ShObject *obj, Datum *values, bool *nulls, const ShHistoryCols *cols, bool imported,
			 int64 generation, int64 floor, const char *status, TimestampTz stamp)
{
	if (imported && !nulls[AT(cols->stale)])
		return DatumGetBool(values[AT(cols->stale)]);
	return (!nulls[AT(cols->stale)] && DatumGetBool(values[AT(cols->stale)])) ||
		sh_state_stale(obj, generation, floor, status, stamp);
}

/* ---- the triggers ---- */

/* SQL: BEFORE INSERT FOR EACH ROW on status_history.history */
Datum
status_history_insert_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	TupleDesc	desc;
	const ShHistoryCols *cols;
	Datum	   *values;
	bool	   *nulls;
	bool		imported;
	bool		stale;
	int64		generation;
	int64		floor;
	TimestampTz stamp;
	char		status[16];
	ShObject   *obj;
	text	   *replica;
	int			status_index;
	bool		complete;
	int64		lease = 0;

	sh_check_version();
	check_trigger_call(fcinfo, "history_insert_trigger");
	if (!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ||
		!TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_insert_trigger: must be fired for each row on insert")));

	rel = trigdata->tg_relation;
	desc = RelationGetDescr(rel);
	cols = sh_history_cols(desc);
	values = palloc(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	heap_deform_tuple(trigdata->tg_trigtuple, desc, values, nulls);

	validate_report(values, nulls, cols);
	imported = !nulls[AT(cols->occurred_at)];
	if (imported)
	{
		check_imported_stamp(rel, DatumGetTimestampTz(values[AT(cols->occurred_at)]), values, cols);
	}
	generation = DatumGetInt64(values[AT(cols->generation)]);
	text_to_cstring_buffer(DatumGetTextPP(values[AT(cols->status)]), status, sizeof(status));
	status_index = sh_status_index(values[AT(cols->status)]);
	replica = nulls[AT(cols->replica_id)] ? NULL : DatumGetTextPP(values[AT(cols->replica_id)]);
	sh_fence_note_report();

	/* Floors first: they may make a first report stale before its row exists. */
	floor = sh_fence_floor(PointerGetDatum(replica), replica == NULL);
	/* Lock, stamp, then decide from the stored rows of the object (all that can decide it). */
	obj = sh_state_lock(values[AT(cols->object_id)]);
	if (imported)
	{
		sh_state_catch_up(obj);
		complete = true;
		stamp = DatumGetTimestampTz(values[AT(cols->occurred_at)]);
		/*
		 * The change feed's hold first, then the clock (as for a stamp):
		 * else a horizon between them would pass the import.  (A
		 * subscriber applies what it receives: refusing would stop
		 * replication.)
		 */
		sh_horizon_import(stamp, !IsLogicalWorker());
		sh_clock_observe(stamp);
		sh_state_note_import(obj, obj->last_at != SH_NO_STAMP && stamp <= obj->last_at);
	}
	else
	{
		stamp = sh_clock_next();
		complete = sh_state_catch_up_for(obj, status_index,
										 decide_stale(obj, values, nulls, cols, false, generation,
													  floor, status, stamp));
	}

	if (!nulls[AT(cols->lease)])
		lease = sh_lease_check(&values[AT(cols->lease)], stamp, status);

	stale = decide_stale(obj, values, nulls, cols, imported, generation, floor, status, stamp);

	/* expire()'s lapse, decided under the lock: not when the lease was renewed or the key fenced meanwhile. */
	if (sh_lease_in_expire())
	{
		sh_state_catch_up(obj);
		complete = true;
		stale = decide_stale(obj, values, nulls, cols, imported, generation, floor, status, stamp);
		if (stale || nulls[AT(cols->reported_at)] ||
			!sh_lease_still_due(obj, sh_state_key(obj, replica),
								DatumGetTimestampTz(values[AT(cols->reported_at)])))
			return PointerGetDatum(NULL);
	}

	/*
	 * Rows left unfolded (not complete) make the report no repeat: the
	 * newest of them, not stale and of another status, is the object's
	 * current report once stored (sh_state_catch_up_for), and a report that
	 * is not stale repeats only the object's current report.  Looking at the
	 * folded rows would find a repeat of an older row and cost a scan to
	 * undo it (a bulk statement cycling through statuses: one an object).
	 */
	if (deduplicate && complete && !imported && !sh_fence_in_reconnect() && sh_state_repeats_allowed(obj))
	{
		HeapTuple	repeated = repeat_of(rel, obj, sh_state_key(obj, replica), values, nulls, cols, stale);

		if (repeated != NULL)
		{
			ShKey	   *key = sh_state_key(obj, replica);

			/* No row: the key was seen (report() returns the row repeated). */
			sh_state_seen(obj, key, stamp, lease);
			sh_capture_before(trigdata, stamp, repeated);
			return PointerGetDatum(NULL);
		}
	}

	if (stale && notice_stale && !imported && !sh_fence_in_reconnect())
		report_stale(obj, status, generation, floor);
	values[AT(cols->occurred_at)] = TimestampTzGetDatum(stamp);
	nulls[AT(cols->occurred_at)] = false;
	values[AT(cols->stale)] = BoolGetDatum(stale);
	nulls[AT(cols->stale)] = false;
	sh_capture_before(trigdata, stamp, NULL);
	sh_state_handed(obj, stamp, status_index, stale);
	return PointerGetDatum(heap_form_tuple(desc, values, nulls));
}

/*
 * SQL: status_history.history_stored(tid), the WHEN of the AFTER INSERT FOR
 * EACH ROW trigger history_fold.  PostgreSQL evaluates an AFTER trigger's
 * WHEN as it stores the row (queuing an event only when it is true), for
 * stored rows only, with the stored tuple, inside the statement's
 * (sub)transaction -- COPY and logical replication's apply included.  So
 * the row is folded here, as stored, and no event is queued: a statement's
 * memory does not grow with its rows.  The rows of report()'s and
 * report_many()'s own INSERT are handed back to them here too (report.c).
 * Always false.
 *
 * Anyone who may insert may call it: it folds only a row its own
 * transaction stored (found at tid), which is folded anyway; called on one
 * already folded, it refuses the call's statement (27000) or, for an
 * importer, folds the object's past again.
 */
Datum
status_history_history_stored(PG_FUNCTION_ARGS)
{
	ItemPointer tid = (ItemPointer) PG_GETARG_POINTER(0);
	Relation	rel;
	TupleTableSlot *slot;
	HeapTuple	tuple;
	bool		found;
	bool		isnull;
	Oid			relid;
	LOCKMODE	lockmode;

	sh_check_version();
	/* The INSERT storing the row holds its lock already (a call by hand may not). */
	relid = sh_relation_oid("history");
	lockmode = CheckRelationOidLockedByMe(relid, RowExclusiveLock, true) ? NoLock : AccessShareLock;
	rel = table_open(relid, lockmode);
	slot = table_slot_create(rel, NULL);
	/* (A block past the end is no row: reading it would extend the file, or fail as if it were corrupt.) */
	found = sh_fetch_hint(rel, tid, slot);
	tuple = found ? ExecFetchSlotHeapTuple(slot, false, NULL) : NULL;
	if (tuple == NULL || !TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data)))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_stored: no row stored by this transaction at %s",
						DatumGetCString(DirectFunctionCall1(tidout, PointerGetDatum(tid)))),
				 errdetail("It is the WHEN condition of the history_fold trigger on status_history.history."),
				 errhint("Do not call it yourself.")));
	/* (Its block exists while the storing INSERT's lock is held: the write-back's hint check need not ask.) */
	if (lockmode == NoLock)
		sh_note_block(rel, ItemPointerGetBlockNumber(tid));
	sh_state_stored(slot);
	sh_capture_stored(tuple, DatumGetTimestampTz(slot_getattr(slot, sh_history_cols(RelationGetDescr(rel))->occurred_at,
															  &isnull)));
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, lockmode);
	PG_RETURN_BOOL(false);
}

/*
 * SQL: status_history.history_written(), the WHEN of the AFTER INSERT FOR
 * EACH STATEMENT trigger history_written.  PostgreSQL evaluates it as the
 * statement's last row is stored -- INSERT, COPY, a data-modifying WITH --
 * before any AFTER trigger fires: the objects the statement folded are
 * written back then (state.c), so that AFTER triggers see them.  False: no
 * event is queued.  (An executor stopped early never gets here: its finish
 * writes them.)  Called by hand, it writes what is pending, no more.
 */
Datum
status_history_history_written(PG_FUNCTION_ARGS)
{
	sh_check_version();
	sh_state_flush();
	PG_RETURN_BOOL(false);
}

/* SQL: AFTER INSERT on status_history.history, for each row (history_fold) and statement (history_written): never fires (their WHENs are false) */
Datum
status_history_fold_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;

	sh_check_version();
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_fold_trigger: not called by trigger manager")));
	if (!TRIGGER_FIRED_AFTER(trigdata->tg_event) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("history_fold_trigger: must be fired after insert")));
	return PointerGetDatum(NULL);
}

/* SQL: BEFORE UPDATE OR DELETE OR TRUNCATE FOR EACH STATEMENT, and BEFORE UPDATE OR DELETE FOR EACH ROW (logical replication applies rows with row triggers only) */
Datum
status_history_refuse_change(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	const char *what;

	sh_check_version();
	check_trigger_call(fcinfo, "history_refuse_change");
	/* prune()'s own DELETE, and nothing it sets off (prune.c). */
	if (TRIGGER_FIRED_BY_DELETE(trigdata->tg_event) &&
		sh_prune_take_delete(TRIGGER_FIRED_FOR_ROW(trigdata->tg_event)))
		return TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) ?
			PointerGetDatum(trigdata->tg_trigtuple) : PointerGetDatum(NULL);
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
