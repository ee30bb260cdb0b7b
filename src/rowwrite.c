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

/* An open relation and the executor state its updates share. */
struct ShRowWriter
{
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	EPQState	epq;
	TupleTableSlot *old;
	TupleTableSlot *slot;
};

/*
 * Open relid for updates by TID: the executor state an UPDATE statement
 * would build, once for every row written until sh_rowwriter_end().
 */
ShRowWriter *
sh_rowwriter_begin(Oid relid)
{
	ShRowWriter *w = palloc0(sizeof(ShRowWriter));
	RangeTblEntry *rte = makeNode(RangeTblEntry);

	w->rel = table_open(relid, RowExclusiveLock);
	w->estate = CreateExecutorState();
	rte->rtekind = RTE_RELATION;
	rte->relid = relid;
	rte->relkind = w->rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable(w->estate, list_make1(rte));
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	w->estate->es_opened_result_relations = lappend(w->estate->es_opened_result_relations, w->rri);
	w->estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(w->rri, false);
	EvalPlanQualInit(&w->epq, w->estate, NULL, NIL, -1);
	w->old = table_slot_create(w->rel, NULL);
	w->slot = table_slot_create(w->rel, NULL);
	return w;
}

void
sh_rowwriter_end(ShRowWriter *w)
{
	ExecDropSingleTupleTableSlot(w->old);
	ExecDropSingleTupleTableSlot(w->slot);
	EvalPlanQualEnd(&w->epq);
	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);
	pfree(w);
}

/*
 * Update the row at *tid: modify() checks that it is the row meant and
 * changes its columns (values and nulls of the whole row, as read).  On
 * success *tid is the new version's.  False, having written nothing, when
 * the row at *tid is not the newest version visible to us or modify() says
 * it is not the one.
 */
bool
sh_rowwriter_update(ShRowWriter *w, ItemPointer tid, ShRowModify modify, void *arg)
{
	TupleDesc	desc = RelationGetDescr(w->rel);
	MemoryContext old_cxt;
	bool		done = false;

	if (!ItemPointerIsValid(tid) ||
		!table_tuple_fetch_row_version(w->rel, tid, SnapshotSelf, w->old))
		return false;
	/* What this row allocates goes with it. */
	ResetPerTupleExprContext(w->estate);
	old_cxt = MemoryContextSwitchTo(GetPerTupleMemoryContext(w->estate));
	slot_getallattrs(w->old);
	ExecClearTuple(w->slot);
	memcpy(w->slot->tts_values, w->old->tts_values, desc->natts * sizeof(Datum));
	memcpy(w->slot->tts_isnull, w->old->tts_isnull, desc->natts * sizeof(bool));
	if (modify(desc, w->slot->tts_values, w->slot->tts_isnull, arg))
	{
		ExecStoreVirtualTuple(w->slot);
		ExecSimpleRelationUpdate(w->rri, w->estate, &w->epq, w->old, w->slot);
		*tid = w->slot->tts_tid;
		done = true;
	}
	MemoryContextSwitchTo(old_cxt);
	ExecClearTuple(w->old);
	ExecClearTuple(w->slot);
	return done;
}

/* One row: sh_rowwriter_update() between begin and end. */
bool
sh_rowwrite(Oid relid, ItemPointer tid, ShRowModify modify, void *arg)
{
	ShRowWriter *w;
	bool		done;

	if (!ItemPointerIsValid(tid))
		return false;
	w = sh_rowwriter_begin(relid);
	done = sh_rowwriter_update(w, tid, modify, arg);
	sh_rowwriter_end(w);
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
