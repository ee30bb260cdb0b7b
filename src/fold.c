/*
 * fold.c — the rule that keeps an object's state true (state.c keeps the
 * states): folding a stored row into it, catching it up with the rows
 * stored since, folding its past again after an import, a stored row's
 * fold as it is stored, a repeat, and whether a report is stale.
 *
 * Only rows PostgreSQL has stored are folded, as stored (docs/WRITE_PATH.md).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/rel.h"

#include "status_history.h"

/*
 * Is a report of this generation and status, stamped stamp, whose replica's
 * floor is floor, stale after the rows folded into obj?  Below the fence or
 * a floor, from a retired replica, after a (non-stale) dropped report, or a
 * dropped report older than the current one (dropped is terminal: not before
 * reports already recorded after it).
 */
bool
sh_state_stale(const ShObject *obj, int64 generation, int64 floor,
			   const char *status, TimestampTz stamp)
{
	return generation < obj->fence || generation < floor || floor == SH_RETIRED ||
		(obj->has_current && strcmp(obj->status, "dropped") == 0 && stamp > obj->status_since) ||
		(obj->has_current && stamp < obj->current_at && strcmp(status, "dropped") == 0);
}

/*
 * Fold one stored row, newer than every row folded so far, into obj.  Unless
 * its own fold as stored is what folds it (event), it waits for that.
 */
static void
fold(ShObject *obj, TupleTableSlot *slot, bool event)
{
	ShStoredRow	row;
	ShKey	   *key;
	bool		imports = sh_state_imported(obj);

	sh_read_stored(slot, &row);
	if (!row.stale && !imports)
	{
		int64		floor = sh_fence_floor(PointerGetDatum(row.replica_id), row.replica_id == NULL);

		if (sh_state_stale(obj, row.generation, floor, row.status, row.stamp))
			sh_refuse_row(obj, &row, "it is below the object's fence or a floor, from a retired replica, or after a dropped report");
	}
	key = sh_key_for(obj, row.replica_id, sh_state_memory());
	if (!imports && key->last_seen_at > row.stamp)
		sh_refuse_row(obj, &row, "a repeat of its key was decided without it while it was being inserted");
	/* Another key's repeat relied on the object's current report being what it was then. */
	if (!imports && !row.stale && obj->repeat_at > row.stamp)
		sh_refuse_row(obj, &row, "a repeat of another key, decided on the object's current report without it, was made while it was being inserted");
	key->last_at = row.stamp;
	key->last_tid = row.tid;
	/* A controller's re-stamped copy is not a sighting of the replica (but a new key's first row is all it has). */
	if (!sh_fence_in_reconnect() || key->last_seen_at == SH_NO_STAMP)
		key->last_seen_at = Max(key->last_seen_at, row.stamp);
	key->dirty = true;
	if (!row.stale)
	{
		/*
		 * The lease runs from the key's report -- not from a controller's
		 * re-stamped copy of it, which carries the lease on as it was.
		 */
		if (row.lease == 0)
			key->expires_at = SH_NO_STAMP;
		else if (!sh_fence_in_reconnect() || !key->has_current || key->expires_at == SH_NO_STAMP)
			key->expires_at = sh_lease_expiry(row.stamp, row.lease);
		if (!key->has_current || strcmp(key->status, row.status) != 0)
			key->status_since = row.stamp;
		key->has_current = true;
		key->current_at = row.stamp;
		strlcpy(key->status, row.status, sizeof(key->status));
		if (!obj->has_current || strcmp(obj->status, row.status) != 0)
			obj->status_since = row.stamp;
		obj->has_current = true;
		obj->current_at = row.stamp;
		obj->current_tid = row.tid;
		obj->expires_at = key->expires_at;
		strlcpy(obj->status, row.status, sizeof(obj->status));
		obj->dirty = true;
	}
	obj->last_at = row.stamp;
	/*
	 * Its own fold as stored is due unless this is it, or a later row's came
	 * (a state read again folds its rows again: their folds came long ago).
	 */
	sh_waiting_note(obj, row.stamp, row.xmin, event || row.stamp <= obj->came_at);
}

/*
 * Fold every stored row of obj above last_at, oldest first.  Only rows the
 * insert trigger handed over can have been stored since (nobody else adds
 * rows of a locked object): none, nothing to do; one, it is the row being
 * folded as stored or is found by its stamp; more, a scan of the object's
 * index.  event: the row being folded as stored (it does not wait), or
 * NULL.  True when that row was folded now.
 */
