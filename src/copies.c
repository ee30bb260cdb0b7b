/*
 * copies.c — what reconnect() re-stamps without a replica: every live
 * object's current report, as the objects row shows it (lapsed: its lapse),
 * read here and handed to the copies' INSERT as arrays.
 *
 * A join of the ids with status_history.objects would find each object's row
 * again by its primary key: an index descent per object, for rows whose TIDs
 * the states hold.  The row is read at the state's TID instead, when that is
 * the object's newest version (SnapshotSelf) and holds the object (a TID is
 * only a hint), else by the primary key.  Nobody else can change these rows:
 * every one of them is locked, and the states were settled (written back)
 * just before, so each row read is the one the join would have read.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "status_history.h"

/* The copies' columns, in the order of the INSERT's arrays. */
enum
{
	C_ID, C_STATUS, C_ERROR, C_DETAILS, C_REPLICA, C_REPORTED_AT, C_LEASE, NCOPY_COLS
};
static const Oid copy_types[NCOPY_COLS] = {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID,
TIMESTAMPTZOID, INTERVALOID};

/* The columns of the objects rows being copied, by number. */
typedef struct ObjectCols
{
	AttrNumber	object_id;
	AttrNumber	occurred_at;
	AttrNumber	status;
	AttrNumber	error;
	AttrNumber	lapse_error;
	AttrNumber	details;
	AttrNumber	replica_id;
	AttrNumber	reported_at;
	AttrNumber	expires_at;
	AttrNumber	lease;
} ObjectCols;

static void
object_cols(TupleDesc desc, ObjectCols *c)
{
	c->object_id = sh_attnum(desc, "objects", "object_id");
	c->occurred_at = sh_attnum(desc, "objects", "occurred_at");
	c->status = sh_attnum(desc, "objects", "status");
	c->error = sh_attnum(desc, "objects", "error");
	c->lapse_error = sh_attnum(desc, "objects", "lapse_error");
	c->details = sh_attnum(desc, "objects", "details");
	c->replica_id = sh_attnum(desc, "objects", "replica_id");
	c->reported_at = sh_attnum(desc, "objects", "reported_at");
	c->expires_at = sh_attnum(desc, "objects", "expires_at");
	c->lease = sh_attnum(desc, "objects", "lease");
}

/* Is the row in slot the object's (the TID a state holds is only a hint)? */
static bool
holds_object(TupleTableSlot *slot, const ObjectCols *c, text *id)
{
	bool		isnull;
	Datum		d = slot_getattr(slot, c->object_id, &isnull);
	text	   *t;

	if (isnull)
		return false;
	t = DatumGetTextPP(d);
	return sh_text_key_match(&t, &id, 0) == 0;
}

