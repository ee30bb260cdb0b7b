/*
 * floors.c — the generation floors as reporters see them, and what a
 * transaction has done that reconnect() must know (reported; copying).
 *
 * A floor fences objects nobody has reported on yet (fence.c raises them):
 * a report is stale when its generation is below the database-wide floor or
 * its replica's.  Every reporting transaction takes ROW EXCLUSIVE on
 * status_history.floors (a fast-path lock, once per transaction) and keeps
 * it: reconnect() raises a floor, then waits for every transaction that held
 * that lock before.  A floor being raised by a reconnect() that has not
 * committed yet already counts (if it then rolls back, the report was stale
 * for nothing: recorded, never lost).
 *
 * The floors are read with a dirty snapshot and kept across transactions,
 * checked once per transaction against a counter in shared memory that every
 * statement writing floors raises after its writes (the floors_changed
 * trigger).  Only committed floors are kept: a transaction that saw a floor
 * being written, or that aborted, forgets what it read at its end.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "commands/trigger.h"
#include "parser/parse_relation.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_floors_changed);

/* This transaction has reported: reconnect() may no longer run in it. */
static bool xact_reported = false;
static bool in_reconnect = false;

/* Floors read, per replica. */
typedef struct ReplicaFloor
{
	text	   *key;			/* replica id, in floors_context */
	int64		floor;
} ReplicaFloor;

/* Raised by every statement that wrote floors, in any database. */
typedef struct FloorsShared
{
	pg_atomic_uint64 changes;
} FloorsShared;

/* More replicas, or more bytes of their ids, than this kept: start again. */
#define MAX_KEPT_REPLICAS 4096
#define MAX_KEPT_BYTES (1024 * 1024)

static void forget_floors(void);

static FloorsShared *floors_shared = NULL;
static bool floors_read = false;	/* what follows holds floors */
static uint64 floors_changes = 0;	/* floors_shared->changes when read */
static Oid	floors_relid = InvalidOid;	/* the floors table they were read from */
static bool floors_recheck = false;	/* DDL on it, or dropped, meanwhile */
static bool xact_checked = false;	/* floors locked in this transaction */
static bool xact_counter_checked = false;	/* and the counter compared */
static bool xact_saw_writes = false;	/* read a floor being written: do not keep */
static int64 floor_all = 0;			/* counting floors being raised */
static int64 floor_all_committed = 0;	/* without them: for new objects' fence */
static MemoryContext floors_context = NULL;	/* child of TopMemoryContext */
static HTAB *replica_floors = NULL;
static Size replica_floors_bytes = 0;	/* of the ids kept in it */

/* ---- the counter in shared memory ---- */

/* Attach on first use: a few bytes, taken from the space left for add-ins. */
static FloorsShared *
floors_counter(void)
{
	bool		found;

	if (floors_shared != NULL)
		return floors_shared;
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	floors_shared = ShmemInitStruct("status_history floors", sizeof(FloorsShared), &found);
	if (!found)
		pg_atomic_init_u64(&floors_shared->changes, 0);
	LWLockRelease(AddinShmemInitLock);
	return floors_shared;
}

/* Every backend's kept floors are out of date: ours, and by the counter theirs. */
static void
floors_changed(void)
{
	(void) pg_atomic_fetch_add_u64(&floors_counter()->changes, 1);
	forget_floors();
}

/*
 * SQL: AFTER INSERT OR UPDATE OR DELETE FOR EACH ROW and AFTER TRUNCATE on
 * status_history.floors, whoever writes (the extension, a restore, logical
 * replication's apply worker).  After the write: a backend that read the
 * floors before it reads them again, one that reads them later sees the
 * version being written and does not keep it.
 */
Datum
status_history_floors_changed(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("floors_changed: not called by trigger manager")));
	floors_changed();
	return PointerGetDatum(NULL);
}

/* ---- floors, as reporters see them ---- */

/*
 * The highest generation of any version of the floor row, committed or not;
 * *committed (if not NULL) gets the highest committed (or our own) one.  A
 * version someone is still writing makes this transaction's reads unfit to
 * keep.
 */
