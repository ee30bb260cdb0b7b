/*
 * floors.c — the generation floors as reporters see them: read once per
 * transaction (and replica) into memory, with a dirty snapshot, and what a
 * transaction has done that reconnect() must know (reported; copying).
 *
 * A floor fences objects nobody has reported on yet (fence.c raises them):
 * a report is stale when its generation is below the database-wide floor or
 * its replica's.  Every reporting transaction takes ROW EXCLUSIVE on
 * status_history.floors (a fast-path lock, once per transaction) before it
 * reads the floors, and keeps it: reconnect() raises a floor, then waits for
 * every transaction that held that lock before.  A floor being raised by a
 * reconnect() that has not committed yet already counts (if it then rolls
 * back, the report was stale for nothing: recorded, never lost).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "parser/parse_relation.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

/* This transaction has reported: reconnect() may no longer run in it. */
static bool xact_reported = false;
static bool in_reconnect = false;

/* Floors read by this transaction: database-wide, and per replica. */
typedef struct ReplicaFloor
{
	text	   *key;			/* replica id, in floors_context */
	int64		floor;
} ReplicaFloor;

static void forget_floors(void);

static bool floors_read = false;
static Oid	floors_relid = InvalidOid;	/* the floors table they were read from */
static bool floors_recheck = false;	/* it may have been dropped meanwhile */
static int64 floor_all = 0;			/* counting floors being raised */
static int64 floor_all_committed = 0;	/* without them: for new objects' fence */
static MemoryContext floors_context = NULL;	/* child of TopTransactionContext */
static HTAB *replica_floors = NULL;

/* ---- floors, as reporters see them ---- */

/*
 * The highest generation of any version of the floor row, committed or not;
 * *committed (if not NULL) gets the highest committed (or our own) one.
 */
static int64
read_floor(Datum replica_id, bool replica_null, int64 *committed)
{
	Oid			relid = sh_relation_oid_if_exists("floors");
	Relation	rel;
	Relation	index;
	SnapshotData dirty;
	IndexScanDesc scan;
	ScanKeyData key;
	TupleTableSlot *slot;
	AttrNumber	genatt;
	AttrNumber	retiredatt;
	int64		floor = 0;

	/* A database still at 0.1.0 (not yet updated) has no floors. */
	if (!OidIsValid(relid))
		return 0;
	rel = table_open(relid, RowExclusiveLock);
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
		Datum		d = slot_getattr(slot, genatt, &isnull);

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
		/* The dirty snapshot names the inserter of a version still in progress. */
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

/*
 * The floor a report from replica_id must reach: the database-wide floor, or
 * that replica's when higher.  Read once per transaction (and replica): a
 * reconnect() raising a floor later waits for this transaction to end, so
 * this transaction's reports come before it.
 */
int64
sh_fence_floor(Datum replica_id, bool replica_null)
{
	text	   *key;
	ReplicaFloor *entry;
	bool		found;

	if (floors_read && floors_recheck)
	{
		/* DROP and CREATE EXTENSION in this transaction: other floors. */
		floors_recheck = false;
		if (sh_relation_oid_if_exists("floors") != floors_relid)
			forget_floors();
	}
	if (!floors_read)
	{
		floors_relid = sh_relation_oid_if_exists("floors");

		floor_all = read_floor((Datum) 0, true, &floor_all_committed);
		floors_context = AllocSetContextCreate(TopTransactionContext,
											   "status_history floors",
											   ALLOCSET_SMALL_SIZES);
		replica_floors = sh_text_hash_create("status_history floors", sizeof(ReplicaFloor),
											 floors_context);
		floors_read = true;
	}
	if (replica_null)
		return floor_all;
	key = DatumGetTextPP(replica_id);
	entry = hash_search(replica_floors, &key, HASH_FIND, NULL);
	if (entry == NULL)
	{
		int64		floor = read_floor(replica_id, false, NULL);

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

/* Forget the floors read: a reconnect() raised one, or rolled one back. */
static void
forget_floors(void)
{
	if (floors_context != NULL && floors_read)
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

static void
floors_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_PRE_COMMIT || event == XACT_EVENT_PRE_PREPARE ||
		event == XACT_EVENT_PARALLEL_PRE_COMMIT)
		return;
	xact_reported = false;
	in_reconnect = false;
	/* Freed with TopTransactionContext. */
	floors_context = NULL;
	replica_floors = NULL;
	floors_read = false;
}

/* A rolled-back reconnect() may have raised a floor we cached: read again. */
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
