/*
 * keys.c — per-key state in status_history.replica_state.  A key is an
 * (object_id, replica_id) pair, a NULL replica_id being a key of its own.
 * Each key's row holds the stamp of its newest row (stale or not), when it
 * last reported anything (repeats included: a repeat appends no row), and
 * the stamp and status_since of its newest non-stale report.
 *
 * The state lives in the object's cache entry (objects.c): the object's row
 * lock covers its keys, and the undo log restores them with the object.
 * This file reads a key's row, writes keys back, and recomputes an object's
 * keys from the history when one of its rows may have been skipped.  The
 * rule that turns a repeat into a heartbeat is in history.c.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

/* The replica_state table looked up last, and whether that is still good. */
static Oid	keys_relid = InvalidOid;
static bool keys_known = false;

static void
keys_relcache_callback(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == keys_relid || !OidIsValid(keys_relid))
		keys_known = false;
}

/*
 * Is there a replica_state table (a database not yet updated from 0.2.0 has
 * none)?  Asked for every row: the answer is kept until a relcache
 * invalidation may have changed it.
 */
bool
sh_keys_enabled(void)
{
	static bool registered = false;

	if (!registered)
	{
		CacheRegisterRelcacheCallback(keys_relcache_callback, (Datum) 0);
		registered = true;
	}
	if (!keys_known)
	{
		keys_relid = sh_relation_oid_if_exists("replica_state");
		keys_known = true;
	}
	return OidIsValid(keys_relid);
}

static TimestampTz
stamp_or_zero(TupleTableSlot *slot, AttrNumber att, bool *isnull)
{
	Datum		d = slot_getattr(slot, att, isnull);

	return *isnull ? 0 : DatumGetTimestampTz(d);
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
}

/* A key's row as state; its replica_id points into the slot. */
static void
key_from_slot(TupleTableSlot *slot, const KeyColumns *cols, ShKeyState *key)
{
	bool		isnull;
	Datum		replica = slot_getattr(slot, cols->replica_id, &isnull);

	memset(key, 0, sizeof(ShKeyState));
	key->replica_id = isnull ? NULL : DatumGetTextPP(replica);
	key->stored = true;
	key->tid = slot->tts_tid;
	key->last_at = stamp_or_zero(slot, cols->last_at, &isnull);
	key->last_seen_at = stamp_or_zero(slot, cols->last_seen_at, &isnull);
	key->current_at = stamp_or_zero(slot, cols->occurred_at, &isnull);
	key->has_current = !isnull;
	key->status_since = stamp_or_zero(slot, cols->status_since, &isnull);
	if (key->has_current)
	{
		Datum		d = slot_getattr(slot, cols->status, &isnull);

		if (!isnull)
			text_to_cstring_buffer(DatumGetTextPP(d), key->status, sizeof(key->status));
	}
}

/*
 * Read the rows of many keys as of now (our own writes and everything
 * committed), opening replica_state and its key index once: for each object
 * in object_ids, the key (object, replica_id) -- or, with every_replica, all
 * of the object's keys -- is handed to found().  The caller holds the
 * objects' row locks, so nobody else changes these rows meanwhile.
 */
