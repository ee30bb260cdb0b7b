/*
 * state.c — the per-object state of this transaction, and the rule that
 * keeps it true.
 *
 * THE RULE: an object's state -- its row in status_history.objects (fence,
 * current report, status_since) and its keys' rows in replica_state -- is
 * changed only by folding rows PostgreSQL has stored, as stored.  Nothing
 * about a row still in flight (its BEFORE triggers, constraints and policies
 * running, or skipped after all) is ever kept.
 *
 * For every object this transaction has locked, an ShObject holds its row as
 * read when it was locked, with every stored row of the object folded in, in
 * stamp order, up to last_at.  Stored rows reach it two ways, both reading
 * the row as stored:
 *   catch-up   a scan of the history's (object_id, occurred_at) index above
 *              last_at with SnapshotSelf (our own rows, the current
 *              statement's included, and committed ones).  The insert trigger
 *              catches up before it decides anything about a new row, so it
 *              decides from stored rows only; nobody else can add rows of the
 *              object meanwhile, we hold its lock.
 *   as stored  PostgreSQL evaluates the WHEN of an AFTER ROW trigger as it
 *              stores a row, only for a row it stored, with the stored
 *              tuple, inside the statement's (sub)transaction, row by row
 *              (an executor stopped early has evaluated it for every row it
 *              stored).  history_stored() there catches up (the row is
 *              folded by then), crosses the row off the object's waiting
 *              list (rows a catch-up folded before their own fold came), and
 *              queues no event.  The objects folded are written back at the
 *              end of the statement (sh_state_flush()): one row version per
 *              object per statement, and no memory per row.
 *
 * A row whose fold finds it not folded was stored below last_at:
 * after rows with later stamps had been folded.  An import into the past
 * does that; so does a report made while another row of the same object was
 * in flight (from one of its triggers or constraints: the inner report is
 * stamped later, stored first, and decided -- and a reconnect() copy made --
 * without the outer one).  The first is folded again from the stored rows;
 * the second is refused (27000).  Folding checks each row as stored against
 * the state before it, too: a row stored non-stale below its fence or a
 * floor, or after a dropped report, or one a repeat of its key was decided
 * without (stamped before the repeat, stored after it), is refused (27000),
 * whatever happened after it was stamped.  An importer's rows keep the stale
 * flags they give: the checks are for the objects it imports into.
 *
 * Memory: entries live in the transaction.  A subtransaction that aborts
 * takes its rows, row locks and writes with it: every entry it read or
 * changed is marked to be read again when next needed (what an entry holds
 * beyond its rows is derivable from stored rows, or was written at once).
 * What is not -- which folded rows' folds are due, and which came, and the
 * newest stamp handed over (so that folds not written back yet are caught
 * up again by a scan) -- is kept across a read again, less the rows the
 * abort took (by their xmin).  A flush writes only what was first folded in
 * its own subtransaction (or one it took over): an older fold written there
 * would be lost with it.
 * Past status_history.cache_max_objects entries, entries no event is due for
 * are written back and dropped, but never while one is being written; when
 * most entries cannot be dropped, not again before their number has doubled
 * (shrink_at).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "executor/executor.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

/*
 * status_history.cache_max_objects: entries kept at most; past it they are
 * written back and dropped (and read again when needed).
 */
static int	cache_max_objects = 262144;

static MemoryContext state_cxt = NULL;	/* child of TopTransactionContext */
static HTAB *objects = NULL;
static Oid	state_relid = InvalidOid;	/* the objects table the entries describe */
static bool state_recheck = false;	/* that table may have been dropped */
static ShObject *being_written = NULL;	/* sh_write_object() runs for it */
static SubTransactionId newest_touch = InvalidSubTransactionId;
/*
 * Entries at which the next shrink runs: cache_max_objects, or twice what
 * the last shrink left when that was more than half of it.  Entries that
 * cannot be dropped (an event due: every object of a statement still running,
 * e.g. reconnect()'s copies or a bulk INSERT over more objects than the
 * cache holds) would otherwise make every new entry scan them all again:
 * quadratic.  This way each shrink is paid for by as many new entries as it
 * visited, at the price of keeping up to twice as many entries as must be.
 */
static long shrink_at = 0;

