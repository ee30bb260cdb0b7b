/*
 * util.c — the helpers every file shares: finding the extension's relations
 * and their columns, running SPI as their owner, and checking that the
 * installed extension is this library's version.
 *
 * Also: preparing an SPI plan once per backend and keeping it, and running
 * one with the newest committed state rather than the caller's snapshot.
 *
 * Reporters need only INSERT on status_history.history; the per-object state
 * and the clock's persisted bound belong to the extension owner.  The C code
 * switches to that owner around its own fully-qualified SPI statements, the
 * way PostgreSQL's RI triggers do, instead of granting those tables to anyone.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/table.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/fmgroids.h"
#include "access/tableam.h"
#include "storage/bufmgr.h"
#include "access/relscan.h"
#include "access/genam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "catalog/indexing.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/tuplestore.h"

#include "status_history.h"

/*
 * Relation OIDs looked up by name, kept until an invalidation may have
 * changed one (a relation's, or a schema's, or a full reset): every report
 * asks for several, two catalog lookups each.
 */
#define SH_KNOWN_RELATIONS 16
typedef struct KnownRelation
{
	const char *relname;		/* a literal of the caller's */
	Oid			relid;			/* InvalidOid: none */
} KnownRelation;

static KnownRelation known[SH_KNOWN_RELATIONS];
static int	nknown = 0;

static void
forget_relation_oids(Datum arg, Oid relid)
{
	nknown = 0;
}

static void
forget_relation_oids_syscache(Datum arg, int cacheid, uint32 hashvalue)
{
	nknown = 0;
}

/* The OID of status_history.<relname>, or InvalidOid (an older version's schema). */
Oid
sh_relation_oid_if_exists(const char *relname)
{
	static bool registered = false;
	Oid			nsp;
	Oid			relid;

	if (!registered)
	{
		CacheRegisterRelcacheCallback(forget_relation_oids, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, forget_relation_oids_syscache, (Datum) 0);
		registered = true;
	}
	for (int i = 0; i < nknown; i++)
		if (strcmp(known[i].relname, relname) == 0)
			return known[i].relid;
	nsp = get_namespace_oid(SH_SCHEMA, true);
	relid = OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;
	/* Only a relation that exists: one created later must be found. */
	if (OidIsValid(relid) && nknown < SH_KNOWN_RELATIONS)
	{
		known[nknown].relname = relname;
		known[nknown++].relid = relid;
	}
	return relid;
}

/* The OID of status_history.<relname>; errors clearly when it is missing. */
Oid
sh_relation_oid(const char *relname)
{
	Oid			relid = sh_relation_oid_if_exists(relname);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s.%s\" does not exist", SH_SCHEMA, relname),
				 errhint("Run CREATE EXTENSION status_history in this database.")));
	return relid;
}

