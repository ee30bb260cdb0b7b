/*
 * writeback.c — writing an object's state (state.c) back to its rows:
 * status_history.objects and the keys' rows in replica_state, and telling
 * listeners when the object's status changed (notify.c has the rule).
 *
 * A write is by TID where the row's TID is known (the row lock and the key
 * read hand them over), without a statement (rowwrite.c): an UPDATE as
 * logical replication's apply does it.  Otherwise, and for a key's first
 * row, a planned statement, which hands the new TID back.  The object's row
 * copies its current report's columns from that report's history row (the
 * stored row in hand, or found by its TID or stamp): the state itself keeps
 * stamps and statuses only, never a report.
 *
 * Writes run as the owner of the state tables, under a restricted security
 * context, with search_path pinned (sh_become_owner).
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

/* ---- the object's row ---- */

/* What the object's row is written from: the state, and its current report's row. */
typedef struct ObjectWrite
{
	ShObject   *obj;
	TupleTableSlot *report;		/* NULL: no current report */
} ObjectWrite;

/* The report columns the object's row copies, by name in both tables. */
#define NREPORT_COLS 7
static const char *const report_cols[NREPORT_COLS] = {"status", "error", "details",
"replica_id", "generation", "reported_at", "lease"};

/*
 * The error readers show once the current report's lease has run out (as
 * status_history.lapse_error() writes it: UTC, the era kept), from the
 * report's row; NULL without a lease.  Written with expires_at, so that
 * statuses need not format one per row.
 */
static Datum
lapse_error(ShObject *obj, TupleTableSlot *report, bool *null)
{
	TupleDesc	rdesc;
	bool		lnull;
	bool		rnull;
	Datum		lease;
	Datum		replica;
	struct pg_tm tm;
	fsec_t		fsec;
	StringInfoData b;

	*null = true;
	if (report == NULL || obj->expires_at == SH_NO_STAMP)
		return (Datum) 0;
	rdesc = report->tts_tupleDescriptor;
	lease = slot_getattr(report, sh_history_cols(rdesc)->lease, &lnull);
	if (lnull)
		return (Datum) 0;
	replica = slot_getattr(report, sh_history_cols(rdesc)->replica_id, &rnull);
	if (timestamp2tm(obj->expires_at - sh_lease_usecs(lease), NULL, &tm, &fsec, NULL, NULL) != 0)
		return (Datum) 0;
	initStringInfo(&b);
	appendStringInfoString(&b, "lease expired: no report");
	if (!rnull)
		appendStringInfo(&b, " from replica %s", TextDatumGetCString(replica));
	appendStringInfo(&b, " since %04d-%02d-%02d %02d:%02d:%02d.%06d+00%s",
					 tm.tm_year > 0 ? tm.tm_year : -(tm.tm_year - 1), tm.tm_mon, tm.tm_mday,
					 tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec, tm.tm_year > 0 ? "" : " BC");
	*null = false;
	return CStringGetTextDatum(b.data);
}

/* sh_rowwriter's modify(): the object's row from the state and the report. */
static bool
object_row(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	ObjectWrite *w = (ObjectWrite *) arg;
	ShObject   *obj = w->obj;
	bool		ok;
	bool		lnull;
	Datum		lapse = lapse_error(obj, w->report, &lnull);

	if (!sh_row_text_is(desc, values, isnull, "object_id", obj->id))
		return false;
	ok = sh_row_set(desc, values, isnull, "fence", Int64GetDatum(obj->fence), false) &&
		sh_row_set(desc, values, isnull, "occurred_at", TimestampTzGetDatum(obj->current_at),
				   w->report == NULL) &&
		sh_row_set(desc, values, isnull, "status_since", TimestampTzGetDatum(obj->status_since),
				   w->report == NULL) &&
		sh_row_set(desc, values, isnull, "expires_at", TimestampTzGetDatum(obj->expires_at),
				   w->report == NULL || obj->expires_at == SH_NO_STAMP) &&
		sh_row_set(desc, values, isnull, "lapse_error", lapse, lnull);
	for (int i = 0; ok && i < NREPORT_COLS; i++)
	{
		Datum		d = (Datum) 0;
		bool		null = true;

		if (w->report != NULL)
			d = slot_getattr(w->report, sh_attnum(w->report->tts_tupleDescriptor, "history",
												  report_cols[i]), &null);
		ok = sh_row_set(desc, values, isnull, report_cols[i], d, null);
	}
	return ok;
}

