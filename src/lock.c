/*
 * lock.c — locking an object's row in status_history.objects, and reading
 * what is stored about the object: that row and its keys' rows in
 * status_history.replica_state.
 *
 * Every report locks its object's row before it takes a stamp, so reports on
 * one object are serialized and, for one object, stamp order is commit
 * order.  The row is found and locked directly (index scan +
 * table_tuple_lock) against its newest committed version, as PostgreSQL's
 * RI triggers do, so that REPEATABLE READ and SERIALIZABLE reporters do not
 * fail merely because another reporter committed a newer version.  The
 * first report of an object creates its row.  Nobody else can change the
 * rows of an object while we hold its lock: what is read here stays true
 * for the rest of the transaction, except for our own writes.  Both rows'
 * pages are pruned only when their free space runs low (next_row()).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/heaptoast.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

static TimestampTz
stamp_or_none(TupleTableSlot *slot, AttrNumber att, bool *isnull)
{
	Datum		d = slot_getattr(slot, att, isnull);

	return *isnull ? SH_NO_STAMP : DatumGetTimestampTz(d);
}

/* Copy the locked objects row's state out of the slot. */
static void
read_object_row(TupleTableSlot *slot, ShObject *obj)
{
	TupleDesc	desc = slot->tts_tupleDescriptor;
	AttrNumber	status_att = sh_attnum(desc, "objects", "status");
	AttrNumber	since_att = sh_attnum(desc, "objects", "status_since");
	bool		isnull;
	Datum		d;

	obj->fence = DatumGetInt64(slot_getattr(slot, sh_attnum(desc, "objects", "fence"), &isnull));
	obj->current_at = stamp_or_none(slot, sh_attnum(desc, "objects", "occurred_at"), &isnull);
	obj->has_current = !isnull;
	obj->tid = slot->tts_tid;
	obj->expires_at = SH_NO_STAMP;
	if (!obj->has_current)
		return;
	obj->expires_at = stamp_or_none(slot, sh_attnum(desc, "objects", "expires_at"), &isnull);
	d = slot_getattr(slot, status_att, &isnull);
	if (!isnull)
		text_to_cstring_buffer(DatumGetTextPP(d), obj->status, sizeof(obj->status));
	obj->status_since = stamp_or_none(slot, since_att, &isnull);
	if (isnull)
		obj->status_since = obj->current_at;
	obj->has_written = true;
	strlcpy(obj->written, obj->status, sizeof(obj->written));
}

/*
 * Prune a state row's page only once its free space runs low.  An index
 * scan prunes a page whenever less than the fillfactor's room is free,
 * which on these half-full pages is every time one of their rows was
 * updated: one prune (a WAL record) per row per report.  Pruning only when
 * the largest version a row can have in line (a larger one is toasted)
 * might not fit does it once per many updates, and still leaves room for
 * the next version on the same page (HOT), whatever its size.
 */
#define PRUNE_BELOW_FREE (TOAST_TUPLE_THRESHOLD + sizeof(ItemIdData))

/*
 * reconnect(), retire_replica() and expire() update every row of a page in
 * one transaction: for them a page is pruned as PostgreSQL prunes it, so
 * that all their new versions find room on it.
 */
static bool prune_eagerly = false;

void
sh_lock_prune_eagerly(bool on)
{
	prune_eagerly = on;
}

/*
 * The next row of an index scan of a state table visible to its snapshot,
 * as index_getnext_slot() finds it (the HOT chain followed, as heapam
 * does) but pruning the page only below PRUNE_BELOW_FREE.
 */
static bool
next_row(Relation rel, IndexScanDesc scan, TupleTableSlot *slot)
{
	BufferHeapTupleTableSlot *bslot = (BufferHeapTupleTableSlot *) slot;
	ItemPointer tid;

	Assert(TTS_IS_BUFFERTUPLE(slot));
	for (;;)
	{
		ItemPointerData at;
		Buffer		buf;
		bool		all_dead;
		bool		found;

		if ((tid = index_getnext_tid(scan, ForwardScanDirection)) == NULL)
			return false;
		at = *tid;
		buf = ReadBuffer(rel, ItemPointerGetBlockNumber(&at));

		/* (Unlocked, as heap_page_prune_opt reads it: a hint.) */
		if (prune_eagerly || PageGetHeapFreeSpace(BufferGetPage(buf)) < PRUNE_BELOW_FREE)
			heap_page_prune_opt(rel, buf);
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		found = heap_hot_search_buffer(&at, rel, buf, scan->xs_snapshot,
									   &bslot->base.tupdata, &all_dead, true);
		LockBuffer(buf, BUFFER_LOCK_UNLOCK);
		/* As index_fetch_heap(): an entry whose versions are all dead is marked for the index. */
		if (!scan->xactStartedInRecovery)
			scan->kill_prior_tuple = all_dead;
		if (found)
		{
			pgstat_count_heap_fetch(rel);
			sh_note_block(rel, ItemPointerGetBlockNumber(&at));
			bslot->base.tupdata.t_tableOid = RelationGetRelid(rel);
			ExecStorePinnedBufferHeapTuple(&bslot->base.tupdata, slot, buf);
			return true;
		}
		ReleaseBuffer(buf);
	}
}

