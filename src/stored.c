/*
 * stored.c — an object's rows as PostgreSQL stored them, as the fold reads
 * them (state.c): one row's columns, the scan of the object's rows above a
 * stamp (SnapshotSelf: ours, this statement's included, and committed
 * ones), a row by its stamp, the walk that finds a current report and its
 * run, and refusing a row the rules refuse (27000).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

void
sh_read_stored(TupleTableSlot *slot, ShStoredRow *row)
{
	const ShHistoryCols *c = sh_history_cols(slot->tts_tupleDescriptor);
	bool		isnull;
	Datum		d;

	row->stamp = DatumGetTimestampTz(slot_getattr(slot, c->occurred_at, &isnull));
	row->tid = slot->tts_tid;
	row->xmin = DatumGetTransactionId(slot_getsysattr(slot, MinTransactionIdAttributeNumber, &isnull));
	row->status[0] = '\0';
	d = slot_getattr(slot, c->status, &isnull);
	if (!isnull)
		text_to_cstring_buffer(DatumGetTextPP(d), row->status, sizeof(row->status));
	d = slot_getattr(slot, c->replica_id, &isnull);
	row->replica_id = isnull ? NULL : DatumGetTextPP(d);
	row->generation = DatumGetInt64(slot_getattr(slot, c->generation, &isnull));
	row->stale = DatumGetBool(slot_getattr(slot, c->stale, &isnull));
	d = slot_getattr(slot, c->lease, &isnull);
	row->lease = isnull ? 0 : sh_lease_usecs(d);
}

/* A stored row the rules refuse: refuse the statement. */
void
sh_refuse_row(const ShObject *obj, const ShStoredRow *row, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_DATA_CHANGE_VIOLATION),
			 errmsg("report on object \"%s\" stamped %s cannot be stored as it is: %s",
					text_to_cstring(obj->id), timestamptz_to_str(row->stamp), why),
			 errdetail("Its generation, replica, status or stale flag was changed after the extension decided it, or a report on the same object was made while it was being inserted."),
			 errhint("Do not change these columns in a trigger that fires after history_insert, and report on an object from its own statement, not from a trigger or constraint of another report on it.")));
}

void
sh_rows_begin(ShRowScan *s, ShObject *obj, TimestampTz after)
{
	ScanKeyData keys[2];
	int			nkeys = after != SH_NO_STAMP ? 2 : 1;

	s->rel = table_open(sh_relation_oid("history"), AccessShareLock);
	s->index = index_open(sh_relation_oid("history_object_idx"), AccessShareLock);
	s->slot = table_slot_create(s->rel, NULL);
	ScanKeyInit(&keys[0], 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(obj->id));
	keys[0].sk_collation = s->index->rd_indcollation[0];
	ScanKeyInit(&keys[1], 2, BTGreaterStrategyNumber, F_TIMESTAMP_GT, TimestampTzGetDatum(after));
	s->scan = index_beginscan(s->rel, s->index, SnapshotSelf, nkeys, 0);
	index_rescan(s->scan, keys, nkeys, NULL, 0);
}

void
sh_rows_end(ShRowScan *s)
{
	index_endscan(s->scan);
	ExecDropSingleTupleTableSlot(s->slot);
	index_close(s->index, AccessShareLock);
	table_close(s->rel, AccessShareLock);
}

/* The stored row stamped stamp, into slot (ours included, as the catch-up scans see them). */
bool
sh_stored_by_stamp(TimestampTz stamp, TupleTableSlot **slot, Relation *rel)
{
	*rel = table_open(sh_relation_oid("history"), AccessShareLock);
	*slot = table_slot_create(*rel, NULL);
	return sh_history_find_stamp(*rel, stamp, *slot);
}

/* Walk one more non-stale row (older than those walked) into run. */
void
sh_run_walk(ShRun *run, const ShStoredRow *row)
{
	if (!run->has_current)
	{
		run->has_current = run->open = true;
		run->current_at = run->since = row->stamp;
		run->current_tid = row->tid;
		strlcpy(run->status, row->status, sizeof(run->status));
	}
	else if (run->open)
	{
		if (strcmp(run->status, row->status) == 0)
			run->since = row->stamp;
		else
			run->open = false;
	}
}
