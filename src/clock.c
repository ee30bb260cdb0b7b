/*
 * clock.c — the monotonic clock behind every stamp: monotonic_now().
 *
 * A stamp is greatest(clock_timestamp(), last stamp + 1 microsecond).  "last"
 * lives in shared memory, one slot per database, under one LWLock, so stamps
 * are unique and increasing across sessions.  The struct is small enough to
 * come out of the spare shared memory the server keeps for add-ins, so the
 * extension works without shared_preload_libraries; when it is preloaded it
 * reserves the space at start-up instead.
 *
 * Restarts and crashes wipe shared memory.  A slot is therefore seeded on
 * first use from max(occurred_at) in the history and from a persisted bound,
 * the sequence status_history.clock_bound.  The clock never hands out a stamp
 * above the bound without first raising the bound and flushing that to WAL,
 * so after any restart it resumes above every stamp it ever handed out, even
 * if the system clock stepped back in between.  The bound moves one second
 * ahead at a time: at most one WAL flush per second of stamps.
 */
#include "postgres.h"

#include "access/relation.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "replication/syncrep.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "status_history.h"

/* Databases that can use the clock at once, per server start. */
#define CLOCK_SLOTS 64

/* How far ahead of the newest stamp the persisted bound is raised. */
#define BOUND_AHEAD USECS_PER_SEC

/*
 * Once stamps come within this of the bound, the backend taking one raises
 * the bound early, if nobody else is raising it: the others go on stamping
 * below the old bound instead of all waiting out one WAL flush a second.
 */
#define BOUND_EARLY (BOUND_AHEAD / 2)

typedef struct ClockSlot
{
	Oid			dbid;			/* InvalidOid: free */
	Oid			bound_relid;	/* the clock_bound sequence "bound" is persisted in */
	Oid			bound_node;		/* and its relfilenode (a RESTART rewrites it) */
	bool		seeded;			/* last and bound read from the database */
	TimestampTz last;			/* newest stamp handed out or observed */
	TimestampTz bound;			/* persisted: no stamp is handed out above it */
} ClockSlot;

typedef struct ClockShared
{
	int			tranche_id;
	LWLock		lock;			/* guards every slot */
	ClockSlot	slots[CLOCK_SLOTS];
} ClockShared;

static ClockShared *clock_shared = NULL;
static ClockSlot *my_slot = NULL;
static bool bound_checked = false;	/* the slot's sequence is still ours */
static Oid	bound_checked_relid = InvalidOid;

static void clock_relcache_callback(Datum arg, Oid relid);

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

PG_FUNCTION_INFO_V1(status_history_monotonic_now);

/* Find or create the shared struct; safe in the postmaster and in backends. */
static void
clock_attach(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	clock_shared = ShmemInitStruct("status_history clock", sizeof(ClockShared), &found);
	if (!found)
	{
		memset(clock_shared, 0, sizeof(ClockShared));
		clock_shared->tranche_id = LWLockNewTrancheId();
		LWLockInitialize(&clock_shared->lock, clock_shared->tranche_id);
	}
	LWLockRelease(AddinShmemInitLock);
	LWLockRegisterTranche(clock_shared->tranche_id, "status_history_clock");
}

static void
clock_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(ClockShared)));
}

/* Runs at every (re)initialization of shared memory, crash restarts included. */
static void
clock_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	clock_shared = NULL;
	my_slot = NULL;
	clock_attach();
}

/* Preloaded: reserve the space up front.  Otherwise attach lazily. */
void
sh_clock_init(void)
{
	CacheRegisterRelcacheCallback(clock_relcache_callback, (Datum) 0);
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = clock_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = clock_shmem_startup;
}

/* Free the slots of databases that no longer exist; true if any was freed. */
static bool
clock_reclaim(void)
{
	Oid			dbids[CLOCK_SLOTS];
	bool		freed = false;

	LWLockAcquire(&clock_shared->lock, LW_SHARED);
	for (int i = 0; i < CLOCK_SLOTS; i++)
		dbids[i] = clock_shared->slots[i].dbid;
	LWLockRelease(&clock_shared->lock);

	/* Catalog lookups outside the lock; the slot is freed only if unchanged. */
	for (int i = 0; i < CLOCK_SLOTS; i++)
	{
		if (!OidIsValid(dbids[i]) ||
			SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i])))
			continue;
		LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
		if (clock_shared->slots[i].dbid == dbids[i])
		{
			clock_shared->slots[i].dbid = InvalidOid;
			freed = true;
		}
		LWLockRelease(&clock_shared->lock);
	}
	return freed;
}