/*
 * Entries folded since they were last written back, to be written at the
 * end of the statement (sh_state_flush()): once per object per statement,
 * however many of its rows the statement stored.  May hold an entry twice,
 * or one dropped since (its memory reused): its pending flag decides.
 */
static List *pending = NIL;

/*
 * The entry sh_state_lock() returned last: a row's fold as stored asks for
 * the object its insert trigger just locked, and a bulk statement's rows
 * come object after object -- a comparison instead of a hash lookup.
 * Forgotten whenever entries are dropped.
 */
static ShObject *last_locked = NULL;

static ExecutorFinish_hook_type next_executor_finish = NULL;

/* obj is read or changed in the current subtransaction: its abort must undo that. */
static void
touch(ShObject *obj)
{
	obj->touched = GetCurrentSubTransactionId();
	newest_touch = Max(newest_touch, obj->touched);
}

/* Write obj back (writeback.c), as part of the current subtransaction. */
static void
write_back(ShObject *obj, TupleTableSlot *row)
{
	ShObject   *outer = being_written;

	touch(obj);
	being_written = obj;
	PG_TRY();
	{
		sh_write_object(obj, row);
	}
	PG_FINALLY();
	{
		being_written = outer;
	}
	PG_END_TRY();
}

/* A repeat of key at seen was decided on the object's current report (its newest row is not stale). */
static void
note_repeat(ShObject *obj, const ShKey *key, TimestampTz seen)
{
	if (key->has_current && key->current_at == key->last_at && seen > key->last_at)
		obj->repeat_at = Max(obj->repeat_at, seen);
}

/* ---- entries ---- */

static void
state_discard(void)
{
	if (state_cxt != NULL)
		MemoryContextDelete(state_cxt);
	state_cxt = NULL;
	objects = NULL;
	pending = NIL;
	last_locked = NULL;
	newest_touch = InvalidSubTransactionId;
	shrink_at = 0;
}

/* The table the entries describe is gone (DROP and CREATE EXTENSION in one transaction). */
static void
state_check_table(void)
{
	if (objects != NULL && state_recheck)
	{
		state_recheck = false;
		if (sh_relation_oid_if_exists("objects") != state_relid)
			state_discard();
	}
}

static void
state_create(void)
{
	state_cxt = AllocSetContextCreate(TopTransactionContext, "status_history object state",
									  ALLOCSET_DEFAULT_SIZES);
	objects = sh_text_hash_create("status_history object state", sizeof(ShObject), state_cxt);
	shrink_at = 0;
	state_relid = sh_relation_oid("objects");
	state_recheck = false;
}

/*
 * Write back and drop the entries nothing waits for: always safe, they are
 * read again when needed.  Not those with a row whose event is due, or one
 * handed over and not folded yet: a state read afresh would know of neither.
 */
static void
state_shrink(void)
{
	HASH_SEQ_STATUS seq;
	ShObject   *obj;
	long		before = hash_get_num_entries(objects);

	last_locked = NULL;
	hash_seq_init(&seq, objects);
	while ((obj = hash_seq_search(&seq)) != NULL)
	{
		text	   *id = obj->id;

		if (!obj->valid)
			sh_waiting_forget_aborted(obj);
		if (sh_waiting_any(obj) || obj->handed > 0)
			continue;
		/* Folded before this subtransaction, or to be read again: left to a flush. */
		if (obj->pending && (!obj->valid || obj->pending_since < GetCurrentSubTransactionId()))
			continue;
		if (obj->valid)
			write_back(obj, NULL);
		obj->pending = false;
		if (obj->keys != NULL)
			pfree(obj->keys);
		if (obj->waiting != NULL)
			pfree(obj->waiting);
		hash_search(objects, &id, HASH_REMOVE, NULL);
		pfree(id);
	}
	/* The pending list keeps what is still pending (a long COPY has no flush to empty it). */
	{
		List	   *kept = NIL;
		ListCell   *lc;
		MemoryContext old = MemoryContextSwitchTo(state_cxt);

		foreach(lc, pending)
		{
			ShObject   *p = (ShObject *) lfirst(lc);

			if (p->pending)
			{
				p->pending = false; /* (once, should it be listed twice) */
				kept = lappend(kept, p);
			}
		}
		MemoryContextSwitchTo(old);
		list_free(pending);
		pending = kept;
		foreach(lc, pending)
			((ShObject *) lfirst(lc))->pending = true;
	}
	shrink_at = Max((long) cache_max_objects, 2 * hash_get_num_entries(objects));
	elog(DEBUG1, "status_history: %ld of %ld cached object states dropped, next at %ld",
		 before - hash_get_num_entries(objects), before, shrink_at);
}

