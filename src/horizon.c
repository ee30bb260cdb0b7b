/*
 * horizon.c — the change feed's horizon (feed.c has the SQL functions,
 * stable_horizon() and changes()).
 *
 * A stamp is taken before its row commits, so a row with a lower stamp may
 * become visible after one with a higher stamp.  The stable horizon is a
 * stamp below which every row is committed or will never exist: the oldest
 * stamp a transaction still running (or prepared) may hold, else the next
 * stamp the clock can hand out.  changes(after) returns the rows with
 * after < occurred_at < horizon, read with a snapshot taken after the
 * horizon: a consumer that loops changes(last stamp returned) sees every
 * committed row once, in stamp order.
 *
 * Bookkeeping, in shared memory per database:
 *   holds     per backend (by pgprocno), the lowest stamp its transaction
 *             may hold: published before its first stamp is taken (the
 *             newest stamp then, plus one), lowered by an import; cleared
 *             when the transaction ends (after it is visible).
 *   prepared  a prepared transaction's hold, moved there at PREPARE and kept
 *             while its xid is in progress.  Shared memory does not survive
 *             a restart, and PostgreSQL 15 lets no extension add records to
 *             the two-phase state; but a prepared transaction's rows do
 *             survive, in the history, with their xmin.  So after a restart
 *             the first horizon of a database with prepared transactions
 *             scans the history once for rows whose inserter is still in
 *             progress, and holds their oldest stamp per transaction.
 *   published the highest horizon returned: an import stamped below it is
 *             refused (a consumer may be past it), unless
 *             status_history.import_below_horizon is on.
 * The horizon reads the clock's newest stamp first and the holds second; a
 * backend publishes its hold first and stamps second: whichever order they
 * meet in, the horizon is at most the stamp.
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/subtrans.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/twophase.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "commands/sequence.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "status_history.h"


#define HORIZON_DBS 64			/* as the clock's slots */

typedef struct Hold
{
	Oid			dbid;			/* InvalidOid: none */
	TimestampTz held;
} Hold;

typedef struct PreparedHold
{
	Oid			dbid;			/* InvalidOid: free */
	TransactionId xid;
	TimestampTz held;
} PreparedHold;

typedef struct HorizonDb
{
	Oid			dbid;			/* InvalidOid: free */
	Oid			history;		/* the history it describes (a new extension: a new feed) */
	bool		prepared_found; /* the history was scanned for prepared rows */
	bool		persisted_read; /* published includes the persisted horizon */
	TimestampTz written;		/* the newest horizon written to feed_horizon */
	TimestampTz published;
	TimestampTz persisted;		/* in status_history.feed_horizon */
} HorizonDb;

typedef struct HorizonShared
{
	int			tranche_id;
	LWLock		lock;
	int			nholds;
	int			nprepared;
	HorizonDb	dbs[HORIZON_DBS];
	/* Hold holds[nholds]; PreparedHold prepared[nprepared]; follow */
} HorizonShared;

static HorizonShared *horizon = NULL;
static bool import_below_horizon = false;
static bool holding = false;	/* this transaction published a hold */
static bool exit_registered = false;
static TransactionId preparing_xid = InvalidTransactionId;
static int	reserved = -1;		/* the prepared slot reserved for this prepare */

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static int
nholds_needed(void)
{
	return MaxBackends + NUM_AUXILIARY_PROCS + max_prepared_xacts;
}

static Size
horizon_size(void)
{
	return MAXALIGN(sizeof(HorizonShared)) + nholds_needed() * sizeof(Hold) +
		Max(max_prepared_xacts, 1) * sizeof(PreparedHold);
}

static Hold *
holds(void)
{
	return (Hold *) ((char *) horizon + MAXALIGN(sizeof(HorizonShared)));
}

static PreparedHold *
prepared(void)
{
	return (PreparedHold *) (holds() + horizon->nholds);
}

/* Find or create the shared struct (from the spare shared memory unless preloaded). */
static void
horizon_attach(void)
{
	bool		found;

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	horizon = ShmemInitStruct("status_history horizon", horizon_size(), &found);
	if (!found)
	{
		memset(horizon, 0, horizon_size());
		horizon->tranche_id = LWLockNewTrancheId();
		LWLockInitialize(&horizon->lock, horizon->tranche_id);
		horizon->nholds = nholds_needed();
		horizon->nprepared = Max(max_prepared_xacts, 1);
	}
	LWLockRelease(AddinShmemInitLock);
	LWLockRegisterTranche(horizon->tranche_id, "status_history_horizon");
}