static bool
catch_up(ShObject *obj, TupleTableSlot *event)
{
	bool		found = false;
	bool		isnull;
	TimestampTz event_stamp = event == NULL ? SH_NO_STAMP :
		DatumGetTimestampTz(slot_getattr(event, sh_history_cols(event->tts_tupleDescriptor)->occurred_at,
										 &isnull));

	if (obj->handed_at == SH_NO_STAMP || obj->handed_at <= obj->last_at)
	{
		obj->handed = 0;
		obj->handed_dropped = false;
		return false;
	}
	if (obj->handed == 1)
	{
		if (event_stamp == obj->handed_at)
		{
			fold(obj, event, true);
			found = true;
		}
		else
		{
			TupleTableSlot *slot;
			Relation	rel;

			if (sh_stored_by_stamp(obj->handed_at, &slot, &rel))
				fold(obj, slot, false);
			ExecDropSingleTupleTableSlot(slot);
			table_close(rel, AccessShareLock);
		}
	}
	else
	{
		ShRowScan		s;

		sh_rows_begin(&s, obj, obj->last_at);
		/* The index is by occurred_at DESC: backwards is oldest first. */
		while (index_getnext_slot(s.scan, BackwardScanDirection, s.slot))
		{
			bool		mine = event != NULL &&
				DatumGetTimestampTz(slot_getattr(s.slot, sh_history_cols(s.slot->tts_tupleDescriptor)->occurred_at,
												 &isnull)) == event_stamp;

			fold(obj, s.slot, mine);
			found |= mine;
		}
		sh_rows_end(&s);
	}
	if (obj->last_at >= obj->handed_at)
	{
		obj->handed = 0;
		obj->handed_dropped = false;
	}
	return found;
}

/* The insert trigger lets a row of obj go to be stored, as decided: its stamp, status (sh_statuses) and stale flag. */
void
sh_state_handed(ShObject *obj, TimestampTz stamp, int status, bool stale)
{
	if (obj->handed_at == SH_NO_STAMP || stamp > obj->handed_at)
		obj->handed_at = stamp;
	obj->handed = Min(obj->handed + 1, 2);
	obj->handed_dropped |= (status == SH_DROPPED && !stale);
	obj->handed_status = status;
	obj->handed_stale = stale;
}

void
sh_state_catch_up(ShObject *obj)
{
	(void) catch_up(obj, NULL);
}

/*
 * Catch obj up before a report of status, found stale or not by the rows
 * folded so far, is decided -- unless no row handed over and not folded yet
 * can change the decision: none was handed over as a non-stale dropped
 * report (which makes later reports stale), the newest was handed over not
 * stale with another status (it would be the object's current report, so
 * the report repeats no row), and the report is not stale (a stale report
 * may repeat a stale row of its key).  Then the rows stay unfolded until
 * their events come (a bulk statement's rows of one object are folded by
 * one scan, not a probe each), and the report is decided from the rows
 * folded so far: as it would be from all of them.  Should a later trigger
 * have changed or skipped such a row, folding refuses a report it made
 * stale (27000), or the report is stored although it repeats the row as
 * changed.  False when rows were left unfolded: a repeat must not be
 * decided then.
 */
bool
sh_state_catch_up_for(ShObject *obj, int status, bool stale)
{
	if (obj->handed > 0 && obj->handed_at > obj->last_at && !obj->handed_dropped &&
		!obj->handed_stale && obj->handed_status != status && !stale &&
		!sh_state_imported(obj))	/* (an importer's rows are not checked when folded) */
		return false;
	(void) catch_up(obj, NULL);
	return true;
}

/*
 * A row stored below last_at (an import into the past): its key and the
 * object are computed again from their stored rows.  Only they can change
 * (other keys' rows did not), and a stale row changes nothing but its key's
 * newest row.  The walk, newest first, stops as soon as both current
 * reports and the runs of their status are known: usually a few rows.
 */