/*
 * The object's entry: its row locked (created on its first report, with the
 * fence of a new object), read, its keys read.  The row lock is held to the
 * end of the transaction; the entry is good until the next call of a
 * function of this file that may drop entries (another object's lock).
 */
ShObject *
sh_state_lock(Datum object_id)
{
	text	   *id = DatumGetTextPP(object_id);
	ShObject	fresh;
	ShObject   *obj;
	bool		found;
	bool		created;
	bool		again;
	MemoryContext old;

	state_check_table();
	if (objects == NULL)
		state_create();
	if (last_locked != NULL && last_locked->valid && last_locked != being_written &&
		sh_text_key_match(&last_locked->id, &id, sizeof(text *)) == 0)
	{
		touch(last_locked);
		return last_locked;
	}
	obj = hash_search(objects, &id, HASH_FIND, NULL);
	if (obj != NULL && obj->valid)
	{
		/* A trigger on the state tables reporting on the object being written. */
		if (obj == being_written)
			ereport(ERROR,
					(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
					 errmsg("a report on object \"%s\" was made while its state was being written",
							text_to_cstring(obj->id)),
					 errdetail("A trigger on status_history.objects or replica_state reported on the object whose row it fired for."),
					 errhint("Do not report from triggers on the extension's state tables.")));
		touch(obj);
		last_locked = obj;
		return obj;
	}
	again = obj != NULL;
	if (!again && being_written == NULL &&
		hash_get_num_entries(objects) >= Max((long) cache_max_objects, shrink_at))
		state_shrink();

	/* Locking may run (and roll back) a subtransaction of its own. */
	memset(&fresh, 0, sizeof(fresh));
	ItemPointerSetInvalid(&fresh.current_tid);
	fresh.current_at = fresh.status_since = fresh.last_at = fresh.expires_at = fresh.came_at = SH_NO_STAMP;
	fresh.id = id;
	created = sh_lock_object(object_id, sh_fence_new_object(), &fresh);
	if (objects == NULL)
		state_create();
	old = MemoryContextSwitchTo(state_cxt);
	fresh.id = DatumGetTextPCopy(object_id);
	MemoryContextSwitchTo(old);
	fresh.repeat_at = SH_NO_STAMP;
	if (!created)
		sh_read_keys(&fresh, state_cxt);
	for (int i = 0; i < fresh.nkeys; i++)
		note_repeat(&fresh, &fresh.keys[i], fresh.keys[i].last_seen_at);
	fresh.valid = true;
	fresh.handed_at = SH_NO_STAMP;
	/*
	 * Read for the first time in this transaction (or since it was dropped),
	 * nothing of the object can be waiting for its fold, or handed
	 * over and not folded (every row locked it first).  Read again, it may:
	 * its rows folded while folds were due stay known (but for an aborted
	 * subtransaction's), and rows handed over are looked for by a scan.  (Its
	 * other old memory goes with the transaction: a caller up the stack may
	 * still point at it.)
	 */
	if (again)
	{
		fresh.pending = obj->pending;
		fresh.pending_since = obj->pending_since;
		fresh.came_at = obj->came_at;
		sh_waiting_forget_aborted(obj);
		fresh.waiting = obj->waiting;
		fresh.nwaiting = obj->nwaiting;
		fresh.maxwaiting = obj->maxwaiting;
		fresh.nopen = obj->nopen;
	}
	if (again && obj->handed_at != SH_NO_STAMP && obj->handed_at > fresh.last_at)
	{
		fresh.handed_at = obj->handed_at;
		fresh.handed = 2;
		fresh.handed_dropped = obj->handed_dropped;
		fresh.handed_status = obj->handed_status;
		fresh.handed_stale = obj->handed_stale;
	}
	/* A fence raised and not written yet, by a subtransaction that lives on. */
	if (again && obj->fence_unwritten && obj->fence > fresh.fence)
	{
		fresh.fence = obj->fence;
		fresh.fence_unwritten = true;
		fresh.fence_raised_in = obj->fence_raised_in;
		fresh.dirty = true;
	}
	obj = hash_search(objects, &fresh.id, HASH_ENTER, &found);
	*obj = fresh;
	touch(obj);
	last_locked = obj;
	return obj;
}