/*
 * Open a state table (ROW EXCLUSIVE, kept to the end of the transaction)
 * and one of its indexes: those its kept writer holds open (rowwrite.c),
 * which saves opening them for every object.  True when they are those.
 */
static bool
open_table(Oid relid, Oid indexid, Relation *rel, Relation *index)
{
	if (sh_kept_relation(relid, indexid, rel, index))
		return true;
	*rel = table_open(relid, RowExclusiveLock);
	*index = index_open(indexid, RowExclusiveLock);
	return false;
}

static void
close_table(bool kept, Relation rel, Relation index)
{
	if (kept)
		return;
	index_close(index, NoLock);
	table_close(rel, NoLock);
}

/*
 * Find the object's row and lock its newest version (waiting for whoever
 * holds it).  False when there is none -- also when its newest version is
 * one this command wrote, which the scan does not see (sh_lock_object()
 * then advances the command counter and looks again).  *again: the version
 * found was replaced by this command; advance and look again.
 */
static bool
lock_row(Relation rel, Relation index, Datum object_id, ShObject *obj, bool *again)
{
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *found = table_slot_create(rel, NULL);
	TupleTableSlot *locked = table_slot_create(rel, NULL);
	bool		have = false;

	*again = false;
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, object_id);
	key.sk_collation = index->rd_indcollation[0];

	scan = index_beginscan(rel, index, snapshot, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	while (next_row(rel, scan, found))
	{
		TM_FailureData tmfd;
		ItemPointerData tid = found->tts_tid;
		TM_Result	result;

		result = table_tuple_lock(rel, &tid, snapshot, locked,
								  GetCurrentCommandId(false),
								  LockTupleNoKeyExclusive, LockWaitBlock,
								  TUPLE_LOCK_FLAG_FIND_LAST_VERSION, &tmfd);
		if (result == TM_Ok)
		{
			read_object_row(locked, obj);
			have = true;
			break;
		}
		/* Replaced by this very command: its version is not ours to see yet. */
		if (result == TM_SelfModified || result == TM_Invisible)
		{
			*again = true;
			break;
		}
		if (result != TM_Deleted)
			elog(ERROR, "status_history: unexpected result %d locking an object", (int) result);
		/* Deleted meanwhile (only by hand): treat as missing. */
	}
	index_endscan(scan);
	UnregisterSnapshot(snapshot);
	ExecDropSingleTupleTableSlot(found);
	ExecDropSingleTupleTableSlot(locked);
	return have;
}

/* What a new object's row is made of: its id and its fence. */
typedef struct NewObject
{
	Datum		object_id;
	int64		fence;
} NewObject;

/* sh_rowwriter's fill(): the new row (the rest of its columns null: no report yet). */
static bool
new_object_row(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	NewObject  *n = (NewObject *) arg;

	return sh_row_set(desc, values, isnull, "object_id", n->object_id, false) &&
		sh_row_set(desc, values, isnull, "fence", Int64GetDatum(n->fence), false);
}

/*
 * Insert the object's row; a concurrent creator's row makes this a no-op
 * (as ON CONFLICT DO NOTHING).  True, with the new row's TID, when this call
 * inserted it.
 */
static bool
insert_object_row(Datum object_id, int64 fence, ShObject *obj)
{
	NewObject	n = {object_id, fence};
	ShSavedUser saved;
	ShRowWriter *w;
	bool		created;

	sh_become_owner(sh_relation_oid("objects"), &saved);
	w = sh_rowwriter_begin(sh_relation_oid("objects"));
	created = sh_rowwriter_insert_new(w, sh_relation_oid("objects_pkey"), new_object_row, &n, &obj->tid);
	sh_rowwriter_end(w);
	sh_restore_user(&saved);
	if (created)
		obj->fence = fence;
	return created;
}

/*
 * Lock the object's row, creating it (with fence new_fence) on its first
 * report, and read it into obj (which the caller zeroed).  True when this
 * call created the row: the object has no keys yet.
 */
bool
sh_lock_object(Datum object_id, int64 new_fence, ShObject *obj)
{
	Relation	rel;
	Relation	index;
	bool		kept = open_table(sh_relation_oid("objects"), sh_relation_oid("objects_pkey"), &rel, &index);
	bool		created = false;
	bool		again;

	/*
	 * The command counter is not advanced to look: a row this command wrote
	 * shows up as replaced (again) or as a key already taken, and only then
	 * does it advance.
	 */
	for (int attempt = 0; !lock_row(rel, index, object_id, obj, &again); attempt++)
	{
		if (attempt > 3)
			elog(ERROR, "status_history: object row vanished while being locked");
		if (again)
		{
			sh_advance_command();
			continue;
		}
		/*
		 * A row our transaction inserted needs no lock: nobody else sees it
		 * before we commit, and a concurrent creator waits for us.  (Under
		 * REPEATABLE READ too: the insertion checks the key against every
		 * row, not against our snapshot.)
		 */
		if (insert_object_row(object_id, new_fence, obj))
		{
			created = true;
			(void) sh_attnum(RelationGetDescr(rel), "objects", "status_since");
			break;
		}
		/* Taken: by a creator we waited for, or by this command (visible after this). */
		sh_advance_command();
	}
	close_table(kept, rel, index);
	return created;
}