/* Find or claim this database's slot; NULL when every slot is taken. */
static ClockSlot *
clock_claim(void)
{
	ClockSlot  *slot = NULL;
	ClockSlot  *free_slot = NULL;

	LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
	for (int i = 0; i < CLOCK_SLOTS && slot == NULL; i++)
	{
		if (clock_shared->slots[i].dbid == MyDatabaseId)
			slot = &clock_shared->slots[i];
		else if (clock_shared->slots[i].dbid == InvalidOid && free_slot == NULL)
			free_slot = &clock_shared->slots[i];
	}
	if (slot == NULL && free_slot != NULL)
	{
		slot = free_slot;
		memset(slot, 0, sizeof(ClockSlot));
		slot->dbid = MyDatabaseId;
	}
	LWLockRelease(&clock_shared->lock);
	return slot;
}

/* This database's slot, claimed on first use. */
static ClockSlot *
clock_slot(void)
{
	ClockSlot  *slot;

	if (my_slot != NULL && my_slot->dbid == MyDatabaseId)
		return my_slot;
	if (clock_shared == NULL)
		clock_attach();

	slot = clock_claim();
	if (slot == NULL && clock_reclaim())
		slot = clock_claim();
	if (slot == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("the status_history clock has no free slot for this database"),
				 errdetail("The clock keeps state for at most %d databases per server start.",
						   CLOCK_SLOTS),
				 errhint("Restart the server to release the slots of databases that no longer use the extension.")));
	my_slot = slot;
	return slot;
}

/* Read max(occurred_at) and the persisted bound, and fold them into the slot. */
static void
clock_seed(ClockSlot *slot)
{
	ShSavedUser saved;
	TimestampTz table_max = 0;
	TimestampTz bound = 0;
	bool		isnull;
	int			ret;

	SPI_connect();
	sh_become_owner(sh_relation_oid("clock_bound"), &saved);
	ret = SPI_execute("SELECT pg_catalog.max(h.occurred_at),"
					  "       (SELECT b.last_value FROM status_history.clock_bound AS b)"
					  "  FROM status_history.history AS h",
					  true, 1);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "status_history: reading the clock seed failed: %s",
			 SPI_result_code_string(ret));
	table_max = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 1, &isnull));
	if (isnull)
		table_max = 0;
	bound = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 2, &isnull));
	if (isnull)
		bound = 0;
	sh_restore_user(&saved);
	SPI_finish();

	LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
	slot->last = Max(slot->last, Max(table_max, bound));
	slot->bound = Max(slot->bound, bound);
	slot->seeded = true;
	LWLockRelease(&clock_shared->lock);
}

/*
 * The bound in the slot is only as good as the sequence it was persisted in.
 * When the extension was dropped and created again, or the sequence was
 * restarted, that sequence is gone: forget the bound (the last stamp stays),
 * so that the next stamp persists a new one.
 */
static void
clock_check_bound(ClockSlot *slot)
{
	Oid			relid = sh_relation_oid("clock_bound");
	Relation	seq = relation_open(relid, AccessShareLock);
	Oid			node = seq->rd_node.relNode;

	relation_close(seq, AccessShareLock);
	bound_checked_relid = relid;
	LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
	if (slot->bound_relid != relid || slot->bound_node != node)
	{
		slot->bound_relid = relid;
		slot->bound_node = node;
		slot->bound = 0;
		slot->seeded = false;
	}
	LWLockRelease(&clock_shared->lock);
	bound_checked = true;
}

/* The sequence changed (or everything did): check it again. */
static void
clock_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == bound_checked_relid)
		bound_checked = false;
}

/* The slot, seeded; every entry point goes through here. */
static ClockSlot *
clock_ready(void)
{
	ClockSlot  *slot = clock_slot();

	if (!bound_checked)
		clock_check_bound(slot);
	if (!slot->seeded)
		clock_seed(slot);
	return slot;
}

/* Stamps persist a bound, so they need a writable primary. */
static void
clock_check_writable(void)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot take a status_history stamp during recovery"),
				 errdetail("Stamps are handed out only by the primary server."),
				 errhint("Read status_history.statuses or latest() here; report on the primary.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot take a status_history stamp in a read-only transaction"),
				 errdetail("The clock persists its high-water mark so that it survives crashes."),
				 errhint("Take stamps and report in a read-write transaction.")));
}

/*
 * Persist a bound of at least target, unless the bound covers needed
 * already.  A session lock on the sequence keeps two raisers from writing
 * out of order (a lower bound after a higher one).  !wait: an early raise,
 * given up if another raiser holds the lock.
 */
