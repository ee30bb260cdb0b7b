/*
 * state.c — the per-object state of this transaction: its entries (locked,
 * read, read again, dropped), their write-back at the end of a statement,
 * and the transaction's boundaries.  fold.c has the rule that keeps them
 * true (folding, catching up); both follow the rule stated here.
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
void
sh_state_write_back(ShObject *obj, TupleTableSlot *row)
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
void
sh_state_note_repeat(ShObject *obj, const ShKey *key, TimestampTz seen)
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
			sh_state_write_back(obj, NULL);
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
		sh_state_note_repeat(&fresh, &fresh.keys[i], fresh.keys[i].last_seen_at);
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

/* obj was folded: write it back at the end of the statement (sh_state_flush()). */
void
sh_state_queue(ShObject *obj)
{
	MemoryContext old;

	if (obj->pending)
		return;
	old = MemoryContextSwitchTo(state_cxt);
	pending = lappend(pending, obj);
	MemoryContextSwitchTo(old);
	obj->pending = true;
	obj->pending_since = GetCurrentSubTransactionId();
}

/* The memory of this transaction's entries (their keys, their ids). */
MemoryContext
sh_state_memory(void)
{
	return state_cxt;
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
		sh_state_write_back(obj, NULL);
		obj->pending = false;
	}
	list_free(pending);
	pending = later;
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
			sh_state_write_back(obj, NULL);
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
			sh_state_write_back(obj, NULL);
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
		sh_forget_blocks();
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