/* The owner of a relation, read from the syscache. */
static Oid
relation_owner(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

/*
 * Run as the owner of relid until sh_restore_user; errors restore it too.
 * This is also called where no function pinned search_path (write-back from
 * the executor and commit hooks, in the caller's session): pin it here, or
 * a caller's pg_temp.text could stand in for a type of our statements and
 * run its code as the owner.  The restricted-operation flag keeps anything
 * that does run as the owner from changing the session (as VACUUM does).
 */
void
sh_become_owner(Oid relid, ShSavedUser *saved)
{
	Oid			owner = relation_owner(relid);

	GetUserIdAndSecContext(&saved->userid, &saved->sec_context);
	saved->guc_nest = -1;
	if (namespace_search_path == NULL || strcmp(namespace_search_path, SH_SEARCH_PATH) != 0)
	{
		saved->guc_nest = NewGUCNestLevel();
		(void) set_config_option("search_path", SH_SEARCH_PATH, PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}
	SetUserIdAndSecContext(owner,
						   saved->sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION | SECURITY_NOFORCE_RLS);
}

void
sh_restore_user(const ShSavedUser *saved)
{
	SetUserIdAndSecContext(saved->userid, saved->sec_context);
	if (saved->guc_nest >= 0)
		AtEOXact_GUC(true, saved->guc_nest);
}

/* Prepare a statement once for the life of the backend; inside SPI. */
SPIPlanPtr
sh_prepare_kept(const char *sql, int nargs, Oid *argtypes)
{
	/*
	 * Always the generic plan: these run once per report or statement, and
	 * a custom plan would be planned again at every execution.
	 */
	SPIPlanPtr	plan = SPI_prepare_cursor(sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);

	if (plan == NULL)
		elog(ERROR, "status_history: SPI_prepare failed: %s",
			 SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "status_history: SPI_keepplan failed");
	return plan;
}

/*
 * Run a kept plan against the newest committed state (plus our own changes),
 * as PostgreSQL's RI triggers do: per-object state is a serialization point,
 * not a snapshot-consistent read, so REPEATABLE READ callers must not see an
 * older version of a row they have locked (that would fail with 40001).
 */
int
sh_execute_latest(SPIPlanPtr plan, Datum *args, const char *nulls,
				  bool read_only, long count)
{
	if (read_only)
		CommandCounterIncrement();
	return SPI_execute_snapshot(plan, args, nulls, GetLatestSnapshot(),
								InvalidSnapshot, read_only, true, count);
}

/*
 * The object ids a query selects (its first column; its plan prepared once
 * into *plan and kept), read as the owner of the state tables against the
 * newest committed state, into the caller's memory.  Returns how many.
 */
int
sh_read_ids(SPIPlanPtr *plan, const char *sql, int nargs, Oid *types, Datum *args, Datum **ids)
{
	MemoryContext outer = CurrentMemoryContext;
	ShSavedUser saved;
	int			ret;
	int			n;

	SPI_connect();
	sh_become_owner(sh_relation_oid("objects"), &saved);
	if (*plan == NULL)
		*plan = sh_prepare_kept(sql, nargs, types);
	ret = sh_execute_latest(*plan, args, NULL, true, 0);
	if (ret != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading object ids failed: %s", SPI_result_code_string(ret));
	n = (int) SPI_processed;
	*ids = MemoryContextAlloc(outer, Max(n, 1) * sizeof(Datum));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		d = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1, &isnull);

		(*ids)[i] = SPI_datumTransfer(d, false, -1);
	}
	sh_restore_user(&saved);
	SPI_finish();
	return n;
}

/* Hash tables keyed by a text pointer (object and replica ids): hash ... */
uint32
sh_text_key_hash(const void *key, Size keysize)
{
	text	   *t = *(text *const *) key;

	return DatumGetUInt32(hash_any((const unsigned char *) VARDATA_ANY(t),
								   VARSIZE_ANY_EXHDR(t)));
}

/* ... and compare bytewise (0: equal). */
int
sh_text_key_match(const void *key1, const void *key2, Size keysize)
{
	text	   *a = *(text *const *) key1;
	text	   *b = *(text *const *) key2;
	Size		len = VARSIZE_ANY_EXHDR(a);

	if (len != VARSIZE_ANY_EXHDR(b))
		return 1;
	return memcmp(VARDATA_ANY(a), VARDATA_ANY(b), len);
}

/*
 * Find the history row with this stamp, committed or not (a dirty snapshot:
 * ours and other transactions' in-progress rows count), into slot.
 */
bool
sh_history_find_stamp(Relation history, TimestampTz stamp, TupleTableSlot *slot)
{
	Relation	index = index_open(RelationGetPrimaryKeyIndex(history), AccessShareLock);
	SnapshotData dirty;
	IndexScanDesc scan;
	ScanKeyData key;
	bool		found;

	InitDirtySnapshot(dirty);
	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TIMESTAMP_EQ, TimestampTzGetDatum(stamp));
	scan = index_beginscan(history, index, &dirty, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	index_close(index, AccessShareLock);
	return found;
}

/*
 * The blocks a relation is known to have, for this transaction and file:
 * asking the file is a system call, and every write-back checks its TID.
 * While we hold a lock on a relation nobody else can shorten it (VACUUM's
 * truncation needs ACCESS EXCLUSIVE), and our own transaction shortens a
 * file in place only if it made that file (not kept then).  A block read
 * in this transaction (sh_note_block) or counted in the file exists --
 * until a subtransaction aborts, which may release the lock it relied on
 * (sh_forget_blocks()).
 */
static struct
{
	Oid			relid;
	RelFileNode node;
	LocalTransactionId lxid;
	BlockNumber nblocks;
}			known_blocks[8];

/*
 * The entry of rel in known_blocks (*holds: its count holds now), else the
 * one to replace: searched in full, since the tables one report touches
 * would share an entry chosen by their OIDs (objects and replica_state did,
 * whenever their OIDs agreed modulo the array's length).
 */
static int
known_blocks_slot(Relation rel, bool *holds)
{
	static int	next_victim = 0;
	int			victim = -1;

	for (int i = 0; i < lengthof(known_blocks); i++)
	{
		if (known_blocks[i].relid != RelationGetRelid(rel))
		{
			/* An entry of an earlier transaction is free. */
			if (victim < 0 && known_blocks[i].lxid != MyProc->lxid)
				victim = i;
			continue;
		}
		*holds = known_blocks[i].lxid == MyProc->lxid &&
			RelFileNodeEquals(known_blocks[i].node, rel->rd_node);
		return i;
	}
	*holds = false;
	if (victim < 0)
	{
		victim = next_victim;
		next_victim = (next_victim + 1) % lengthof(known_blocks);
	}
	return victim;
}

/* Remember that rel has at least nblocks blocks, if it may be kept. */
static void
remember_blocks(Relation rel, BlockNumber nblocks)
{
	bool		holds;
	int			i = known_blocks_slot(rel, &holds);

	if (rel->rd_createSubid != InvalidSubTransactionId ||
		rel->rd_newRelfilenodeSubid != InvalidSubTransactionId ||
		rel->rd_firstRelfilenodeSubid != InvalidSubTransactionId)
		return;
	if (holds && known_blocks[i].nblocks >= nblocks)
		return;
	known_blocks[i].relid = RelationGetRelid(rel);
	known_blocks[i].node = rel->rd_node;
	known_blocks[i].lxid = MyProc->lxid;
	known_blocks[i].nblocks = nblocks;
}

/*
 * A subtransaction aborted: the locks it took first are gone with it, and a
 * count that relied on one of them no longer holds (VACUUM may shorten the
 * file now).  Forget every count; the next check asks the file.
 */
void
sh_forget_blocks(void)
{
	memset(known_blocks, 0, sizeof(known_blocks));
}

/* Block blk of rel was read just now (under our lock). */
void
sh_note_block(Relation rel, BlockNumber blk)
{
	remember_blocks(rel, blk + 1);
}

/* Does rel have block blk? */
static bool
block_exists(Relation rel, BlockNumber blk)
{
	bool		holds;
	int			i = known_blocks_slot(rel, &holds);
	BlockNumber nblocks;

	if (holds && blk < known_blocks[i].nblocks)
		return true;
	nblocks = RelationGetNumberOfBlocks(rel);
	remember_blocks(rel, nblocks);
	return blk < nblocks;
}

/*
 * The newest version visible to us (SnapshotSelf) of the row at tid, a
 * hint: false when there is none -- also when the table was rewritten since
 * the hint was taken (a superuser's ALTER TABLE) and tid is past its end.
 * Callers check that the row is the one meant.
 */
bool
sh_fetch_hint(Relation rel, ItemPointer tid, TupleTableSlot *slot)
{
	return ItemPointerIsValid(tid) &&
		block_exists(rel, ItemPointerGetBlockNumber(tid)) &&
		table_tuple_fetch_row_version(rel, tid, SnapshotSelf, slot);
}

/*
 * The command id the write path last advanced to (in transaction own_lxid).
 * Rows are written under a command id of the extension's own, never under
 * the one a user's statement writes with: that statement's own UPDATE or
 * DELETE of a state row (an owner's, by hand, in a WITH) would otherwise take
 * our version for its own and skip the row silently, where PostgreSQL
 * refuses a row changed by something the statement triggered.
 */
static CommandId own_cid = InvalidCommandId;
static LocalTransactionId own_lxid = InvalidLocalTransactionId;

/*
 * Advance the command counter; the new command id is the write path's.  It
 * is marked used, so that the next statement starts under another one even
 * if nothing is written under it.
 */
void
sh_advance_command(void)
{
	CommandCounterIncrement();
	own_cid = GetCurrentCommandId(true);
	own_lxid = MyProc->lxid;
}

/*
 * Before writing a state row: advance unless the current command id is
 * already the write path's -- once per statement, not once per row.
 */
void
sh_command_of_our_own(void)
{
	if (own_lxid != MyProc->lxid || own_cid != GetCurrentCommandId(false))
		sh_advance_command();
}

/*
 * Is the row version in slot (fetched from a heap) one this command wrote?
 * Such a version cannot be locked or updated until the command counter
 * advances; any other can.  The write path advances it only then: every
 * advance gives the next rows written a command id of their own, and each
 * row a transaction inserts and then updates under another command id costs
 * a combo command id in memory until it ends (one per new object, per
 * repeat, in a COPY that advanced for each).
 */
bool
sh_written_by_this_command(TupleTableSlot *slot)
{
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	bool		mine = TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data)) &&
		HeapTupleHeaderGetCmin(tuple->t_data) >= GetCurrentCommandId(false);

	if (should_free)
		heap_freetuple(tuple);
	return mine;
}

