/*
 * worker.c — the background worker that records lapsed leases: it calls
 * status_history.expire() every status_history.expire_interval in every
 * database that has the extension, so that a lapse is in the history
 * (history_of(), intervals(), notifications) although the reporter is gone.
 *
 * With the library in shared_preload_libraries, the postmaster starts one
 * launcher once recovery has finished -- on a primary, and on a standby when
 * it is promoted -- and again after a crash.  The launcher, connected to no
 * database, reads pg_database every launcher_naptime and starts a worker
 * for each database that has none; a worker that finds no extension in its
 * database (or finds it at another version than this library's) exits,
 * and is tried again at the next look, as one that failed is: a database
 * gets a new worker at most once per look.  A worker also
 * steps aside (exits) when someone waits to drop, rename or copy its
 * database: those wait only a few seconds for other sessions to leave.  A
 * worker runs as
 * the bootstrap superuser only to call expire(), a SECURITY DEFINER
 * function that runs as the extension's owner, and stable_horizon(), which
 * persists the change feed's horizon for standbys.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/syscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#include "status_history.h"

PGDLLEXPORT void sh_launcher_main(Datum arg);
PGDLLEXPORT void sh_worker_main(Datum arg);

/* status_history.expire_interval: how often a worker calls expire(); 0: never. */
static int	expire_interval = 1000;

/* How often the launcher looks for databases without a worker, in ms. */
#define LAUNCHER_NAPTIME 10000

/* A worker per database, as the launcher knows them. */
typedef struct DbWorker
{
	Oid			dboid;
	BackgroundWorkerHandle *handle;
	TimestampTz started;		/* when the launcher last started one */
} DbWorker;

/* Fill a worker's common fields. */
static void
worker_common(BackgroundWorker *w, const char *function)
{
	memset(w, 0, sizeof(BackgroundWorker));
	w->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	w->bgw_start_time = BgWorkerStart_RecoveryFinished;
	snprintf(w->bgw_library_name, BGW_MAXLEN, "status_history");
	snprintf(w->bgw_function_name, BGW_MAXLEN, "%s", function);
}

