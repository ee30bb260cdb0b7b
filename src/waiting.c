/*
 * waiting.c — an object's rows a catch-up folded before their own fold
 * (history_stored(), as each row is stored) came: state.c folds rows as a
 * catch-up finds them, and each row's own fold then crosses it off.  Kept
 * in stamp order with the (sub)transaction that stored each; rare, since a
 * row is normally folded as it is stored (a report nested in another's
 * trigger, a state read again).  The object is queued for its write-back
 * once none is due; a state read again keeps the list, less the rows an
 * aborted subtransaction took.
 * Allocated with the state's entries (the memory of the object's id).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/relscan.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"

#include "status_history.h"

/* Does a folded row of obj still wait for its AFTER event? */
bool
sh_waiting_any(const ShObject *obj)
{
	return obj->nopen > 0;
}

/*
 * Forget the rows an aborted subtransaction stored: they are gone, and their
 * events with them.  (Only an entry that subtransaction touched can have
 * any; it is invalid until read again.)
 */
void
sh_waiting_forget_aborted(ShObject *obj)
{
	int			kept = 0;

	obj->nopen = 0;
	for (int i = 0; i < obj->nwaiting; i++)
	{
		if (!TransactionIdIsCurrentTransactionId(obj->waiting[i].xmin))
			continue;
		obj->waiting[kept++] = obj->waiting[i];
		obj->nopen += obj->waiting[i].came ? 0 : 1;
	}
	obj->nwaiting = kept;
}

/* The entry of the row stamped stamp among those folded while events were due, or NULL. */
static ShWaiting *
find_waiting(ShObject *obj, TimestampTz stamp)
{
	int			lo = 0;
	int			hi = obj->nwaiting - 1;

	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;

		if (obj->waiting[mid].stamp == stamp)
			return &obj->waiting[mid];
		if (obj->waiting[mid].stamp < stamp)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/*
 * A row was folded: note whether its AFTER event is still due (!came).  A
 * row whose event came needs noting only while others are due (else the
 * state is written at once).  A row known already (a state read again folds
 * its rows again) keeps its entry.
 */
void
sh_waiting_note(ShObject *obj, TimestampTz stamp, TransactionId xmin, bool came)
{
	ShWaiting  *w = find_waiting(obj, stamp);
	int			at;

	if (w != NULL)
	{
		if (came && !w->came)
		{
			w->came = true;
			obj->nopen--;
		}
		return;
	}
	if (came && obj->nopen == 0)
		return;
	if (obj->nwaiting == obj->maxwaiting)
	{
		obj->maxwaiting = Max(8, obj->maxwaiting * 2);
		obj->waiting = obj->waiting == NULL ?
			MemoryContextAlloc(GetMemoryChunkContext(obj->id), obj->maxwaiting * sizeof(ShWaiting)) :
			repalloc(obj->waiting, obj->maxwaiting * sizeof(ShWaiting));
	}
	/* Rows are folded in stamp order, so usually it goes last. */
	at = obj->nwaiting;
	while (at > 0 && obj->waiting[at - 1].stamp > stamp)
		at--;
	memmove(&obj->waiting[at + 1], &obj->waiting[at], (obj->nwaiting - at) * sizeof(ShWaiting));
	obj->nwaiting++;
	obj->waiting[at].stamp = stamp;
	obj->waiting[at].xmin = xmin;
	obj->waiting[at].came = came;
	obj->nopen += came ? 0 : 1;
}

/* The AFTER event of the folded row stamped stamp has come: true if it was due. */
bool
sh_waiting_came(ShObject *obj, TimestampTz stamp)
{
	ShWaiting  *w = find_waiting(obj, stamp);

	if (w == NULL || w->came)
		return false;
	w->came = true;
	obj->nopen--;
	return true;
}

/* No row's event is due: the state is written now, and covers every row noted. */
void
sh_waiting_settled(ShObject *obj)
{
	if (obj->nopen == 0)
		obj->nwaiting = 0;
}