/* Where the columns a key's state needs are in replica_state. */
typedef struct KeyColumns
{
	AttrNumber	replica_id;
	AttrNumber	last_at;
	AttrNumber	last_seen_at;
	AttrNumber	occurred_at;
	AttrNumber	status;
	AttrNumber	status_since;
	AttrNumber	expires_at;
} KeyColumns;

static void
key_columns(TupleDesc desc, KeyColumns *cols)
{
	cols->replica_id = sh_attnum(desc, "replica_state", "replica_id");
	cols->last_at = sh_attnum(desc, "replica_state", "last_at");
	cols->last_seen_at = sh_attnum(desc, "replica_state", "last_seen_at");
	cols->occurred_at = sh_attnum(desc, "replica_state", "occurred_at");
	cols->status = sh_attnum(desc, "replica_state", "status");
	cols->status_since = sh_attnum(desc, "replica_state", "status_since");
	cols->expires_at = sh_attnum(desc, "replica_state", "expires_at");
}

/* A key's row as state; its replica_id is copied into cxt. */
static void
key_from_slot(TupleTableSlot *slot, const KeyColumns *cols, ShKey *key, MemoryContext cxt)
{
	bool		isnull;
	Datum		replica = slot_getattr(slot, cols->replica_id, &isnull);

	memset(key, 0, sizeof(ShKey));
	if (!isnull)
	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		key->replica_id = DatumGetTextPCopy(replica);
		MemoryContextSwitchTo(old);
	}
	key->stored = true;
	key->tid = slot->tts_tid;
	ItemPointerSetInvalid(&key->last_tid);
	key->last_at = stamp_or_none(slot, cols->last_at, &isnull);
	key->last_seen_at = stamp_or_none(slot, cols->last_seen_at, &isnull);
	key->current_at = stamp_or_none(slot, cols->occurred_at, &isnull);
	key->has_current = !isnull;
	key->status_since = stamp_or_none(slot, cols->status_since, &isnull);
	key->expires_at = stamp_or_none(slot, cols->expires_at, &isnull);
	if (key->has_current)
	{
		Datum		d = slot_getattr(slot, cols->status, &isnull);

		if (!isnull)
			text_to_cstring_buffer(DatumGetTextPP(d), key->status, sizeof(key->status));
	}
}

/*
 * Read every key of a locked object from replica_state (one range scan of
 * its unique index), as of now: our own writes and everything committed.
 * obj->last_at becomes the newest row any of them has folded.
 */
void
sh_read_keys(ShObject *obj, MemoryContext cxt)
{
	/*
	 * ROW EXCLUSIVE, kept to the end: a restore merging rows into
	 * replica_state (SHARE ROW EXCLUSIVE) then waits for this transaction, or
	 * this read waits for it -- never a key written here on a read made
	 * before the restore's rows existed.
	 */
	Relation	rel;
	Relation	index;
	bool		kept = open_table(sh_relation_oid("replica_state"), sh_relation_oid("replica_state_key"),
								  &rel, &index);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	KeyColumns	cols;
	Snapshot	snapshot;
	IndexScanDesc scan;
	ScanKeyData skey;

	key_columns(RelationGetDescr(rel), &cols);
	/*
	 * SnapshotSelf: every committed row and our own latest versions, also
	 * those this command wrote, without advancing the command counter (see
	 * sh_written_by_this_command()).  Nobody else writes these rows while we
	 * hold the object's row lock, so no version in progress can be missed.
	 * SERIALIZABLE reads them through an MVCC snapshot instead, which takes
	 * the predicate locks that let PostgreSQL see a reporter read what a
	 * concurrent one wrote (test/specs/isolation_levels.spec).
	 */
	if (IsolationIsSerializable())
	{
		sh_advance_command();	/* see our own latest write */
		snapshot = RegisterSnapshot(GetLatestSnapshot());
	}
	else
		snapshot = SnapshotSelf;
	scan = index_beginscan(rel, index, snapshot, 1, 0);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(obj->id));
	skey.sk_collation = index->rd_indcollation[0];
	index_rescan(scan, &skey, 1, NULL, 0);
	obj->last_at = obj->has_current ? obj->current_at : SH_NO_STAMP;
	while (next_row(rel, scan, slot))
	{
		ShKey	   *key = sh_key_append(obj, cxt);

		key_from_slot(slot, &cols, key, cxt);
		obj->last_at = Max(obj->last_at, key->last_at);
	}
	index_endscan(scan);
	if (IsMVCCSnapshot(snapshot))
		UnregisterSnapshot(snapshot);
	ExecDropSingleTupleTableSlot(slot);
	close_table(kept, rel, index);
}
