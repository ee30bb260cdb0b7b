/*
 * rowwrite.c — writing one row of status_history.objects or replica_state
 * by its TID, without a statement.
 *
 * A report() call ends with a write-back of one object's row and one key's
 * row.  Through SPI that is a planned UPDATE each: a cached plan, executor
 * start-up, an index descent by object id, executor shut-down -- more than
 * the row versions themselves cost.  The object's row lock hands us the
 * row's TID (and reading a key hands us its row's), so the write-back can
 * update that row directly, as logical replication's apply worker does
 * (ExecSimpleRelationUpdate: constraints, index entries for a non-HOT
 * version, WAL, statistics, all as an UPDATE would).
 *
 * A TID is only a hint.  The row at it must be visible to us as the newest
 * version (SnapshotSelf: a version our own transaction replaced is not) and
 * belong to the object; otherwise nothing is written and the caller takes
 * the statement path.  Nobody else can write these rows meanwhile: every
 * writer holds the object's row lock.
 */
#include "postgres.h"

#include "access/table.h"
#include "access/tableam.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "parser/parsetree.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

/* Write the new version in slot over the one in old, as an UPDATE would. */
static void
update_row(Relation rel, TupleTableSlot *old, TupleTableSlot *slot)
{
	EState	   *estate = CreateExecutorState();
	RangeTblEntry *rte = makeNode(RangeTblEntry);
	ResultRelInfo *rri = makeNode(ResultRelInfo);
	EPQState	epq;

	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(rel);
	rte->relkind = rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable(estate, list_make1(rte));
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	estate->es_opened_result_relations = lappend(estate->es_opened_result_relations, rri);
	estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(rri, false);
	EvalPlanQualInit(&epq, estate, NULL, NIL, -1);

	ExecSimpleRelationUpdate(rri, estate, &epq, old, slot);

	EvalPlanQualEnd(&epq);
	ExecCloseIndices(rri);
	ExecResetTupleTable(estate->es_tupleTable, false);
	FreeExecutorState(estate);
}

/*
 * Update the row of relid at *tid: modify() checks that it is the row meant
 * and changes its columns (values and nulls of the whole row, as read).  On
 * success *tid is the new version's.  False, having written nothing, when
 * the row at *tid is not the newest version visible to us or modify() says
 * it is not the one.
 */
bool
sh_rowwrite(Oid relid, ItemPointer tid, ShRowModify modify, void *arg)
{
	Relation	rel;
	TupleTableSlot *old;
	TupleTableSlot *slot;
	TupleDesc	desc;
	bool		done = false;

	if (!ItemPointerIsValid(tid))
		return false;
	rel = table_open(relid, RowExclusiveLock);
	desc = RelationGetDescr(rel);
	old = table_slot_create(rel, NULL);
	slot = table_slot_create(rel, NULL);
	if (table_tuple_fetch_row_version(rel, tid, SnapshotSelf, old))
	{
		slot_getallattrs(old);
		ExecClearTuple(slot);
		memcpy(slot->tts_values, old->tts_values, desc->natts * sizeof(Datum));
		memcpy(slot->tts_isnull, old->tts_isnull, desc->natts * sizeof(bool));
		if (modify(desc, slot->tts_values, slot->tts_isnull, arg))
		{
			ExecStoreVirtualTuple(slot);
			update_row(rel, old, slot);
			*tid = slot->tts_tid;
			done = true;
		}
	}
	ExecDropSingleTupleTableSlot(old);
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, NoLock);
	return done;
}

/* Does column name of a row hold the text t (NULL: is it null)? */
bool
sh_row_text_is(TupleDesc desc, Datum *values, bool *isnull, const char *name, text *t)
{
	int			att = SPI_fnumber(desc, name);
	text	   *v;

	if (att <= 0)
		return false;
	if (isnull[att - 1] || t == NULL)
		return isnull[att - 1] && t == NULL;
	v = DatumGetTextPP(values[att - 1]);
	return sh_text_key_match(&v, &t, 0) == 0;
}

/* Set column name of a row (false: there is no such column). */
bool
sh_row_set(TupleDesc desc, Datum *values, bool *isnull, const char *name, Datum value, bool null)
{
	int			att = SPI_fnumber(desc, name);

	if (att <= 0)
		return false;
	values[att - 1] = value;
	isnull[att - 1] = null;
	return true;
}