static void
horizon_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(horizon_size());
}

static void
horizon_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	horizon = NULL;
	horizon_attach();
}

/*
 * This database's entry (claimed on first use; NULL when every entry is
 * taken); call with the lock held exclusively.  ensure_db() made sure.
 */
static HorizonDb *
horizon_db(Oid history)
{
	HorizonDb  *free_db = NULL;

	for (int i = 0; i < HORIZON_DBS; i++)
	{
		HorizonDb  *db = &horizon->dbs[i];

		if (db->dbid == MyDatabaseId)
		{
			if (db->history != history)
			{
				memset(db, 0, sizeof(HorizonDb));
				db->dbid = MyDatabaseId;
				db->history = history;
				db->published = db->persisted = db->written = DT_NOBEGIN;
			}
			return db;
		}
		if (!OidIsValid(horizon->dbs[i].dbid) && free_db == NULL)
			free_db = &horizon->dbs[i];
	}
	if (free_db == NULL)
		return NULL;
	memset(free_db, 0, sizeof(HorizonDb));
	free_db->dbid = MyDatabaseId;
	free_db->history = history;
	free_db->published = free_db->persisted = free_db->written = DT_NOBEGIN;
	return free_db;
}

static void horizon_exit(int code, Datum arg);

/*
 * Make sure this database has an entry: claim one, freeing those of
 * databases dropped since (looked up outside the lock, as the clock does).
 */
static void
ensure_db(Oid history)
{
	Oid			dbids[HORIZON_DBS];
	bool		ok;

	if (horizon == NULL)
		horizon_attach();
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	ok = horizon_db(history) != NULL;
	for (int i = 0; i < HORIZON_DBS; i++)
		dbids[i] = horizon->dbs[i].dbid;
	LWLockRelease(&horizon->lock);
	if (ok)
		return;
	for (int i = 0; i < HORIZON_DBS; i++)
	{
		if (!OidIsValid(dbids[i]) || SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(dbids[i])))
			continue;
		LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
		if (horizon->dbs[i].dbid == dbids[i])
			horizon->dbs[i].dbid = InvalidOid;
		LWLockRelease(&horizon->lock);
	}
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	ok = horizon_db(history) != NULL;
	LWLockRelease(&horizon->lock);
	if (!ok)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("the status_history change feed has no free slot for this database"),
				 errdetail("It keeps state for at most %d databases at once.", HORIZON_DBS),
				 errhint("Drop databases that no longer use the extension, or restart the server.")));
}

/* This backend's hold (and, once, the exit callback that lets it go). */
static Hold *
my_hold(void)
{
	if (horizon == NULL)
		horizon_attach();
	if (!exit_registered)
	{
		before_shmem_exit(horizon_exit, (Datum) 0);
		exit_registered = true;
	}
	return &holds()[MyProc->pgprocno];
}

/* Does this transaction hold a stamp already? */
bool
sh_horizon_holding(void)
{
	return holding;
}

/*
 * Before the first stamp of a transaction (clock.c): hold the lowest stamp
 * it can get, the newest one handed out plus one.
 */
void
sh_horizon_before_stamp(TimestampTz newest)
{
	Hold	   *h;

	if (holding)
		return;
	h = my_hold();
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	h->dbid = MyDatabaseId;
	h->held = newest + 1;
	LWLockRelease(&horizon->lock);
	holding = true;
}

/*
 * An imported stamp: refused below the highest horizon returned (a consumer
 * may be past it) unless import_below_horizon or not refusable; held.
 */
void
sh_horizon_import(TimestampTz stamp, bool refusable)
{
	Hold	   *h = my_hold();
	Oid			history = sh_relation_oid("history");
	TimestampTz published;

	ensure_db(history);
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	published = horizon_db(history)->published;
	if (stamp < published && !import_below_horizon && refusable)
	{
		LWLockRelease(&horizon->lock);
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("occurred_at %s is below the change feed's stable horizon %s",
						pstrdup(timestamptz_to_str(stamp)), pstrdup(timestamptz_to_str(published))),
				 errdetail("A consumer of status_history.changes() may have read past it, and would never see this row."),
				 errhint("Import stamps above status_history.stable_horizon(), or SET status_history.import_below_horizon = on (superuser) and tell the consumers to read again from before it.")));
	}
	if (!holding || h->dbid != MyDatabaseId || stamp < h->held)
	{
		h->dbid = MyDatabaseId;
		h->held = holding ? Min(h->held, stamp) : stamp;
	}
	LWLockRelease(&horizon->lock);
	holding = true;
}