static int64
read_floor(Datum replica_id, bool replica_null, int64 *committed)
{
	Relation	rel;
	Relation	index;
	SnapshotData dirty;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *slot;
	AttrNumber	genatt;
	AttrNumber	retiredatt;
	int64		floor = 0;

	rel = table_open(floors_relid, RowExclusiveLock);
	index = index_open(sh_relation_oid("floors_replica_key"), AccessShareLock);
	slot = table_slot_create(rel, NULL);
	genatt = attnameAttNum(rel, "generation", false);
	/* (A database still at 0.2.0 has no retired_at.) */
	retiredatt = attnameAttNum(rel, "retired_at", true);
	InitDirtySnapshot(dirty);
	if (replica_null)
		ScanKeyEntryInitialize(&key, SK_ISNULL | SK_SEARCHNULL, 1, InvalidStrategy,
							   InvalidOid, InvalidOid, InvalidOid, (Datum) 0);
	else
	{
		ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, replica_id);
		key.sk_collation = index->rd_indcollation[0];
	}
	scan = index_beginscan(rel, index, &dirty, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	if (committed != NULL)
		*committed = 0;
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		d;

		/* The dirty snapshot names the writer of a version still in progress. */
		if (TransactionIdIsValid(dirty.xmin) || TransactionIdIsValid(dirty.xmax))
			xact_saw_writes = true;
		d = slot_getattr(slot, genatt, &isnull);
		if (isnull)
			continue;
		/* A retired replica's floor is above every generation. */
		if (retiredatt > 0)
		{
			(void) slot_getattr(slot, retiredatt, &isnull);
			if (!isnull)
				d = Int64GetDatum(SH_RETIRED);
		}
		floor = Max(floor, DatumGetInt64(d));
		if (committed != NULL && !TransactionIdIsValid(dirty.xmin))
			*committed = Max(*committed, DatumGetInt64(d));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	/* Keep ROW EXCLUSIVE to the end: reconnect() waits for us through it. */
	table_close(rel, NoLock);
	return floor;
}

/* An empty table of replicas' floors, in a context of its own. */
static void
new_replica_floors(void)
{
	if (floors_context != NULL)
		MemoryContextDelete(floors_context);
	floors_context = AllocSetContextCreate(TopMemoryContext,
										   "status_history floors",
										   ALLOCSET_SMALL_SIZES);
	replica_floors = sh_text_hash_create("status_history floors", sizeof(ReplicaFloor),
										 floors_context);
	replica_floors_bytes = 0;
}

/*
 * Once per transaction: take ROW EXCLUSIVE on floors (reconnect() waits for
 * us through it), then keep the floors read before only if no statement has
 * written floors since.  False for a database still at 0.1.0 (no floors).
 */
static bool
check_floors(void)
{
	uint64		changes;

	while (!xact_checked || floors_recheck)
	{
		Oid			relid = sh_relation_oid_if_exists("floors");

		/* DDL on floors (a rewrite changes values without a row trigger): read again. */
		if (floors_recheck || relid != floors_relid)
			forget_floors();
		floors_recheck = false;
		floors_relid = relid;
		if (!OidIsValid(relid))
			return false;
		/* Taking the lock reads invalidations: the table may be gone since. */
		LockRelationOid(relid, RowExclusiveLock);
		xact_checked = true;
	}
	if (!OidIsValid(floors_relid))
		return false;
	if (floors_read && xact_counter_checked)
		return true;
	/* The lock is a barrier: a raise we do not wait for changed the counter before it. */
	pg_memory_barrier();
	changes = pg_atomic_read_u64(&floors_counter()->changes);
	xact_counter_checked = true;
	if (floors_read && changes == floors_changes)
		return true;
	forget_floors();
	floors_changes = changes;
	floor_all = read_floor((Datum) 0, true, &floor_all_committed);
	new_replica_floors();
	floors_read = true;
	return true;
}

/*
 * The floor a report from replica_id must reach: the database-wide floor, or
 * that replica's when higher.  Read once per transaction (and replica) at
 * most: a reconnect() raising a floor later waits for this transaction to
 * end, so this transaction's reports come before it.
 */