static void
clock_raise_bound(ClockSlot *slot, TimestampTz needed, TimestampTz target, bool wait)
{
	Oid			seqid = sh_relation_oid("clock_bound");
	LockRelId	lockid;
	LOCKTAG		tag;
	ShSavedUser saved;

	lockid.relId = seqid;
	lockid.dbId = MyDatabaseId;
	/* An early raise gives way to one under way (its raiser covers us). */
	SET_LOCKTAG_RELATION(tag, lockid.dbId, lockid.relId);
	if (LockAcquire(&tag, ShareUpdateExclusiveLock, true, !wait) == LOCKACQUIRE_NOT_AVAIL)
		return;
	PG_TRY();
	{
		TimestampTz current;

		LWLockAcquire(&clock_shared->lock, LW_SHARED);
		current = slot->bound;
		LWLockRelease(&clock_shared->lock);

		/*
		 * Only if the bound does not cover the stamp yet: whoever held the
		 * lock before us may have raised it a second ahead already (each
		 * waiter raising it again by a few microseconds serialized a flush
		 * per backend under load).
		 */
		if (current < needed)
		{
			sh_become_owner(seqid, &saved);
			DirectFunctionCall2(setval_oid, ObjectIdGetDatum(seqid), Int64GetDatum(target));
			sh_restore_user(&saved);
			/*
			 * Durable before any stamp below it is handed out, and on the
			 * synchronous standbys too: a stamp returned by a transaction
			 * that commits nothing must not be handed out again after a
			 * failover.  (A no-op without synchronous replication.)
			 */
			XLogFlush(XactLastRecEnd);
			SyncRepWaitForLSN(XactLastRecEnd, false);

			LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
			slot->bound = Max(slot->bound, target);
			LWLockRelease(&clock_shared->lock);
		}
	}
	PG_FINALLY();
	{
		UnlockRelationIdForSession(&lockid, ShareUpdateExclusiveLock);
	}
	PG_END_TRY();
}

/*
 * The next stamp: greatest(now, last + 1us), never above the persisted
 * bound.  hold: it may become a row, so the change feed holds it first
 * (horizon.c); monotonic_now()'s stamps do not (nobody could hold the feed
 * up with them).
 */
static TimestampTz
clock_next(bool hold)
{
	ClockSlot  *slot;

	clock_check_writable();
	slot = clock_ready();
	/* The change feed's hold first, then the stamp (horizon.c). */
	if (hold && !sh_horizon_holding())
	{
		TimestampTz newest;

		LWLockAcquire(&clock_shared->lock, LW_SHARED);
		newest = slot->last;
		LWLockRelease(&clock_shared->lock);
		sh_horizon_before_stamp(newest);
	}
	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz stamp;

		LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
		stamp = Max(now, slot->last + 1);
		if (stamp <= slot->bound)
		{
			bool		early = slot->bound - stamp < BOUND_EARLY;

			slot->last = stamp;
			LWLockRelease(&clock_shared->lock);
			if (early && IS_VALID_TIMESTAMP(stamp + BOUND_AHEAD))
				clock_raise_bound(slot, stamp + BOUND_EARLY, stamp + BOUND_AHEAD, false);
			return stamp;
		}
		LWLockRelease(&clock_shared->lock);

		if (!IS_VALID_TIMESTAMP(stamp + BOUND_AHEAD))
			ereport(ERROR,
					(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
					 errmsg("the status_history clock has reached the end of the timestamp range"),
					 errdetail("A stamp was imported close to the largest timestamp PostgreSQL can store."),
					 errhint("Import stamps no later than the present.")));
		clock_raise_bound(slot, stamp, stamp + BOUND_AHEAD, true);
	}
}

/* A stamp for a row (the insert trigger). */
TimestampTz
sh_clock_next(void)
{
	return clock_next(true);
}

/*
 * An imported stamp: later stamps must come after it, also after a restart
 * (the import may sit in a prepared transaction that commits after one), so
 * the persisted bound is raised above it too.
 */
void
sh_clock_observe(TimestampTz stamp)
{
	ClockSlot  *slot;
	bool		above;

	clock_check_writable();
	slot = clock_ready();
	LWLockAcquire(&clock_shared->lock, LW_EXCLUSIVE);
	slot->last = Max(slot->last, stamp);
	above = stamp > slot->bound;
	LWLockRelease(&clock_shared->lock);
	if (above)
	{
		if (!IS_VALID_TIMESTAMP(stamp + BOUND_AHEAD))
			ereport(ERROR,
					(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
					 errmsg("occurred_at is too close to the end of the timestamp range"),
					 errhint("Import stamps no later than the present.")));
		/*
		 * At least a second past the present, as a stamp would: an import of
		 * old history then raises the bound (a WAL flush) once, not per row.
		 */
		clock_raise_bound(slot, stamp, Max(stamp, GetCurrentTimestamp()) + BOUND_AHEAD, true);
	}
}

/* The newest stamp handed out or observed (an import at or below it moves nothing). */
TimestampTz
sh_clock_last(void)
{
	ClockSlot  *slot = clock_ready();
	TimestampTz last;

	LWLockAcquire(&clock_shared->lock, LW_SHARED);
	last = slot->last;
	LWLockRelease(&clock_shared->lock);
	return last;
}

/* SQL: status_history.monotonic_now() */
Datum
status_history_monotonic_now(PG_FUNCTION_ARGS)
{
	sh_check_version();
	PG_RETURN_TIMESTAMPTZ(clock_next(false));
}
