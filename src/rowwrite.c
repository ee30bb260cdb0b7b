/*
 * rowwrite.c — writing one row of status_history.objects or replica_state
 * by its TID, or a new one, without a statement.
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
#include "access/xact.h"
#include "executor/executor.h"
#include "nodes/makefuncs.h"
#include "parser/parsetree.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/rel.h"
#include "utils/resowner.h"
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
	bool		kept;			/* one of kept[] */
	bool		busy;			/* between begin and end */
	SubTransactionId taken_in;	/* the subtransaction that began it */
	bool		stale;			/* the relation changed: open it again */
};

/*
 * Building the executor state costs more than writing a row or two, and a
 * statement writes back many objects: a writer per relation is kept for the
 * transaction (its relation opened for the transaction's resource owner, its
 * memory in the transaction's), given out when not in use, opened again
 * after the relation changed, closed at the transaction's end.
 */
#define SH_KEPT_WRITERS 2
static ShRowWriter *kept[SH_KEPT_WRITERS];

static ShRowWriter *
writer_open(Oid relid, bool keep)
{
	ResourceOwner owner = CurrentResourceOwner;
	MemoryContext old_cxt = CurrentMemoryContext;
	ShRowWriter *w;
	RangeTblEntry *rte;

	if (keep)
	{
		CurrentResourceOwner = TopTransactionResourceOwner;
		MemoryContextSwitchTo(TopTransactionContext);
	}
	w = palloc0(sizeof(ShRowWriter));
	w->kept = keep;
	w->rel = table_open(relid, RowExclusiveLock);
	w->estate = CreateExecutorState();
	MemoryContextSwitchTo(w->estate->es_query_cxt);
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = relid;
	rte->relkind = w->rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable(w->estate, list_make1(rte));
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	w->estate->es_opened_result_relations = lappend(w->estate->es_opened_result_relations, w->rri);
	w->estate->es_output_cid = GetCurrentCommandId(true);
	ExecOpenIndices(w->rri, true);	/* (unique indexes ready for sh_rowwriter_insert_new) */
	EvalPlanQualInit(&w->epq, w->estate, NULL, NIL, -1);
	w->old = table_slot_create(w->rel, NULL);
	w->slot = table_slot_create(w->rel, NULL);
	MemoryContextSwitchTo(old_cxt);
	CurrentResourceOwner = owner;
	return w;
}

static void
writer_close(ShRowWriter *w)
{
	ResourceOwner owner = CurrentResourceOwner;

	/* (A kept writer's relation and indexes are the transaction's resource owner's.) */
	if (w->kept)
		CurrentResourceOwner = TopTransactionResourceOwner;
	ExecDropSingleTupleTableSlot(w->old);
	ExecDropSingleTupleTableSlot(w->slot);
	EvalPlanQualEnd(&w->epq);
	ExecCloseIndices(w->rri);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);
	pfree(w);
	CurrentResourceOwner = owner;
}

/*
 * Would updating relid fire row triggers (a superuser's, or a foreign key's
 * that references it)?  Their slots and what they pin belong to the
 * statement that fires them, not to the transaction: such a relation gets
 * no kept writer.
 */
static bool
fires_row_triggers(Oid relid)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	TriggerDesc *t = rel->trigdesc;
	bool		fires = t != NULL &&
		(t->trig_update_before_row || t->trig_update_after_row || t->trig_update_instead_row ||
		 t->trig_update_old_table || t->trig_update_new_table ||
		 t->trig_insert_after_row || t->trig_insert_new_table);

	table_close(rel, NoLock);
	return fires;
}

/*
 * A writer for updates of relid by TID and inserts: the executor state an
 * UPDATE statement would build, for every row written until
 * sh_rowwriter_end().  The kept one when it is free (a write from a
 * trigger of a write gets one of its own).
 */