/* The databases that accept connections (the launcher sees only shared catalogs). */
static List *
database_list(void)
{
	List	   *dbs = NIL;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	MemoryContext outer = CurrentMemoryContext;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while (HeapTupleIsValid(tup = heap_getnext(scan, ForwardScanDirection)))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (db->datallowconn && !db->datistemplate)
		{
			MemoryContext old = MemoryContextSwitchTo(outer);

			dbs = lappend_oid(dbs, db->oid);
			MemoryContextSwitchTo(old);
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return dbs;
}

/* Is the worker for dboid (started earlier) still running? */
static bool
worker_running(DbWorker *w)
{
	pid_t		pid;

	return w->handle != NULL && GetBackgroundWorkerPid(w->handle, &pid) != BGWH_STOPPED;
}

/* Start a worker for every database that has none running. */
static void
start_workers(List **known)
{
	List	   *dbs = database_list();
	ListCell   *lc;

	foreach(lc, dbs)
	{
		Oid			dboid = lfirst_oid(lc);
		DbWorker   *w = NULL;
		ListCell   *kc;
		BackgroundWorker bgw;

		foreach(kc, *known)
			if (((DbWorker *) lfirst(kc))->dboid == dboid)
				w = (DbWorker *) lfirst(kc);
		if (w != NULL && worker_running(w))
			continue;
		/*
		 * At most one start per database per naptime: a worker that exits
		 * at once (no extension there, an error every round) must not be
		 * started again and again (its exit sets our latch).
		 */
		if (w != NULL && w->started != 0 &&
			!TimestampDifferenceExceeds(w->started, GetCurrentTimestamp(), LAUNCHER_NAPTIME))
			continue;
		if (w == NULL)
		{
			w = MemoryContextAllocZero(TopMemoryContext, sizeof(DbWorker));
			w->dboid = dboid;
			*known = lappend(*known, w);
		}
		worker_common(&bgw, "sh_worker_main");
		snprintf(bgw.bgw_name, BGW_MAXLEN, "status_history expire worker for database %u", dboid);
		snprintf(bgw.bgw_type, BGW_MAXLEN, "status_history expire worker");
		bgw.bgw_restart_time = BGW_NEVER_RESTART;	/* (the launcher starts it again) */
		bgw.bgw_main_arg = ObjectIdGetDatum(dboid);
		bgw.bgw_notify_pid = MyProcPid;
		w->started = GetCurrentTimestamp();
		if (!RegisterDynamicBackgroundWorker(&bgw, &w->handle))
		{
			w->handle = NULL;
			ereport(LOG,
					(errmsg("status_history: no background worker slot to record lapsed leases in database %u", dboid),
					 errhint("Raise max_worker_processes: status_history needs one worker per database that has the extension, plus its launcher.")));
		}
	}
	list_free(dbs);
}

/* A wake-up: end on SIGTERM, read the configuration again on SIGHUP. */
static void
handle_signals(void)
{
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/* The launcher: a worker per database, looked for every LAUNCHER_NAPTIME. */
void
sh_launcher_main(Datum arg)
{
	List	   *known = NIL;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("status_history launcher");

	for (;;)
	{
		handle_signals();
		start_workers(&known);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 LAUNCHER_NAPTIME, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * Does someone wait for the sessions of this database to leave (DROP
 * DATABASE, ALTER DATABASE RENAME, CREATE DATABASE from it as template)?
 * They hold the database's lock, which connecting takes for a moment.
 */
static bool
database_wanted(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
	if (LockAcquire(&tag, RowExclusiveLock, false, true) == LOCKACQUIRE_NOT_AVAIL)
		return true;
	LockRelease(&tag, RowExclusiveLock, false);
	return false;
}

/*
 * Is the extension here, at this library's version?  (Between installing a
 * new library and ALTER EXTENSION UPDATE, the database's SQL is older: its
 * functions are not this library's to call.)
 */
static bool
extension_is_ours(void)
{
	Oid			ext = get_extension_oid("status_history", true);
	HeapTuple	tup;
	bool		ours = false;

	if (!OidIsValid(ext))
		return false;
	tup = SearchSysCache1(EXTENSIONOID, ObjectIdGetDatum(ext));
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		v = SysCacheGetAttr(EXTENSIONOID, tup, Anum_pg_extension_extversion, &isnull);

		ours = !isnull && strcmp(TextDatumGetCString(v), SH_VERSION) == 0;
		ReleaseSysCache(tup);
	}
	return ours;
}

/* Lapses one transaction records at most. */
#define EXPIRE_BATCH 1000

/* Run a query returning one bigint, in a transaction of its own. */
static int64
run_sql(const char *sql)
{
	int64		result = 0;
	bool		isnull;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, sql);
	SPI_connect();
	if (SPI_execute(sql, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "status_history: \"%s\" failed", sql);
	result = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	return isnull ? 0 : result;
}

/*
 * Is this the one worker of its database?  A launcher started again (after
 * it failed) does not know the workers its predecessor started: a second
 * worker finds the first one's session lock and leaves.
 */
static bool
one_worker_here(void)
{
	static bool held = false;
	LOCKTAG		tag;

	if (held)
		return true;
	/* An advisory lock of the database, as pg_try_advisory_lock(key1, key2) takes it. */
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 0x5348, 0x4558, 2);
	held = LockAcquire(&tag, ExclusiveLock, true, true) != LOCKACQUIRE_NOT_AVAIL;
	return held;
}

/*
 * One round in a worker's database (expire() when run is set): false when
 * the worker should leave -- no extension here (at this library's version),
 * or the database is wanted.
 */
static bool
expire_once(bool run)
{
	bool		present;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (database_wanted())
	{
		CommitTransactionCommand();
		return false;
	}
	PushActiveSnapshot(GetTransactionSnapshot());
	present = extension_is_ours() && one_worker_here();
	PopActiveSnapshot();
	CommitTransactionCommand();
	/*
	 * A batch per transaction: a mass lapse (a whole replica gone) is
	 * recorded without holding every object's lock at once, or the memory
	 * of one huge statement.
	 */
	while (present && run && run_sql("SELECT status_history.expire(" CppAsString2(EXPIRE_BATCH) ")") == EXPIRE_BATCH)
		CHECK_FOR_INTERRUPTS();
	/* (and the change feed's horizon, so that standbys follow: horizon.c) */
	if (present && run)
		(void) run_sql("SELECT pg_catalog.count(status_history.stable_horizon())");
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return present;
}

/* How often a worker looks whether its database is wanted, in ms. */
#define WORKER_POLL 500

/*
 * A database's worker: expire() every expire_interval while the extension
 * is there.  An error ends the process; the launcher starts another.
 */
void
sh_worker_main(Datum arg)
{
	Oid			dboid = DatumGetObjectId(arg);
	TimestampTz next = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(dboid, InvalidOid, 0);
	pgstat_report_appname("status_history expire worker");

	for (;;)
	{
		handle_signals();
		{
			TimestampTz now = GetCurrentTimestamp();
			bool		due = expire_interval > 0 && now >= next;

			if (!expire_once(due))
				proc_exit(0);
			if (due)
				next = TimestampTzPlusMilliseconds(now, expire_interval);
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 expire_interval > 0 ? Min(expire_interval, WORKER_POLL) : WORKER_POLL,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/* The setting; the launcher when preloaded. */
void
sh_worker_init(void)
{
	BackgroundWorker bgw;

	DefineCustomIntVariable("status_history.expire_interval",
							"How often the background worker records lapsed leases (calls expire()) in each database.",
							"0: never (readers still show lapses; call status_history.expire() yourself, e.g. from pg_cron). Takes effect on reload.",
							&expire_interval, 1000, 0, INT_MAX,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	if (!process_shared_preload_libraries_in_progress)
		return;
	worker_common(&bgw, "sh_launcher_main");
	snprintf(bgw.bgw_name, BGW_MAXLEN, "status_history launcher");
	snprintf(bgw.bgw_type, BGW_MAXLEN, "status_history launcher");
	bgw.bgw_restart_time = 10;
	RegisterBackgroundWorker(&bgw);
}