/* The statement fallback: the same row by object id; returns its new TID. */
static void
update_object_row(ObjectWrite *w)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[13] = {TEXTOID, TIMESTAMPTZOID, TEXTOID, TEXTOID, JSONBOID,
		TEXTOID, INT8OID, TIMESTAMPTZOID, INTERVALOID, TIMESTAMPTZOID, INT8OID, TIMESTAMPTZOID, TEXTOID};
	Datum		args[13];
	char		nulls[13];
	bool		isnull;
	int			ret;

	memset(nulls, 'n', sizeof(nulls));
	args[0] = PointerGetDatum(w->obj->id);
	nulls[0] = ' ';
	args[10] = Int64GetDatum(w->obj->fence);
	nulls[10] = ' ';
	if (w->report != NULL)
	{
		args[1] = TimestampTzGetDatum(w->obj->current_at);
		args[9] = TimestampTzGetDatum(w->obj->status_since);
		nulls[1] = nulls[9] = ' ';
		if (w->obj->expires_at != SH_NO_STAMP)
		{
			bool		lnull;

			args[11] = TimestampTzGetDatum(w->obj->expires_at);
			nulls[11] = ' ';
			args[12] = lapse_error(w->obj, w->report, &lnull);
			nulls[12] = lnull ? 'n' : ' ';
		}
		for (int i = 0; i < NREPORT_COLS; i++)
		{
			args[2 + i] = slot_getattr(w->report, sh_attnum(w->report->tts_tupleDescriptor,
															"history", report_cols[i]), &isnull);
			nulls[2 + i] = isnull ? 'n' : ' ';
		}
	}
	if (plan == NULL)
		plan = sh_prepare_kept("UPDATE status_history.objects AS o"
							   "   SET occurred_at = $2, status = $3, error = $4, details = $5,"
							   "       replica_id = $6, generation = $7, reported_at = $8, lease = $9,"
							   "       status_since = $10, fence = $11, expires_at = $12, lapse_error = $13"
							   " WHERE o.object_id OPERATOR(pg_catalog.=) $1"
							   " RETURNING o.ctid", 13, types);
	ret = sh_execute_own(plan, args, nulls);
	if (ret != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
		elog(ERROR, "status_history: writing back object \"%s\" failed: %s",
			 text_to_cstring(w->obj->id), SPI_result_code_string(ret));
	w->obj->tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
															   SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The object's current report, as stored: the row in hand when it is that
 * one, else found by TID (checked by stamp) or stamp, into slot.
 */
static TupleTableSlot *
current_report(ShObject *obj, TupleTableSlot *row, Relation history, TupleTableSlot *slot)
{
	bool		isnull;

	if (!obj->has_current)
		return NULL;
	if (row != NULL &&
		DatumGetTimestampTz(slot_getattr(row, sh_history_cols(row->tts_tupleDescriptor)->occurred_at,
										 &isnull)) == obj->current_at)
		return row;
	if (sh_fetch_hint(history, &obj->current_tid, slot) &&
		DatumGetTimestampTz(slot_getattr(slot, sh_history_cols(slot->tts_tupleDescriptor)->occurred_at,
										 &isnull)) == obj->current_at)
		return slot;
	if (sh_history_find_stamp(history, obj->current_at, slot))
		return slot;
	elog(ERROR, "status_history: the current report of object \"%s\" is missing from the history",
		 text_to_cstring(obj->id));
	return NULL;
}

/* Tell listeners when the status differs from the one last written. */
static void
notify_change(ShObject *obj, TupleTableSlot *report)
{
	char	   *replica = NULL;

	if (!obj->has_current ||
		(obj->has_written && strcmp(obj->written, obj->status) == 0))
		return;
	if (sh_notify_wanted() && report != NULL)
	{
		bool		isnull;
		Datum		d = slot_getattr(report, sh_history_cols(report->tts_tupleDescriptor)->replica_id,
									 &isnull);

		if (!isnull)
			replica = TextDatumGetCString(d);
		sh_notify_change(obj->id, obj->status, obj->has_written ? obj->written : NULL,
						 obj->current_at, replica, true);
	}
	obj->has_written = true;
	strlcpy(obj->written, obj->status, sizeof(obj->written));
}

static void
write_object_row(ShObject *obj, TupleTableSlot *row)
{
	Relation	history = table_open(sh_relation_oid("history"), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(history, NULL);
	ObjectWrite w = {obj, current_report(obj, row, history, slot)};

	if (!sh_rowwrite(sh_relation_oid("objects"), &obj->tid, object_row, &w))
		update_object_row(&w);
	obj->fence_unwritten = false;
	notify_change(obj, w.report);
	ExecDropSingleTupleTableSlot(slot);
	table_close(history, AccessShareLock);
}

/* ---- the keys' rows ---- */

typedef struct KeyWrite
{
	text	   *object_id;
	const ShKey *key;
} KeyWrite;

/* A key row's columns of its current report (NULL without one). */
static bool
key_current(TupleDesc desc, Datum *values, bool *isnull, const ShKey *k)
{
	return sh_row_set(desc, values, isnull, "occurred_at", TimestampTzGetDatum(k->current_at),
					  !k->has_current) &&
		sh_row_set(desc, values, isnull, "status",
				   k->has_current ? CStringGetTextDatum(k->status) : (Datum) 0, !k->has_current) &&
		sh_row_set(desc, values, isnull, "status_since", TimestampTzGetDatum(k->status_since),
				   !k->has_current) &&
		sh_row_set(desc, values, isnull, "expires_at", TimestampTzGetDatum(k->expires_at),
				   !k->has_current || k->expires_at == SH_NO_STAMP);
}

/* sh_rowwriter's modify(): the key's row from its state; last_seen_at only grows. */
static bool
key_row(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	KeyWrite   *w = (KeyWrite *) arg;
	const ShKey *k = w->key;
	int			seen = sh_fnumber(desc, "last_seen_at");

	if (seen <= 0 || isnull[seen - 1] ||
		!sh_row_text_is(desc, values, isnull, "object_id", w->object_id) ||
		!sh_row_text_is(desc, values, isnull, "replica_id", k->replica_id))
		return false;
	/* (A restored dump's last_seen_at may be later than our rows.) */
	return sh_row_set(desc, values, isnull, "last_at", TimestampTzGetDatum(k->last_at), false) &&
		sh_row_set(desc, values, isnull, "last_seen_at",
				   TimestampTzGetDatum(Max(DatumGetTimestampTz(values[seen - 1]), k->last_seen_at)),
				   false) &&
		key_current(desc, values, isnull, k);
}

/* sh_rowwriter's fill(): a key's first row. */
static bool
new_key_row(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	KeyWrite   *w = (KeyWrite *) arg;
	const ShKey *k = w->key;

	return sh_row_set(desc, values, isnull, "object_id", PointerGetDatum(w->object_id), false) &&
		sh_row_set(desc, values, isnull, "replica_id", PointerGetDatum(k->replica_id),
				   k->replica_id == NULL) &&
		sh_row_set(desc, values, isnull, "last_at", TimestampTzGetDatum(k->last_at), false) &&
		sh_row_set(desc, values, isnull, "last_seen_at", TimestampTzGetDatum(k->last_seen_at), false) &&
		key_current(desc, values, isnull, k);
}

/* The fallback for a key whose row's TID is not known (or is no longer its row): an upsert. */
static void
upsert_key_row(text *object_id, ShKey *k)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[8] = {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[8];
	char		nulls[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		isnull;
	int			ret;

	args[0] = PointerGetDatum(object_id);
	args[1] = PointerGetDatum(k->replica_id);
	args[2] = TimestampTzGetDatum(k->last_at);
	args[3] = TimestampTzGetDatum(k->last_seen_at);
	args[4] = TimestampTzGetDatum(k->current_at);
	args[5] = k->has_current ? CStringGetTextDatum(k->status) : (Datum) 0;
	args[6] = TimestampTzGetDatum(k->status_since);
	args[7] = TimestampTzGetDatum(k->expires_at);
	if (k->replica_id == NULL)
		nulls[1] = 'n';
	if (!k->has_current)
		nulls[4] = nulls[5] = nulls[6] = 'n';
	if (!k->has_current || k->expires_at == SH_NO_STAMP)
		nulls[7] = 'n';
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.replica_state AS k"
							   " (object_id, replica_id, last_at, last_seen_at, occurred_at, status, status_since,"
							   "  expires_at)"
							   " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
							   " ON CONFLICT (object_id, replica_id) DO UPDATE"
							   "   SET last_at = excluded.last_at,"
							   "       last_seen_at = GREATEST(k.last_seen_at, excluded.last_seen_at),"
							   "       occurred_at = excluded.occurred_at, status = excluded.status,"
							   "       status_since = excluded.status_since, expires_at = excluded.expires_at"
							   " RETURNING k.ctid", 8, types);
	ret = sh_execute_own(plan, args, nulls);
	if (ret != SPI_OK_INSERT_RETURNING || SPI_processed != 1)
		elog(ERROR, "status_history: writing back a key of object \"%s\" failed: %s",
			 text_to_cstring(object_id), SPI_result_code_string(ret));
	k->tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
														  SPI_tuptable->tupdesc, 1, &isnull));
	k->stored = true;
}