ShRowWriter *
sh_rowwriter_begin(Oid relid)
{
	int			free_slot = -1;

	for (int i = 0; i < SH_KEPT_WRITERS; i++)
	{
		ShRowWriter *w = kept[i];

		if (w == NULL)
		{
			if (free_slot < 0)
				free_slot = i;
			continue;
		}
		if (RelationGetRelid(w->rel) != relid)
			continue;
		if (w->busy)
			return writer_open(relid, false);
		if (w->stale)
		{
			kept[i] = NULL;
			writer_close(w);
			free_slot = i;
			break;
		}
		w->busy = true;
		w->taken_in = GetCurrentSubTransactionId();
		w->estate->es_output_cid = GetCurrentCommandId(true);
		return w;
	}
	if (free_slot < 0 || !IsTransactionState() || fires_row_triggers(relid))
		return writer_open(relid, false);
	kept[free_slot] = writer_open(relid, true);
	kept[free_slot]->busy = true;
	kept[free_slot]->taken_in = GetCurrentSubTransactionId();
	return kept[free_slot];
}

/*
 * The relation relid and its index indexid, opened for the transaction with
 * relid's kept writer (opened now if need be), for reading within one call
 * (lock.c: an object's row and its keys).  False when there is no kept
 * writer to lend them: the caller opens them itself.
 */
bool
sh_kept_relation(Oid relid, Oid indexid, Relation *rel, Relation *index)
{
	ShRowWriter *w = NULL;

	for (int i = 0; i < SH_KEPT_WRITERS && w == NULL; i++)
		if (kept[i] != NULL && RelationGetRelid(kept[i]->rel) == relid && !kept[i]->stale)
			w = kept[i];
	if (w == NULL)
	{
		/* (Opens a kept writer, or a writer of its own when it cannot.) */
		w = sh_rowwriter_begin(relid);
		sh_rowwriter_end(w);
		if (!w->kept)
			return false;
	}
	for (int i = 0; i < w->rri->ri_NumIndices; i++)
		if (RelationGetRelid(w->rri->ri_IndexRelationDescs[i]) == indexid)
		{
			*rel = w->rel;
			*index = w->rri->ri_IndexRelationDescs[i];
			return true;
		}
	return false;
}

/* A subtransaction aborted: the writers it (or one inside it) had begun are free again. */
void
sh_rowwriter_subabort(SubTransactionId aborted)
{
	for (int i = 0; i < SH_KEPT_WRITERS; i++)
		if (kept[i] != NULL && kept[i]->busy && kept[i]->taken_in >= aborted)
			kept[i]->busy = false;
}

void
sh_rowwriter_end(ShRowWriter *w)
{
	if (w->kept)
		w->busy = false;
	else
		writer_close(w);
}

/*
 * The transaction ends: close the kept writers before its resource owner
 * lets go of them -- unless it aborts, when the resource owner releases
 * what they hold and their memory goes with the transaction's.
 */
void
sh_rowwriter_forget(bool close)
{
	for (int i = 0; i < SH_KEPT_WRITERS; i++)
	{
		ShRowWriter *w = kept[i];

		kept[i] = NULL;
		if (w != NULL && close)
			writer_close(w);
	}
}

/*
 * Before a utility command (DROP EXTENSION, ALTER TABLE, TRUNCATE, ... of
 * the state tables, utility.c): close the kept writers that are not in use,
 * so that no relation is found open by this session.
 */
void
sh_rowwriter_release(void)
{
	for (int i = 0; i < SH_KEPT_WRITERS; i++)
		if (kept[i] != NULL && !kept[i]->busy)
		{
			ShRowWriter *w = kept[i];

			kept[i] = NULL;
			writer_close(w);
		}
}

/* A relation changed (an index added, say): writers of it are opened again. */
void
sh_rowwriter_invalidate(Oid relid)
{
	for (int i = 0; i < SH_KEPT_WRITERS; i++)
		if (kept[i] != NULL && (relid == InvalidOid || RelationGetRelid(kept[i]->rel) == relid))
			kept[i]->stale = true;
}

/*
 * A write failed (a serialization failure, a constraint, a publication
 * without replica identity): let go of the rows in hand now, while the
 * resource owner that pinned them is current, and open the writer again
 * when next needed -- its transaction-long resource owner must not find a
 * pin of a statement's when it closes it.
 */