/*
 * SPI_fnumber(), remembered: the write-back names a dozen columns per row,
 * and a name lookup compares with every column.  The names are string
 * constants, so their addresses -- with the descriptor's row type, since one
 * name ("status") is a column of several tables, at other positions -- key
 * a small cache (a few probes, so that two columns a row needs do not evict
 * each other); a hit is checked against the column's name (a changed table
 * finds it again).
 */
int
sh_fnumber(TupleDesc desc, const char *column)
{
#define FNUMBER_SLOTS 512
#define FNUMBER_PROBES 8
	static struct
	{
		const char *column;
		Oid			type;
		int			attnum;
	}			cache[FNUMBER_SLOTS];
	uint32		h = (uint32) ((uintptr_t) column >> 3) * 0x9E3779B1u ^ desc->tdtypeid * 0x85EBCA77u;
	int			first = (int) ((h ^ (h >> 16)) % FNUMBER_SLOTS);
	int			slot = first;
	int			attnum;

	for (int probe = 0; probe < FNUMBER_PROBES; probe++)
	{
		int			at = (first + probe) % FNUMBER_SLOTS;

		if (cache[at].column == NULL)
		{
			slot = at;			/* free: where a miss goes */
			break;
		}
		if (cache[at].column != column || cache[at].type != desc->tdtypeid)
			continue;
		attnum = cache[at].attnum;
		if (attnum > 0 && attnum <= desc->natts &&
			!TupleDescAttr(desc, attnum - 1)->attisdropped &&
			strcmp(NameStr(TupleDescAttr(desc, attnum - 1)->attname), column) == 0)
			return attnum;
		slot = at;				/* stale: found again below */
		break;
	}
	attnum = SPI_fnumber(desc, column);
	cache[slot].column = column;
	cache[slot].type = desc->tdtypeid;
	cache[slot].attnum = attnum;
	return attnum;
}