/*
 * Lock the object's row (creating it, with the fence of a new object) and
 * keep nothing of it: reconnect() over more objects than the cache holds
 * locks its whole scope first, then reads the states a part at a time.  The
 * row lock is held to the end of the transaction (or of the subtransaction,
 * should it abort).
 */
void
sh_state_lock_row(Datum object_id)
{
	ShObject	tmp;
	ShObject   *obj;
	text	   *id = DatumGetTextPP(object_id);

	state_check_table();
	if (objects != NULL)
	{
		obj = hash_search(objects, &id, HASH_FIND, NULL);
		if (obj != NULL && obj->valid)
			return;				/* locked in this transaction already */
	}
	memset(&tmp, 0, sizeof(tmp));
	ItemPointerSetInvalid(&tmp.current_tid);
	tmp.current_at = tmp.status_since = tmp.last_at = tmp.expires_at = SH_NO_STAMP;
	tmp.id = id;
	(void) sh_lock_object(object_id, sh_fence_new_object(), &tmp);
}

/* Objects whose state one transaction keeps (status_history.cache_max_objects). */
int
sh_state_cache_max(void)
{
	return cache_max_objects;
}

/* Write back and drop every entry nothing waits for (reconnect(), between the parts of its scope). */
void
sh_state_forget_settled(void)
{
	state_check_table();
	if (objects != NULL && being_written == NULL)
		state_shrink();
}

/* ---- the rules ---- */

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
	key = sh_key_for(obj, row.replica_id, state_cxt);
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
	key = sh_key_for(obj, row.replica_id, state_cxt);
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
		if (!obj->pending)
		{
			MemoryContext old = MemoryContextSwitchTo(state_cxt);

			pending = lappend(pending, obj);
			MemoryContextSwitchTo(old);
			obj->pending = true;
			obj->pending_since = GetCurrentSubTransactionId();
		}
	}
}

/*
 * The end of a statement that stored rows (the executor's finish, the end
 * of a COPY), or before SQL reads the state tables: write back the objects
 * folded since.  Only those first folded in this subtransaction or in one it
 * took over: a write here of a fold made before would go if this
 * subtransaction aborts (the fold would not: its row stays).  An entry an
 * aborted subtransaction invalidated is read again and caught up first.
 */
void
sh_state_flush(void)
{
	SubTransactionId here = GetCurrentSubTransactionId();
	List	   *later = NIL;

	state_check_table();
	if (objects == NULL || pending == NIL || being_written != NULL || sh_own_write())
		return;
	/* By index, the list kept until done: an error leaves the rest for the next flush. */
	for (int i = 0; i < list_length(pending); i++)
	{
		ShObject   *obj = (ShObject *) list_nth(pending, i);

		if (!obj->pending)
			continue;
		if (obj->pending_since < here)
		{
			MemoryContext old = MemoryContextSwitchTo(state_cxt);

			later = lappend(later, obj);
			MemoryContextSwitchTo(old);
			continue;
		}
		if (!obj->valid)
			obj = sh_state_lock(PointerGetDatum(obj->id));
		sh_state_catch_up(obj);
		write_back(obj, NULL);
		obj->pending = false;
	}
	list_free(pending);
	pending = later;
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
	note_repeat(obj, key, seen);
	write_back(obj, NULL);
}

/*
 * Write back every entry that differs from its rows: before SQL reads the
 * state tables (reconnect(), retire_replica(), prune()), and at commit
 * (where nothing is normally left to write: each statement's end wrote its
 * objects).
 */
void
sh_state_settle(void)
{
	HASH_SEQ_STATUS seq;
	ShObject   *obj;

	state_check_table();
	if (objects == NULL || sh_own_write())
		return;
	sh_state_flush();
	hash_seq_init(&seq, objects);
	while ((obj = hash_seq_search(&seq)) != NULL)
		if (obj->valid)
			write_back(obj, NULL);
}