/* The transaction ended (visibly, if it committed): its hold goes. */
static void
release_hold(void)
{
	Hold	   *h;

	if (!holding)
		return;
	h = my_hold();
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	h->dbid = InvalidOid;
	LWLockRelease(&horizon->lock);
	holding = false;
}

/*
 * PREPARE TRANSACTION, before: the hold gets a prepared slot of its own now
 * (the prepare fails if none is free), so that it is never dropped after.
 * A slot whose transaction has ended is free (nobody tells us when a
 * prepared transaction is committed or rolled back: its xid says).
 */
static void
reserve_prepared(void)
{
	Hold	   *h;

	reserved = -1;
	if (!holding || !TransactionIdIsValid(preparing_xid))
		return;
	h = my_hold();
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	for (int pass = 0; pass < 2 && reserved < 0; pass++)
		for (int i = 0; i < horizon->nprepared && reserved < 0; i++)
		{
			PreparedHold *p = &prepared()[i];

			if (OidIsValid(p->dbid) && (pass == 0 || TransactionIdIsInProgress(p->xid)))
				continue;
			p->dbid = MyDatabaseId;
			p->xid = preparing_xid;
			p->held = h->held;
			reserved = i;
		}
	LWLockRelease(&horizon->lock);
	if (reserved < 0)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("the status_history change feed has no slot for this prepared transaction"),
				 errhint("Commit or roll back prepared transactions first.")));
}

/* PREPARE TRANSACTION, done: the reserved slot holds; the backend's hold goes. */
static void
move_hold_to_prepared(void)
{
	if (holding)
	{
		LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
		my_hold()->dbid = InvalidOid;
		LWLockRelease(&horizon->lock);
		holding = false;
	}
	reserved = -1;
}

/* The prepare failed after its slot was reserved: free it. */
static void
unreserve_prepared(void)
{
	if (reserved < 0)
		return;
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	prepared()[reserved].dbid = InvalidOid;
	LWLockRelease(&horizon->lock);
	reserved = -1;
}

static void
horizon_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			preparing_xid = GetTopTransactionIdIfAny();
			reserve_prepared();
			break;
		case XACT_EVENT_PREPARE:
			move_hold_to_prepared();
			preparing_xid = InvalidTransactionId;
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			unreserve_prepared();
			release_hold();
			preparing_xid = InvalidTransactionId;
			break;
		default:
			break;
	}
}

/* A backend that exits in a transaction (FATAL) lets its hold go too. */
static void
horizon_exit(int code, Datum arg)
{
	if (holding && horizon != NULL && MyProc != NULL)
	{
		LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
		holds()[MyProc->pgprocno].dbid = InvalidOid;
		LWLockRelease(&horizon->lock);
		holding = false;
	}
}

/*
 * After a restart, the holds of this database's prepared transactions: the
 * oldest stamp of the history rows each still-running inserter wrote
 * (their xmin survives; a prepared transaction's subtransactions resolve to
 * it).  One scan of the history, only when prepared transactions exist.
 */