/* The object's newest row by the primary key (SnapshotSelf: ours, or committed), into slot. */
static bool
row_by_key(Relation rel, Relation index, text *id, TupleTableSlot *slot)
{
	IndexScanDesc scan;
	ScanKeyData key;
	bool		found;

	ScanKeyInit(&key, 1, BTEqualStrategyNumber, F_TEXTEQ, PointerGetDatum(id));
	key.sk_collation = index->rd_indcollation[0];
	scan = index_beginscan(rel, index, SnapshotSelf, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

/* The object's row as it stands now: at the state's TID when that is it, else by key. */
static bool
object_row(Relation rel, Relation index, const ObjectCols *c, ShObject *obj, TupleTableSlot *slot)
{
	if (sh_fetch_hint(rel, &obj->tid, slot) && holds_object(slot, c, obj->id))
		return true;
	return row_by_key(rel, index, obj->id, slot);
}

/* The copies' columns' arrays: their values and nulls, and their element types' length and passing. */
typedef struct CopyArrays
{
	Datum	   *values[NCOPY_COLS];
	bool	   *nulls[NCOPY_COLS];
	int16		len[NCOPY_COLS];
	bool		byval[NCOPY_COLS];
	char		align[NCOPY_COLS];
} CopyArrays;

/* Column att of slot, copied (the slot's buffer is let go), into copy i's column col. */
static void
take(TupleTableSlot *slot, AttrNumber att, CopyArrays *a, int col, int i)
{
	a->values[col][i] = slot_getattr(slot, att, &a->nulls[col][i]);
	if (!a->nulls[col][i])
		a->values[col][i] = datumCopy(a->values[col][i], a->byval[col], a->len[col]);
}

/*
 * Copy i from an object's row, if it is live (has a report, not dropped):
 * its report, or -- once its lease ran out (expires_at <= now()) -- its
 * lapse (stalled, the lapse's error, at expires_at, no details nor lease).
 */
static bool
add_copy(TupleTableSlot *slot, const ObjectCols *c, CopyArrays *a, int i)
{
	bool		isnull;
	Datum		status;
	Datum		expires;
	bool		lapsed;

	(void) slot_getattr(slot, c->occurred_at, &isnull);
	if (isnull)
		return false;
	status = slot_getattr(slot, c->status, &isnull);
	if (isnull || strcmp(TextDatumGetCString(status), "dropped") == 0)
		return false;
	expires = slot_getattr(slot, c->expires_at, &isnull);
	lapsed = !isnull && timestamp_cmp_internal(DatumGetTimestampTz(expires),
											   GetCurrentTransactionStartTimestamp()) <= 0;
	take(slot, c->object_id, a, C_ID, i);
	take(slot, c->replica_id, a, C_REPLICA, i);
	if (!lapsed)
	{
		take(slot, c->status, a, C_STATUS, i);
		take(slot, c->error, a, C_ERROR, i);
		take(slot, c->details, a, C_DETAILS, i);
		take(slot, c->reported_at, a, C_REPORTED_AT, i);
		take(slot, c->lease, a, C_LEASE, i);
		return true;
	}
	a->values[C_STATUS][i] = CStringGetTextDatum("stalled");
	a->nulls[C_STATUS][i] = false;
	take(slot, c->lapse_error, a, C_ERROR, i);
	a->nulls[C_DETAILS][i] = a->nulls[C_LEASE][i] = true;
	take(slot, c->expires_at, a, C_REPORTED_AT, i);
	return true;
}

/* The copies' columns as arrays of n elements, into args (nulls: all ' '). */
static void
to_arrays(CopyArrays *a, int n, Datum *args, char *argnulls)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};

	for (int col = 0; col < NCOPY_COLS; col++)
	{
		args[col] = PointerGetDatum(construct_md_array(a->values[col], a->nulls[col], 1, dims, lbs,
													   copy_types[col], a->len[col], a->byval[col],
													   a->align[col]));
		argnulls[col] = ' ';
	}
}

/*
 * The copies of the live objects among ids (locked, their states settled),
 * in the order of ids, as NCOPY_COLS arrays into args and argnulls (id,
 * status, error, details, replica_id, reported_at, lease).  Returns how many.
 */
int
sh_copies_current(Datum *ids, int n, Datum *args, char *argnulls)
{
	Relation	rel = table_open(sh_relation_oid("objects"), AccessShareLock);
	Relation	index = index_open(sh_relation_oid("objects_pkey"), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	ObjectCols	c;
	CopyArrays	a;
	int			m = 0;

	object_cols(RelationGetDescr(rel), &c);
	for (int col = 0; col < NCOPY_COLS; col++)
	{
		a.values[col] = palloc(Max(n, 1) * sizeof(Datum));
		a.nulls[col] = palloc(Max(n, 1) * sizeof(bool));
		get_typlenbyvalalign(copy_types[col], &a.len[col], &a.byval[col], &a.align[col]);
	}
	CommandCounterIncrement();	/* our write-backs are visible */
	for (int i = 0; i < n; i++)
	{
		if (object_row(rel, index, &c, sh_state_lock(ids[i]), slot) && add_copy(slot, &c, &a, m))
			m++;
		ExecClearTuple(slot);
	}
	to_arrays(&a, m, args, argnulls);
	for (int col = 0; col < NCOPY_COLS; col++)
	{
		pfree(a.values[col]);
		pfree(a.nulls[col]);
	}
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, AccessShareLock);
	table_close(rel, AccessShareLock);
	return m;
}