/*
 * Settle and forget every entry: someone else's SQL is about to change the
 * state tables.  The entries are read again when next needed (their memory
 * stays: this may run inside our own write, from a trigger on those tables).
 */
void
sh_state_invalidate(void)
{
	HASH_SEQ_STATUS seq;
	ShObject   *obj;

	state_check_table();
	if (objects == NULL)
		return;
	hash_seq_init(&seq, objects);
	while ((obj = hash_seq_search(&seq)) != NULL)
	{
		if (obj->valid && obj != being_written)
			write_back(obj, NULL);
		obj->valid = false;
	}
}

/* ---- transaction boundaries ---- */

static void
state_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			sh_state_settle();
			sh_rowwriter_forget(true);
			sh_notify_pre_commit();
			break;
		case XACT_EVENT_PRE_PREPARE:
			sh_state_settle();
			sh_rowwriter_forget(true);
			sh_notify_reset();	/* a prepared transaction may not NOTIFY */
			break;
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
			break;
		default:
			sh_rowwriter_forget(event == XACT_EVENT_COMMIT || event == XACT_EVENT_PREPARE);
			/* The memory is gone with the transaction. */
			state_cxt = NULL;
			objects = NULL;
			pending = NIL;
			last_locked = NULL;
			sh_imports_reset();
			being_written = NULL;
			newest_touch = InvalidSubTransactionId;
			shrink_at = 0;
			sh_notify_reset();
			break;
	}
}

static void
state_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB || event == SUBXACT_EVENT_COMMIT_SUB)
		sh_notify_subxact(event == SUBXACT_EVENT_COMMIT_SUB);
	/* Its rows, locks and writes are gone: so is what the entries read or folded in it. */
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		sh_imports_abort(mySubid);
		sh_rowwriter_subabort(mySubid);
	}
	if (event == SUBXACT_EVENT_ABORT_SUB && objects != NULL && newest_touch >= mySubid)
	{
		HASH_SEQ_STATUS seq;
		ShObject   *obj;

		hash_seq_init(&seq, objects);
		while ((obj = hash_seq_search(&seq)) != NULL)
		{
			if (obj->touched >= mySubid)
				obj->valid = false;
			/* Only its folds are gone: nothing to write (and its row may be gone too). */
			if (obj->pending && obj->pending_since >= mySubid)
				obj->pending = false;
			if (obj->fence_unwritten && obj->fence_raised_in >= mySubid)
				obj->fence_unwritten = false;	/* (the fence read again is the table's) */
		}
	}
}

/*
 * The end of a statement that may have stored rows.  Its statement
 * trigger's WHEN (history_written()) normally wrote back what it folded;
 * an executor stopped early by a row limit never got there: write it back
 * before its AFTER triggers run (they see the state as their rows made it)
 * and again after them (they may have reported).
 */
static void
state_executor_finish(QueryDesc *queryDesc)
{
	bool		writes = queryDesc->plannedstmt->commandType != CMD_SELECT ||
		queryDesc->plannedstmt->hasModifyingCTE;

	if (writes)
		sh_state_flush();
	if (next_executor_finish)
		next_executor_finish(queryDesc);
	else
		standard_ExecutorFinish(queryDesc);
	if (writes)
		sh_state_flush();
}

static void
state_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == state_relid)
		state_recheck = true;
	sh_rowwriter_invalidate(relid);
}

void
sh_state_init(void)
{
	DefineCustomIntVariable("status_history.cache_max_objects",
							"Objects whose state one transaction keeps in memory.",
							"Past it, states nothing waits for are written back and forgotten, and read again when needed.",
							&cache_max_objects, 262144, 1, INT_MAX / 2,
							PGC_USERSET, 0, NULL, NULL, NULL);
	RegisterXactCallback(state_xact_callback, NULL);
	RegisterSubXactCallback(state_subxact_callback, NULL);
	CacheRegisterRelcacheCallback(state_relcache_callback, (Datum) 0);
	next_executor_finish = ExecutorFinish_hook;
	ExecutorFinish_hook = state_executor_finish;
}