int64
sh_fence_floor(Datum replica_id, bool replica_null)
{
	text	   *key;
	ReplicaFloor *entry;
	bool		found;

	if (!check_floors())
		return 0;
	if (replica_null)
		return floor_all;
	key = DatumGetTextPP(replica_id);
	entry = hash_search(replica_floors, &key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		int64		floor = read_floor(replica_id, false, NULL);

		/* (Replica ids have no length limit: the bytes are bounded too.) */
		if (hash_get_num_entries(replica_floors) >= MAX_KEPT_REPLICAS ||
			replica_floors_bytes + VARSIZE_ANY(key) > MAX_KEPT_BYTES)
			new_replica_floors();
		replica_floors_bytes += VARSIZE_ANY(key);
		key = (text *) MemoryContextAlloc(floors_context, VARSIZE_ANY(key));
		memcpy(key, DatumGetTextPP(replica_id), VARSIZE_ANY(DatumGetTextPP(replica_id)));
		entry = hash_search(replica_floors, &key, HASH_ENTER, &found);
		entry->key = key;
		entry->floor = floor;
	}
	return Max(floor_all, entry->floor);
}

/*
 * The floor a reconnect() with an object list must reach: the committed
 * database-wide floor and the replica's (a floor still being raised may yet
 * roll back; if it commits, its reconnect holds the listed objects' locks
 * and raised their fences first).  Read afresh: reconnects are rare.
 */
int64
sh_fence_committed_floor(Datum replica_id, bool replica_null)
{
	int64		all;
	int64		replica = 0;

	if (!check_floors())
		return 0;
	(void) read_floor((Datum) 0, true, &all);
	if (!replica_null)
		(void) read_floor(replica_id, false, &replica);
	return Max(all, replica);
}

/*
 * The fence a new object's row starts with: the committed database-wide
 * floor.  A floor still being raised makes reports stale, but must not stay
 * in a row if the reconnect() raising it fails or rolls back.
 */
int64
sh_fence_new_object(void)
{
	(void) sh_fence_floor((Datum) 0, true);
	return floor_all_committed;
}

/* Someone else's SQL changed the floors: read them again. */
void
sh_fence_forget_floors(void)
{
	forget_floors();
}

/* Forget the floors read: a statement wrote floors, or rolled a write back. */
static void
forget_floors(void)
{
	if (floors_context != NULL)
		MemoryContextDelete(floors_context);
	floors_context = NULL;
	replica_floors = NULL;
	floors_read = false;
}

/* Reconnect's own copies are not the caller's reports. */
void
sh_fence_note_report(void)
{
	if (!in_reconnect)
		xact_reported = true;
}

bool
sh_fence_in_reconnect(void)
{
	return in_reconnect;
}

/* reconnect() and retire_replica() append rows that are not the caller's reports. */
void
sh_fence_set_in_reconnect(bool on)
{
	in_reconnect = on;
	if (!on)
		xact_reported = true;
}

/*
 * Refuse a call that waits for every reporting transaction, in a transaction
 * that has reported (it holds object locks those may wait for).
 */
void
sh_fence_check_unreported(const char *what)
{
	if (xact_reported)
		ereport(ERROR,
				(errcode(ERRCODE_ACTIVE_SQL_TRANSACTION),
				 errmsg("%s must run before any report, reconnect() or retire_replica() in its transaction", what),
				 errdetail("It waits for every transaction that is reporting, and this one has held object locks (a savepoint rolled back since may have released them, but this is not tracked)."),
				 errhint("Call it in its own transaction or first in it%s.",
						 strcmp(what, "reconnect() without object_ids") == 0 ?
						 ", or list the objects in object_ids" : "")));
}

/*
 * Keep the floors read past a commit unless some were being written: an
 * aborted or prepared transaction may have read its own writes, which are
 * not (yet) committed.
 */
static void
floors_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE ||
		event == XACT_EVENT_PARALLEL_PRE_COMMIT)
		return;
	if (event != XACT_EVENT_COMMIT || xact_saw_writes)
		forget_floors();
	xact_reported = false;
	in_reconnect = false;
	xact_checked = false;
	xact_counter_checked = false;
	xact_saw_writes = false;
}

/* A rolled-back subtransaction may have raised a floor we read: read again. */
static void
floors_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		forget_floors();
}

static void
floors_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == floors_relid)
		floors_recheck = true;
}

void
sh_floors_init(void)
{
	CacheRegisterRelcacheCallback(floors_relcache_callback, (Datum) 0);
	RegisterXactCallback(floors_xact_callback, NULL);
	RegisterSubXactCallback(floors_subxact_callback, NULL);
}