static void
writer_failed(ShRowWriter *w)
{
	ExecClearTuple(w->old);
	ExecClearTuple(w->slot);
	w->stale = true;
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
	volatile bool done = false;

	if (!sh_fetch_hint(w->rel, tid, w->old))
		return false;
	/* Under our own command id; and our write of it in this one must be behind us. */
	sh_command_of_our_own();
	if (sh_written_by_this_command(w->old))
		sh_advance_command();
	w->estate->es_output_cid = GetCurrentCommandId(true);
	/* What this row allocates goes with it. */
	ResetPerTupleExprContext(w->estate);
	old_cxt = MemoryContextSwitchTo(GetPerTupleMemoryContext(w->estate));
	PG_TRY();
	{
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
	}
	PG_CATCH();
	{
		writer_failed(w);
		PG_RE_THROW();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old_cxt);
	ExecClearTuple(w->old);
	ExecClearTuple(w->slot);
	return done;
}

/* The new row fill() makes (from all columns null), in w->slot. */
static void
new_row(ShRowWriter *w, ShRowModify fill, void *arg)
{
	TupleDesc	desc = RelationGetDescr(w->rel);

	ExecClearTuple(w->slot);
	memset(w->slot->tts_isnull, true, desc->natts * sizeof(bool));
	if (!fill(desc, w->slot->tts_values, w->slot->tts_isnull, arg))
		elog(ERROR, "status_history: a column of %s is missing", RelationGetRelationName(w->rel));
	ExecStoreVirtualTuple(w->slot);
}

/* The speculative insertion of w->slot (sh_rowwriter_insert_new); true when inserted. */
static bool
insert_speculative(ShRowWriter *w, List *arbiters, ItemPointer tid)
{
	for (;;)
	{
		ItemPointerData conflict;
		uint32		token;
		bool		clash = false;
		List	   *recheck;

		/* A row with the key (ours, committed, or in progress: waited for) is there. */
		if (!ExecCheckIndexConstraints(w->rri, w->slot, w->estate, &conflict, arbiters))
			return false;
		token = SpeculativeInsertionLockAcquire(GetCurrentTransactionId());
		table_tuple_insert_speculative(w->rel, w->slot, w->estate->es_output_cid, 0, NULL, token);
		recheck = ExecInsertIndexTuples(w->rri, w->slot, w->estate, false, true, &clash, arbiters);
		table_tuple_complete_speculative(w->rel, w->slot, token, !clash);
		SpeculativeInsertionLockRelease(GetCurrentTransactionId());
		list_free(recheck);
		if (!clash)
		{
			*tid = w->slot->tts_tid;
			return true;
		}
		/* Someone inserted the key meanwhile: look again (it is there now). */
	}
}

/*
 * Insert the row fill() makes unless a row with its key in the unique index
 * arbiter exists or is being inserted by someone else -- INSERT ... ON
 * CONFLICT DO NOTHING, done as PostgreSQL does it (a speculative insertion:
 * a concurrent inserter of the same key waits for us, or we for it).  True,
 * with *tid, when inserted.  The relation's own BEFORE ROW triggers do not
 * fire: this is the extension's write of its own new row (they would let it
 * through).
 */
bool
sh_rowwriter_insert_new(ShRowWriter *w, Oid arbiter, ShRowModify fill, void *arg, ItemPointer tid)
{
	List	   *arbiters = list_make1_oid(arbiter);
	MemoryContext old_cxt;
	volatile bool inserted = false;

	sh_command_of_our_own();
	w->estate->es_output_cid = GetCurrentCommandId(true);
	ResetPerTupleExprContext(w->estate);
	old_cxt = MemoryContextSwitchTo(GetPerTupleMemoryContext(w->estate));
	PG_TRY();
	{
		new_row(w, fill, arg);
		ExecConstraints(w->rri, w->slot, w->estate);
		inserted = insert_speculative(w, arbiters, tid);
	}
	PG_CATCH();
	{
		writer_failed(w);
		PG_RE_THROW();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(old_cxt);
	ExecClearTuple(w->slot);
	list_free(arbiters);
	return inserted;
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
	int			att = sh_fnumber(desc, name);
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
	int			att = sh_fnumber(desc, name);

	if (att <= 0)
		return false;
	values[att - 1] = value;
	isnull[att - 1] = null;
	return true;
}