static void
find_prepared_holds(void)
{
	int			ret;
	bool		any;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tuple;
	TransactionId *xids = NULL;
	TimestampTz *mins = NULL;
	int			n = 0;
	int			max = 0;
	TransactionId *preps;
	int			nprep;
	MemoryContext outer = CurrentMemoryContext;

	SPI_connect();
	ret = SPI_execute("SELECT p.transaction FROM pg_catalog.pg_prepared_xacts AS p"
					  " WHERE p.database OPERATOR(pg_catalog.=) pg_catalog.current_database()", true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading the prepared transactions failed");
	nprep = (int) SPI_processed;
	any = nprep > 0;
	preps = MemoryContextAlloc(outer, Max(nprep, 1) * sizeof(TransactionId));
	for (int i = 0; i < nprep; i++)
	{
		bool		isnull;

		preps[i] = DatumGetTransactionId(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull));
	}
	SPI_finish();
	if (!any)
		return;

	rel = table_open(sh_relation_oid("history"), AccessShareLock);
	scan = table_beginscan(rel, SnapshotAny, 0, NULL);
	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		TransactionId xmin = HeapTupleHeaderGetRawXmin(tuple->t_data);
		TransactionId top;
		bool		isnull;
		TimestampTz stamp;
		int			i;

		/* (Hint bits spare most rows the procarray lookup.) */
		if (HeapTupleHeaderXminCommitted(tuple->t_data) || HeapTupleHeaderXminInvalid(tuple->t_data) ||
			!TransactionIdIsNormal(xmin) || !TransactionIdIsInProgress(xmin))
			continue;
		top = SubTransGetTopmostTransaction(xmin);
		/* Only prepared transactions' (running ones publish their holds). */
		for (i = 0; i < nprep && !TransactionIdEquals(preps[i], top); i++)
			;
		if (i == nprep)
			continue;
		stamp = DatumGetTimestampTz(heap_getattr(tuple, sh_history_cols(RelationGetDescr(rel))->occurred_at,
												 RelationGetDescr(rel), &isnull));
		for (i = 0; i < n && !TransactionIdEquals(xids[i], top); i++)
			;
		if (i == n)
		{
			if (n == max)
			{
				max = Max(8, max * 2);
				xids = xids ? repalloc(xids, max * sizeof(TransactionId)) : palloc(max * sizeof(TransactionId));
				mins = mins ? repalloc(mins, max * sizeof(TimestampTz)) : palloc(max * sizeof(TimestampTz));
			}
			xids[n] = top;
			mins[n++] = stamp;
		}
		else
			mins[i] = Min(mins[i], stamp);
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);

	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	for (int i = 0; i < n; i++)
	{
		bool		known = false;

		for (int j = 0; j < horizon->nprepared && !known; j++)
			known = prepared()[j].dbid == MyDatabaseId && TransactionIdEquals(prepared()[j].xid, xids[i]);
		for (int j = 0; j < horizon->nprepared && !known; j++)
		{
			if (OidIsValid(prepared()[j].dbid))
				continue;
			prepared()[j].dbid = MyDatabaseId;
			prepared()[j].xid = xids[i];
			prepared()[j].held = mins[i];
			known = true;
		}
	}
	LWLockRelease(&horizon->lock);
}

/* Forget the prepared holds of transactions that have ended. */
static void
drop_ended_prepared(void)
{
	TransactionId ended[64];
	int			nended = 0;

	LWLockAcquire(&horizon->lock, LW_SHARED);
	for (int i = 0; i < horizon->nprepared && nended < 64; i++)
		if (prepared()[i].dbid == MyDatabaseId && !TransactionIdIsInProgress(prepared()[i].xid))
			ended[nended++] = prepared()[i].xid;
	LWLockRelease(&horizon->lock);
	if (nended == 0)
		return;
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	for (int i = 0; i < horizon->nprepared; i++)
		for (int j = 0; j < nended; j++)
			if (prepared()[i].dbid == MyDatabaseId && TransactionIdEquals(prepared()[i].xid, ended[j]))
				prepared()[i].dbid = InvalidOid;
	LWLockRelease(&horizon->lock);
}

/* The horizon the primary last persisted (a standby's horizon); DT_NOBEGIN: none. */
static TimestampTz
persisted_horizon(void)
{
	ShSavedUser saved;
	TimestampTz h = DT_NOBEGIN;
	bool		isnull;
	int			ret;

	SPI_connect();
	sh_become_owner(sh_relation_oid("feed_horizon"), &saved);
	ret = SPI_execute("SELECT CASE WHEN s.is_called THEN s.last_value END FROM status_history.feed_horizon AS s",
					  true, 1);
	if (ret == SPI_OK_SELECT && SPI_processed == 1)
	{
		Datum		d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);

		if (!isnull)
			h = DatumGetInt64(d);
	}
	sh_restore_user(&saved);
	SPI_finish();
	return h;
}

/*
 * Persist a horizon given out (WAL-logged, not transactional: a standby
 * reads it once the commits below it are replayed, as they come before it
 * in the WAL).  Not from a read-only transaction: a standby's horizon then
 * lags until the next one (the background worker gives one every
 * expire_interval).
 */