/* ---- entry points ---- */

/*
 * Write back what of obj differs from its rows: its objects row and its
 * keys' rows.  row: a stored history row in hand, or
 * NULL.  A key with no row in the history (all pruned) is left as it is.
 */
void
sh_write_object(ShObject *obj, TupleTableSlot *row)
{
	ShSavedUser saved;
	ShRowWriter *keys = NULL;
	bool		any = obj->dirty;

	for (int i = 0; i < obj->nkeys && !any; i++)
		any = obj->keys[i].dirty;
	if (!any)
		return;
	/* (The row writer advances the command counter when needed: once per statement, or for a row it wrote.) */
	SPI_connect();
	sh_become_owner(sh_relation_oid("objects"), &saved);
	if (obj->dirty)
		write_object_row(obj, row);
	obj->dirty = false;
	for (int i = 0; i < obj->nkeys; i++)
	{
		ShKey	   *k = &obj->keys[i];
		KeyWrite	w = {obj->id, k};

		if (!k->dirty || k->last_at == SH_NO_STAMP)
			continue;
		if (keys == NULL)
			keys = sh_rowwriter_begin(sh_relation_oid("replica_state"));
		/* (A key not known to be stored may have a restored row: then the upsert merges.) */
		if (k->stored ? !sh_rowwriter_update(keys, &k->tid, key_row, &w) :
			!sh_rowwriter_insert_new(keys, sh_relation_oid("replica_state_key"), new_key_row, &w, &k->tid))
			upsert_key_row(obj->id, k);
		k->stored = true;
		k->dirty = false;
	}
	if (keys != NULL)
		sh_rowwriter_end(keys);
	sh_restore_user(&saved);
	SPI_finish();
}