/*
 * The number of column of status_history.<table>, found by name (dropped
 * columns never match); an error when it is gone (a column dropped by hand,
 * or a library newer than the extension's tables).
 */
AttrNumber
sh_attnum(TupleDesc desc, const char *table, const char *column)
{
	int			attnum = sh_fnumber(desc, column);

	if (attnum <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" is missing from status_history.%s", column, table),
				 errhint("Update the extension to the version this library is (ALTER EXTENSION status_history UPDATE), or restore the column.")));
	return (AttrNumber) attnum;
}

/*
 * In the PG_CATCH of an internal subtransaction begun in memory context cxt
 * under resource owner owner: roll it back and hand over the error, flushed
 * (rethrow it or free it).
 */
ErrorData *
sh_subxact_abort(MemoryContext cxt, ResourceOwner owner)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return edata;
}

/* Refuse an object_ids list that is not one-dimensional (a list of ids). */
void
sh_check_id_list(Datum ids)
{
	if (ARR_NDIM(DatumGetArrayTypeP(ids)) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("object_ids must be a one-dimensional array"),
				 errhint("List object ids only, or pass NULL for every object.")));
}

/*
 * A text[] of the n ids, in the current memory context.  construct_array()
 * replaces short-header elements in the array it is given by converted
 * copies (in the current context): it gets a copy, so that the caller's ids
 * never point into a context that goes first (SPI's).
 */
ArrayType *
sh_text_array(const Datum *ids, int n)
{
	Datum	   *elems = palloc(Max(n, 1) * sizeof(Datum));
	ArrayType  *a;

	memcpy(elems, ids, n * sizeof(Datum));
	a = construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT);
	pfree(elems);
	return a;
}