void
sh_keys_read_many(Datum *object_ids, int n, text *replica_id, bool every_replica,
				  ShKeyFound found, void *arg)
{
	/*
	 * ROW EXCLUSIVE, kept to the end: a restore merging rows into
	 * replica_state (SHARE ROW EXCLUSIVE) then waits for this transaction, or
	 * this read waits for it -- never a key written here on a read made
	 * before the restore's rows existed.
	 */
	Relation	rel = table_open(sh_relation_oid("replica_state"), RowExclusiveLock);
	Relation	index = index_open(sh_relation_oid("replica_state_key"), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	/* Many rows: what each one detoasts goes with it (one row, on the hot path: no context). */
	MemoryContext row_context = n == 1 ? NULL :
		AllocSetContextCreate(CurrentMemoryContext, "status_history key read", ALLOCSET_SMALL_SIZES);
	KeyColumns	cols;
	Snapshot	snapshot;
	IndexScanDesc scan;
	ScanKeyData skeys[2];
	int			nkeys = every_replica ? 1 : 2;

	key_columns(RelationGetDescr(rel), &cols);
	CommandCounterIncrement();	/* see our own latest write */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	scan = index_beginscan(rel, index, snapshot, nkeys, 0);
	for (int i = 0; i < n; i++)
	{
		ScanKeyInit(&skeys[0], 1, BTEqualStrategyNumber, F_TEXTEQ, object_ids[i]);
		skeys[0].sk_collation = index->rd_indcollation[0];
		if (every_replica)
			;
		else if (replica_id == NULL)
			ScanKeyEntryInitialize(&skeys[1], SK_ISNULL | SK_SEARCHNULL, 2,
								   InvalidStrategy, InvalidOid, InvalidOid, InvalidOid, (Datum) 0);
		else
		{
			ScanKeyInit(&skeys[1], 2, BTEqualStrategyNumber, F_TEXTEQ,
						PointerGetDatum(replica_id));
			skeys[1].sk_collation = index->rd_indcollation[1];
		}
		index_rescan(scan, skeys, nkeys, NULL, 0);
		while (index_getnext_slot(scan, ForwardScanDirection, slot))
		{
			MemoryContext old = row_context ? MemoryContextSwitchTo(row_context) : NULL;
			ShKeyState	key;

			key_from_slot(slot, &cols, &key);
			found(i, &key, arg);
			if (row_context)
			{
				MemoryContextSwitchTo(old);
				MemoryContextReset(row_context);
			}
			if (!every_replica)
				break;			/* the key is unique */
		}
	}
	index_endscan(scan);
	UnregisterSnapshot(snapshot);
	ExecDropSingleTupleTableSlot(slot);
	if (row_context)
		MemoryContextDelete(row_context);
	index_close(index, AccessShareLock);
	table_close(rel, NoLock);
}

/* sh_keys_read's found(): copy the row's state, keeping the caller's replica_id. */
static void
copy_key(int i, const ShKeyState *row, void *arg)
{
	ShKeyState *key = (ShKeyState *) arg;
	text	   *replica = key->replica_id;

	(void) i;
	*key = *row;
	key->replica_id = replica;
}

/*
 * Read one key's row (key->replica_id set by the caller) as of now; a key
 * without a row is left empty.
 */
void
sh_keys_read(Datum object_id, ShKeyState *key)
{
	key->stored = false;
	sh_keys_read_many(&object_id, 1, key->replica_id, false, copy_key, key);
}

/* The upsert both write-backs share: the cache's values win, last_seen_at only grows. */
#define KEYS_UPSERT \
	" ON CONFLICT (object_id, replica_id) DO UPDATE" \
	"   SET last_at = excluded.last_at," \
	"       last_seen_at = GREATEST(k.last_seen_at, excluded.last_seen_at)," \
	"       occurred_at = excluded.occurred_at, status = excluded.status," \
	"       status_since = excluded.status_since"

/* One column of a set-based write, as an array. */
static Datum
key_array(Datum *elems, bool *nulls, int n, Oid elemtype)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	int			dims[1] = {n};
	int			lbs[1] = {1};

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

/* The columns of a key write, as parameters: id, replica, last, seen, current, status, since. */
void
sh_keys_params(text *object_id, const ShKeyState *k, Datum *values, char *nulls)
{
	values[0] = PointerGetDatum(object_id);
	values[1] = PointerGetDatum(k->replica_id);
	values[2] = TimestampTzGetDatum(k->last_at);
	values[3] = TimestampTzGetDatum(k->last_seen_at);
	values[4] = TimestampTzGetDatum(k->current_at);
	values[5] = k->has_current ? CStringGetTextDatum(k->status) : (Datum) 0;
	values[6] = TimestampTzGetDatum(k->status_since);
	for (int i = 0; i < 7; i++)
		nulls[i] = ' ';
	if (k->replica_id == NULL)
		nulls[1] = 'n';
	if (!k->has_current)
		nulls[4] = nulls[5] = nulls[6] = 'n';
}

/*
 * The UPDATE of one stored key, its seven parameters (key_params' order)
 * numbered from $first: two texts, so that both use the unique index (IS NOT
 * DISTINCT FROM would not).
 */
char *
sh_keys_update_sql(int first, bool null_replica)
{
	return psprintf("UPDATE status_history.replica_state AS k"
					"   SET last_at = $%d,"
					"       last_seen_at = pg_catalog.timestamptz_larger(k.last_seen_at, $%d),"
					"       occurred_at = $%d, status = $%d, status_since = $%d"
					" WHERE k.object_id OPERATOR(pg_catalog.=) $%d AND %s",
					first + 2, first + 3, first + 4, first + 5, first + 6, first,
					null_replica ? psprintf("k.replica_id IS NULL AND $%d::pg_catalog.text IS NULL", first + 1) :
					psprintf("k.replica_id OPERATOR(pg_catalog.=) $%d", first + 1));
}

/*
 * Write one key whose row exists with a plain UPDATE (the common case: a
 * report on a key seen before); false when the row was not there.
 */
static bool
update_one(text *object_id, const ShKeyState *k)
{
	static SPIPlanPtr plans[2] = {NULL, NULL};
	Oid			types[7] = {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID,
		TIMESTAMPTZOID, TEXTOID, TIMESTAMPTZOID};
	Datum		values[7];
	char		nulls[7];
	int			which = k->replica_id == NULL ? 0 : 1;
	int			ret;

	if (plans[which] == NULL)
		plans[which] = sh_prepare_kept(sh_keys_update_sql(1, which == 0), 7, types);
	sh_keys_params(object_id, k, values, nulls);
	ret = sh_execute_own(plans[which], values, nulls);
	if (ret != SPI_OK_UPDATE)
		elog(ERROR, "status_history: writing back a key failed: %s", SPI_result_code_string(ret));
	return SPI_processed == 1;
}

/* A key write by TID: which key, and its state. */
typedef struct KeyRowWrite
{
	text	   *object_id;
	const ShKeyState *key;
} KeyRowWrite;

/* sh_rowwrite's modify(): the key's row from its cached state (as update_one). */
static bool
key_row(TupleDesc desc, Datum *values, bool *isnull, void *arg)
{
	KeyRowWrite *w = (KeyRowWrite *) arg;
	const ShKeyState *k = w->key;
	int			seen = SPI_fnumber(desc, "last_seen_at");

	if (seen <= 0 || isnull[seen - 1] ||
		!sh_row_text_is(desc, values, isnull, "object_id", w->object_id) ||
		!sh_row_text_is(desc, values, isnull, "replica_id", k->replica_id))
		return false;
	/* last_seen_at only grows (a dump's value may be later). */
	return sh_row_set(desc, values, isnull, "last_at", TimestampTzGetDatum(k->last_at), false) &&
		sh_row_set(desc, values, isnull, "last_seen_at",
				   TimestampTzGetDatum(Max(DatumGetTimestampTz(values[seen - 1]), k->last_seen_at)),
				   false) &&
		sh_row_set(desc, values, isnull, "occurred_at", TimestampTzGetDatum(k->current_at),
				   !k->has_current) &&
		sh_row_set(desc, values, isnull, "status",
				   k->has_current ? CStringGetTextDatum(k->status) : (Datum) 0, !k->has_current) &&
		sh_row_set(desc, values, isnull, "status_since", TimestampTzGetDatum(k->status_since),
				   !k->has_current);
}

/*
 * Write the stored keys whose row's TID is known by that TID (rowwrite.c),
 * without a statement; the others are moved to the front (by swapping).
 * Returns how many are left for the statements.
 */
static int
write_keys_direct(text **object_ids, ShKeyState **keys, int n)
{
	ShRowWriter *w = NULL;
	int			rest = 0;

	for (int i = 0; i < n; i++)
	{
		KeyRowWrite kw = {object_ids[i], keys[i]};

		if (keys[i]->stored && ItemPointerIsValid(&keys[i]->tid))
		{
			if (w == NULL)
				w = sh_rowwriter_begin(sh_relation_oid("replica_state"));
			if (sh_rowwriter_update(w, &keys[i]->tid, key_row, &kw))
				continue;
		}
		/* Swapped, not overwritten: the caller's arrays keep every key. */
		{
			text	   *id = object_ids[rest];
			ShKeyState *k = keys[rest];

			object_ids[rest] = object_ids[i];
			keys[rest++] = keys[i];
			object_ids[i] = id;
			keys[i] = k;
		}
	}
	if (w != NULL)
		sh_rowwriter_end(w);
	return rest;
}

/* The seven columns of n key writes, as arrays (args[0..6]). */
static void
key_arrays(text **object_ids, ShKeyState **keys, int n, Datum *args)
{
	Datum	   *values = palloc(Max(n, 1) * 7 * sizeof(Datum));
	char	   *flags = palloc(Max(n, 1) * 7);
	Datum	   *elems = palloc(Max(n, 1) * sizeof(Datum));
	bool	   *nulls = palloc(Max(n, 1) * sizeof(bool));

	/* Each key's seven parameters once, then one array per column. */
	for (int i = 0; i < n; i++)
		sh_keys_params(object_ids[i], keys[i], values + 7 * i, flags + 7 * i);
	for (int col = 0; col < 7; col++)
	{
		Oid			elemtype = (col == 0 || col == 1 || col == 5) ? TEXTOID : TIMESTAMPTZOID;

		for (int i = 0; i < n; i++)
		{
			elems[i] = values[7 * i + col];
			nulls[i] = flags[7 * i + col] == 'n';
		}
		args[col] = key_array(elems, nulls, n, elemtype);
	}
	pfree(values);
	pfree(flags);
	pfree(elems);
	pfree(nulls);
}

/* Run a set-based key write; returns the rows it wrote. */
static uint64
execute_keys(SPIPlanPtr plan, text **object_ids, ShKeyState **keys, int n, int expect)
{
	Datum		args[7];
	int			ret;

	key_arrays(object_ids, keys, n, args);
	ret = sh_execute_own(plan, args, NULL);
	if (ret != expect)
		elog(ERROR, "status_history: writing back %d keys failed: %s", n, SPI_result_code_string(ret));
	for (int i = 0; i < 7; i++)
		pfree(DatumGetPointer(args[i]));
	return SPI_processed;
}

#define KEY_ARRAYS \
	" ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)," \
	"   pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5)," \
	"   pg_catalog.unnest($6), pg_catalog.unnest($7))"

/*
 * Write n keys from their cached values (inside SPI as the owner).  Every
 * row they point at is stored: a key one of whose rows may have been
 * skipped is recomputed instead (sh_keys_recompute).  Keys whose row exists
 * get a plain UPDATE; new ones (or all, when a row was missing after all)
 * an upsert.
 */
void
sh_keys_write(text **object_ids, ShKeyState **keys, int n)
{
	static SPIPlanPtr upsert_plan = NULL;
	static SPIPlanPtr update_plan = NULL;
	Oid			types[7] = {TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID,
		TIMESTAMPTZARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID};
	text	  **ids;
	ShKeyState **ks;
	int			stored = 0;
	int			fresh;

	n = write_keys_direct(object_ids, keys, n);
	if (n == 0)
		return;
	/* The statements move the rows: their TIDs are no longer known. */
	for (int i = 0; i < n; i++)
		ItemPointerSetInvalid(&keys[i]->tid);
	if (n == 1 && keys[0]->stored && update_one(object_ids[0], keys[0]))
		return;
	ids = palloc(n * sizeof(text *));
	ks = palloc(n * sizeof(ShKeyState *));
	if (upsert_plan == NULL)
	{
		upsert_plan = sh_prepare_kept("INSERT INTO status_history.replica_state AS k"
									  " (object_id, replica_id, last_at, last_seen_at, occurred_at, status, status_since)"
									  " SELECT * FROM" KEY_ARRAYS KEYS_UPSERT,
									  7, types);
		update_plan = sh_prepare_kept("UPDATE status_history.replica_state AS k"
									  "   SET last_at = u.last_at, last_seen_at = GREATEST(k.last_seen_at, u.seen),"
									  "       occurred_at = u.cur, status = u.status, status_since = u.since"
									  "  FROM" KEY_ARRAYS " AS u(object_id, replica_id, last_at, seen, cur, status, since)"
									  " WHERE k.object_id OPERATOR(pg_catalog.=) u.object_id"
									  "   AND k.replica_id IS NOT DISTINCT FROM u.replica_id",
									  7, types);
	}
	/* Stored keys first, then the new ones. */
	for (int i = 0; i < n; i++)
		if (keys[i]->stored)
		{
			ids[stored] = object_ids[i];
			ks[stored++] = keys[i];
		}
	fresh = stored;
	for (int i = 0; i < n; i++)
		if (!keys[i]->stored)
		{
			ids[fresh] = object_ids[i];
			ks[fresh++] = keys[i];
		}
	if (stored > 0 &&
		execute_keys(update_plan, ids, ks, stored, SPI_OK_UPDATE) != (uint64) stored)
		stored = 0;				/* a row was missing: upsert them all */
	if (n > stored)
		(void) execute_keys(upsert_plan, ids + stored, ks + stored, n - stored, SPI_OK_INSERT);
	pfree(ids);
	pfree(ks);
}

/*
 * Recompute every key of one object from its history (brute force: the
 * definition of the state).  last_seen_at: the larger of the table's and the
 * cache's (seen: its keys and their last_seen_at); a key the cache does not
 * know gets its newest row's stamp when that is later (the history cannot
 * tell a controller's copy from a report: the one approximation, on this
 * rare path).
 */
void
sh_keys_recompute(text *object_id, ShKeyState *cached, int ncached)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID};
	Datum	   *elems = palloc(Max(ncached, 1) * sizeof(Datum));
	bool	   *nulls = palloc(Max(ncached, 1) * sizeof(bool));
	Datum		args[3];
	int			ret;

	if (plan == NULL)
		plan = sh_prepare_kept(
							   "WITH h AS (SELECT occurred_at, replica_id, status, stale"
							   "             FROM status_history.history WHERE object_id OPERATOR(pg_catalog.=) $1),"
							   " last AS (SELECT replica_id, pg_catalog.max(occurred_at) AS at FROM h GROUP BY replica_id),"
							   " cur AS (SELECT DISTINCT ON (replica_id) replica_id, occurred_at, status"
							   "           FROM h WHERE NOT stale ORDER BY replica_id, occurred_at DESC),"
							   " run AS (SELECT c.replica_id, c.occurred_at, c.status,"
							   "           (SELECT pg_catalog.min(s.occurred_at) FROM h AS s"
							   "             WHERE s.replica_id IS NOT DISTINCT FROM c.replica_id AND NOT s.stale"
							   "               AND s.occurred_at OPERATOR(pg_catalog.>) COALESCE("
							   "                   (SELECT pg_catalog.max(b.occurred_at) FROM h AS b"
							   "                     WHERE b.replica_id IS NOT DISTINCT FROM c.replica_id AND NOT b.stale"
							   "                       AND b.status OPERATOR(pg_catalog.<>) c.status),"
							   "                   '-infinity'::pg_catalog.timestamptz)) AS since"
							   "           FROM cur AS c)"
							   "INSERT INTO status_history.replica_state AS k"
							   " (object_id, replica_id, last_at, last_seen_at, occurred_at, status, status_since)"
							   " SELECT $1, l.replica_id, l.at,"
							   "        COALESCE(seen.at, l.at),"
							   "        r.occurred_at, r.status, r.since"
							   "   FROM last AS l"
							   "   LEFT JOIN run AS r ON r.replica_id IS NOT DISTINCT FROM l.replica_id"
							   "   LEFT JOIN ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS seen(replica_id, at)"
							   "     ON seen.replica_id IS NOT DISTINCT FROM l.replica_id"
							   KEYS_UPSERT,
							   3, types);
	args[0] = PointerGetDatum(object_id);
	for (int i = 0; i < ncached; i++)
	{
		nulls[i] = cached[i].replica_id == NULL;
		elems[i] = PointerGetDatum(cached[i].replica_id);
	}
	args[1] = key_array(elems, nulls, ncached, TEXTOID);
	for (int i = 0; i < ncached; i++)
	{
		nulls[i] = false;
		elems[i] = TimestampTzGetDatum(cached[i].last_seen_at);
	}
	args[2] = key_array(elems, nulls, ncached, TIMESTAMPTZOID);
	ret = sh_execute_own(plan, args, NULL);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: recomputing an object's keys failed: %s",
			 SPI_result_code_string(ret));
	pfree(elems);
	pfree(nulls);
}