static void
persist_horizon(TimestampTz h, Oid history)
{
	Oid			seqid;
	ShSavedUser saved;
	LockRelId	lockid;

	if (XactReadOnly || RecoveryInProgress())
		return;
	seqid = sh_relation_oid("feed_horizon");
	/*
	 * One writer at a time, and never a lower one after a higher: two
	 * callers' horizons could otherwise be written in the other order.  (A
	 * session lock, released at once: not the caller's transaction's.)
	 */
	lockid.relId = seqid;
	lockid.dbId = MyDatabaseId;
	LockRelationIdForSession(&lockid, ShareUpdateExclusiveLock);
	PG_TRY();
	{
		bool		newer;

		LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
		newer = h > horizon_db(history)->written;
		LWLockRelease(&horizon->lock);
		if (newer)
		{
			sh_become_owner(seqid, &saved);
			DirectFunctionCall2(setval_oid, ObjectIdGetDatum(seqid), Int64GetDatum((int64) h));
			sh_restore_user(&saved);
			LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
			horizon_db(history)->written = Max(horizon_db(history)->written, h);
			LWLockRelease(&horizon->lock);
		}
	}
	PG_FINALLY();
	{
		UnlockRelationIdForSession(&lockid, ShareUpdateExclusiveLock);
	}
	PG_END_TRY();
}

/*
 * The stable horizon of this database, now: every row stamped below it is
 * committed (and visible to a snapshot taken after this) or will never
 * exist.  Recorded as published (and persisted).  On a standby: the one
 * the primary persisted last.
 */
TimestampTz
sh_horizon_now(void)
{
	TimestampTz h;
	bool		found;
	Oid			history = sh_relation_oid("history");

	bool		persisted_read;
	bool		persist;

	/* (A standby: the primary's, as replayed; never back within a session.) */
	if (RecoveryInProgress())
	{
		static TimestampTz seen = DT_NOBEGIN;

		seen = Max(seen, persisted_horizon());
		return seen;
	}
	ensure_db(history);
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	found = horizon_db(history)->prepared_found;
	persisted_read = horizon_db(history)->persisted_read;
	LWLockRelease(&horizon->lock);
	/* After a restart (or a promotion): never below what was given out before. */
	if (!persisted_read)
	{
		TimestampTz before = persisted_horizon();

		LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
		horizon_db(history)->published = Max(horizon_db(history)->published, before);
		horizon_db(history)->persisted = Max(horizon_db(history)->persisted, before);
		horizon_db(history)->written = Max(horizon_db(history)->written, before);
		horizon_db(history)->persisted_read = true;
		LWLockRelease(&horizon->lock);
	}
	if (!found)
	{
		find_prepared_holds();
		LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
		horizon_db(history)->prepared_found = true;
		LWLockRelease(&horizon->lock);
	}
	drop_ended_prepared();

	/* The clock first, the holds second (see the header). */
	h = sh_clock_last() + 1;
	LWLockAcquire(&horizon->lock, LW_EXCLUSIVE);
	for (int i = 0; i < horizon->nholds; i++)
		if (holds()[i].dbid == MyDatabaseId)	/* (ours too: our rows may roll back) */
			h = Min(h, holds()[i].held);
	for (int i = 0; i < horizon->nprepared; i++)
		if (prepared()[i].dbid == MyDatabaseId)
			h = Min(h, prepared()[i].held);
	{
		HorizonDb  *db = horizon_db(history);

		/* Never back: a hold is never below a horizon returned before it was taken. */
		h = Max(h, db->published);
		db->published = h;
		persist = h > db->persisted && !XactReadOnly;
		if (persist)
			db->persisted = h;
	}
	LWLockRelease(&horizon->lock);
	if (persist)
		persist_horizon(h, history);
	return h;
}


void
sh_horizon_init(void)
{
	DefineCustomBoolVariable("status_history.import_below_horizon",
							 "Lets imports stamp rows below the change feed's stable horizon.",
							 "Consumers of changes() that read past such a row never see it: tell them to read again.",
							 &import_below_horizon, false, PGC_SUSET, 0, NULL, NULL, NULL);
	RegisterXactCallback(horizon_xact_callback, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = horizon_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = horizon_shmem_startup;
}