static void
refold_past(ShObject *obj, TupleTableSlot *slot)
{
	ShStoredRow	row;
	ShKey	   *key;
	ShRun			orun = {0};
	ShRun			krun = {0};
	ShRowScan		s;

	sh_read_stored(slot, &row);
	key = sh_key_for(obj, row.replica_id, sh_state_memory());
	if (key->last_at == SH_NO_STAMP || row.stamp > key->last_at)
	{
		key->last_at = row.stamp;
		key->last_tid = row.tid;
	}
	/* (A stored key's last_seen_at was written when seen; a new one's is its newest row.) */
	if (!key->stored)
		key->last_seen_at = Max(key->last_seen_at, row.stamp);
	key->dirty = true;
	if (row.stale)
		return;

	sh_rows_begin(&s, obj, SH_NO_STAMP);
	while ((orun.open || !orun.has_current || krun.open || !krun.has_current) &&
		   index_getnext_slot(s.scan, ForwardScanDirection, s.slot))
	{
		ShStoredRow	r;

		sh_read_stored(s.slot, &r);
		if (r.stale)
			continue;
		sh_run_walk(&orun, &r);
		if (sh_same_replica(key->replica_id, r.replica_id))
			sh_run_walk(&krun, &r);
	}
	sh_rows_end(&s);

	obj->has_current = key->has_current = true;	/* (row is one) */
	obj->current_at = orun.current_at;
	obj->current_tid = orun.current_tid;
	obj->status_since = orun.since;
	strlcpy(obj->status, orun.status, sizeof(obj->status));
	obj->dirty = true;
	key->current_at = krun.current_at;
	key->status_since = krun.since;
	strlcpy(key->status, krun.status, sizeof(key->status));
	/* Only this row changed anything: its lease, if it is the key's (or the object's) current report now. */
	if (key->current_at == row.stamp)
		key->expires_at = row.lease == 0 ? SH_NO_STAMP : sh_lease_expiry(row.stamp, row.lease);
	if (obj->current_at == row.stamp)
		obj->expires_at = key->expires_at;
}

/*
 * The insert trigger's row as PostgreSQL stored it (history.c: the WHEN of
 * the AFTER ROW trigger, evaluated as the row is stored, with the stored
 * tuple).  Fold it -- a catch-up does, or did -- cross it off the rows
 * waiting to be stored, and once none waits, queue the object to be written
 * back at the end of the statement.
 */
void
sh_state_stored(TupleTableSlot *slot)
{
	const ShHistoryCols *c = sh_history_cols(slot->tts_tupleDescriptor);
	ShObject   *obj;
	TimestampTz stamp;
	bool		isnull;

	stamp = DatumGetTimestampTz(slot_getattr(slot, c->occurred_at, &isnull));
	obj = sh_state_lock(slot_getattr(slot, c->object_id, &isnull));
	obj->came_at = Max(obj->came_at, stamp);
	if (!catch_up(obj, slot) && !sh_waiting_came(obj, stamp))
	{
		/* Not folded: stored after rows with later stamps were folded. */
		ShStoredRow	row;

		sh_read_stored(slot, &row);
		if (!sh_state_imported(obj))
			sh_refuse_row(obj, &row, "a report on the object stamped later was stored (and decided) before it");
		refold_past(obj, slot);
	}
	if (!sh_waiting_any(obj))
	{
		sh_waiting_settled(obj);
		sh_state_queue(obj);
	}
}

/*
 * A repeat: the key reported again what it reported last (no row), with
 * that row's lease.  Written at once.  It renews the lease of the key's
 * report when that is its newest row (a repeat of a stale row renews
 * nothing), and so the object's when that is the object's current report.
 */
void
sh_state_seen(ShObject *obj, ShKey *key, TimestampTz seen, int64 lease)
{
	key->last_seen_at = Max(key->last_seen_at, seen);
	key->dirty = true;
	if (lease != 0 && key->has_current && key->current_at == key->last_at)
	{
		key->expires_at = Max(key->expires_at, sh_lease_expiry(seen, lease));
		/*
		 * And the object's: a repeat is of the object's current report too
		 * -- another key's, when two replicas say the same: the object then
		 * holds while either of them does.
		 */
		if (obj->has_current && obj->expires_at != SH_NO_STAMP)
		{
			obj->expires_at = obj->current_at == key->current_at ? key->expires_at :
				Max(obj->expires_at, key->expires_at);
			obj->dirty = true;
		}
	}
	sh_state_note_repeat(obj, key, seen);
	sh_state_write_back(obj, NULL);
}