/* A hash table in cxt whose entries start with a text pointer key (the above). */
HTAB *
sh_text_hash_create(const char *name, Size entrysize, MemoryContext cxt)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(text *);
	ctl.entrysize = entrysize;
	ctl.hash = sh_text_key_hash;
	ctl.match = sh_text_key_match;
	ctl.hcxt = cxt;
	return hash_create(name, 16, &ctl, HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

/* The history's columns by name: cached, as every row needs them. */
static ShHistoryCols history_cols;
static Oid	history_cols_type = InvalidOid;
static int	history_cols_natts = 0;

static void
forget_history_cols(Datum arg, Oid relid)
{
	history_cols_type = InvalidOid;
}

const ShHistoryCols *
sh_history_cols(TupleDesc desc)
{
	static bool registered = false;

	if (!registered)
	{
		CacheRegisterRelcacheCallback(forget_history_cols, (Datum) 0);
		registered = true;
	}
	/* A relation's row type and column count name its columns until an invalidation. */
	if (desc->tdtypeid != history_cols_type || desc->natts != history_cols_natts)
	{
		history_cols_type = InvalidOid;
		history_cols.occurred_at = sh_attnum(desc, "history", "occurred_at");
		history_cols.object_id = sh_attnum(desc, "history", "object_id");
		history_cols.status = sh_attnum(desc, "history", "status");
		history_cols.error = sh_attnum(desc, "history", "error");
		history_cols.details = sh_attnum(desc, "history", "details");
		history_cols.replica_id = sh_attnum(desc, "history", "replica_id");
		history_cols.generation = sh_attnum(desc, "history", "generation");
		history_cols.reported_at = sh_attnum(desc, "history", "reported_at");
		history_cols.stale = sh_attnum(desc, "history", "stale");
		history_cols.lease = sh_attnum(desc, "history", "lease");
		history_cols_type = desc->tdtypeid;
		history_cols_natts = desc->natts;
	}
	return &history_cols;
}

/*
 * The library serves the SQL objects of its own version only: a session that
 * loaded an older library keeps it after `make install`, and an upgrade's new
 * library meets the old version's SQL until ALTER EXTENSION UPDATE; either
 * way one would maintain state the other does not know (0.2.0's library
 * under 0.3.0's SQL left replica_state behind).  Every entry point checks the
 * installed version once; any change to pg_proc (every upgrade script
 * replaces status_history.versions()) makes it check again.
 */
static bool version_checked = false;

static void
forget_version(Datum arg, int cacheid, uint32 hashvalue)
{
	version_checked = false;
}

/* extversion of status_history in this database, or NULL. */
static char *
installed_version(void)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("status_history"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = text_to_cstring(DatumGetTextPP(d));
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

void
sh_check_version(void)
{
	static bool registered = false;
	char	   *version;

	/* CREATE and ALTER EXTENSION run the scripts of the version being installed. */
	if (likely(version_checked) || creating_extension)
		return;
	if (!registered)
	{
		CacheRegisterSyscacheCallback(PROCOID, forget_version, (Datum) 0);
		registered = true;
	}
	version = installed_version();
	if (version != NULL && strcmp(version, SH_VERSION) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the status_history library is version %s, but the extension in this database is version %s",
						SH_VERSION, version),
				 errdetail("A library serves the SQL objects of its own version only."),
				 errhint("Run ALTER EXTENSION status_history UPDATE in this database, then reconnect: a session keeps the library it loaded first (docs/OPERATIONS.md: Upgrading).")));
	version_checked = true;
}

/* SQL: status_history.versions(): the library's version and the installed extension's. */
PG_FUNCTION_INFO_V1(status_history_versions);
Datum
status_history_versions(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	char	   *version = installed_version();

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "status_history: versions() must return a row");
	values[0] = CStringGetTextDatum(SH_VERSION);
	nulls[1] = version == NULL;
	values[1] = version == NULL ? (Datum) 0 : CStringGetTextDatum(version);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}

/* This backend's own SQL on the state tables is running (their guards let it be). */
static bool writing = false;

/* Run one of our own statements on our tables, without tripping the guards. */
int
sh_execute_own(SPIPlanPtr plan, Datum *args, const char *nulls)
{
	int			ret;
	bool		was_writing = writing;

	writing = true;
	PG_TRY();
	{
		ret = sh_execute_latest(plan, args, nulls, false, 0);
	}
	PG_FINALLY();
	{
		writing = was_writing;
	}
	PG_END_TRY();
	return ret;
}

/* True while the extension's own SQL writes its tables. */
bool
sh_own_write(void)
{
	return writing;
}