/* sh_rowwriter's modify(): only the fence. */
static bool
fence_only(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	ShObject   *obj = (ShObject *) arg;

	return sh_row_text_is(desc, values, isnull, "object_id", obj->id) &&
		sh_row_set(desc, values, isnull, "fence", Int64GetDatum(obj->fence), false);
}

/* Writing raised fences: one executor state for a batch of objects. */
struct ShFenceWriter
{
	ShSavedUser saved;
	ShRowWriter *rows;
};

ShFenceWriter *
sh_fence_writer_begin(void)
{
	ShFenceWriter *w = palloc(sizeof(ShFenceWriter));

	/* (The row writer advances the command counter itself when it must.) */
	SPI_connect();
	sh_become_owner(sh_relation_oid("objects"), &w->saved);
	w->rows = sh_rowwriter_begin(sh_relation_oid("objects"));
	return w;
}

/*
 * Write the object's fence (raised in its state) at once, so that nothing
 * but stored rows is left to derive it from: by TID, else a statement.
 */
void
sh_write_fence(ShFenceWriter *w, ShObject *obj)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[2] = {TEXTOID, INT8OID};
	Datum		args[2] = {PointerGetDatum(obj->id), Int64GetDatum(obj->fence)};
	bool		isnull;
	int			ret;

	if (sh_rowwriter_update(w->rows, &obj->tid, fence_only, obj))
		return;
	if (plan == NULL)
		plan = sh_prepare_kept("UPDATE status_history.objects AS o"
							   "   SET fence = pg_catalog.int8larger(o.fence, $2)"
							   " WHERE o.object_id OPERATOR(pg_catalog.=) $1"
							   " RETURNING o.ctid", 2, types);
	ret = sh_execute_own(plan, args, NULL);
	if (ret != SPI_OK_UPDATE_RETURNING || SPI_processed != 1)
		elog(ERROR, "status_history: raising the fence of object \"%s\" failed: %s",
			 text_to_cstring(obj->id), SPI_result_code_string(ret));
	obj->tid = *(ItemPointer) DatumGetPointer(SPI_getbinval(SPI_tuptable->vals[0],
															SPI_tuptable->tupdesc, 1, &isnull));
}

void
sh_fence_writer_end(ShFenceWriter *w)
{
	sh_rowwriter_end(w->rows);
	sh_restore_user(&w->saved);
	SPI_finish();
	pfree(w);
}
