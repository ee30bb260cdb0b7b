/*
 * notify.c — NOTIFY status_history when an object's current status changes.
 *
 * The rule: when the per-object state is written back (after each statement,
 * objects.c), every object whose status differs from its status at the
 * previous write-back gets one notification.  A repeat, a stale report, or a
 * new error or details within the same status change nothing; a status that
 * changes and changes back within one statement is no change either.
 *
 * Notifications are kept here until commit and only then handed to NOTIFY
 * (Async_Notify), which delivers them when the commit is done: a
 * subtransaction rolled back drops the ones it queued, and a transaction
 * that is prepared (two-phase commit, where NOTIFY is not allowed) sends none.
 *
 * Coalescing: past status_history.notify_limit notifications in one
 * transaction, changes are only counted, and one summary notification
 * {"overflow": n} is queued before commit: listeners re-read statuses.  A
 * bulk insert changing a million statuses therefore queues at most
 * notify_limit + 1 notifications and never fills the queue.
 */
#include "postgres.h"

#include "access/table.h"
#include "access/xact.h"
#include "access/tableam.h"
#include "commands/async.h"
#include "executor/tuptable.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "nodes/pg_list.h"
#include "parser/parse_relation.h"
#include "utils/memutils.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/rel.h"
#include "utils/timestamp.h"

#include "status_history.h"

#define CHANNEL "status_history"

/* status_history.notify: send notifications at all. */
static bool notify_enabled = true;

/* status_history.notify_limit: notifications per transaction before coalescing. */
static int	notify_limit = 1000;

/* A notification waiting for commit, and the nest level that queued it. */
typedef struct Pending
{
	int			level;
	char		payload[FLEXIBLE_ARRAY_MEMBER];
} Pending;

/* This transaction's notifications (in TopTransactionContext), and changes past the limit. */
static List *pending = NIL;
static int64 overflow = 0;

static void
append_json_text(StringInfo buf, const char *key, const char *value)
{
	appendStringInfo(buf, "\"%s\": ", key);
	if (value == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, value);
}

/* The replica of the history row at stamp (NULL when it has none or is gone). */
static char *
replica_at(TimestampTz stamp)
{
	Relation	rel = table_open(sh_relation_oid("history"), AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	char	   *replica = NULL;

	if (sh_history_find_stamp(rel, stamp, slot))
	{
		bool		isnull;
		AttrNumber	att = attnameAttNum(rel, "replica_id", false);
		Datum		d = slot_getattr(slot, att, &isnull);

		if (!isnull)
			replica = TextDatumGetCString(d);
	}
	ExecDropSingleTupleTableSlot(slot);
	table_close(rel, AccessShareLock);
	return replica;
}

/* Should a write-back tell listeners about changes at all? */
bool
sh_notify_wanted(void)
{
	return notify_enabled;
}

/*
 * The object's status changed from previous (NULL: it had none) to status,
 * by its report stamped at.  replica: that report's replica when the caller
 * knows it (known), else it is read from the history.
 */
void
sh_notify_change(text *object_id, const char *status, const char *previous,
				 TimestampTz at, const char *replica, bool known)
{
	StringInfoData buf;
	char	   *id;
	char	   *rep;
	bool		cut = false;
	Pending    *p;

	if (!notify_enabled)
		return;
	if (list_length(pending) >= notify_limit)
	{
		overflow++;
		return;
	}
	id = text_to_cstring(object_id);
	rep = known ? (replica == NULL ? NULL : pstrdup(replica)) : replica_at(at);
	/*
	 * A payload must stay under 8000 bytes (NOTIFY refuses longer ones, and
	 * the report with it).  Escaping may make a character six bytes long, so
	 * ids long enough to matter are cut to 600 bytes each, and it says so.
	 */
	if (strlen(id) + (rep ? strlen(rep) : 0) > 1200)
	{
		if (strlen(id) > 600)
			id[pg_mbcliplen(id, strlen(id), 600)] = '\0';
		if (rep != NULL && strlen(rep) > 600)
			rep[pg_mbcliplen(rep, strlen(rep), 600)] = '\0';
		cut = true;
	}
	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	if (cut)
		appendStringInfoString(&buf, "\"truncated\": true, ");
	append_json_text(&buf, "object_id", id);
	appendStringInfoString(&buf, ", ");
	append_json_text(&buf, "status", status);
	appendStringInfoString(&buf, ", ");
	append_json_text(&buf, "previous_status", previous);
	appendStringInfoString(&buf, ", ");
	append_json_text(&buf, "occurred_at", timestamptz_to_str(at));
	appendStringInfoString(&buf, ", ");
	append_json_text(&buf, "replica_id", rep);
	appendStringInfoChar(&buf, '}');
	p = MemoryContextAlloc(TopTransactionContext, offsetof(Pending, payload) + buf.len + 1);
	p->level = GetCurrentTransactionNestLevel();
	memcpy(p->payload, buf.data, buf.len + 1);
	{
		MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);

		pending = lappend(pending, p);
		MemoryContextSwitchTo(old);
	}
	pfree(buf.data);
	pfree(id);
}

/*
 * Before commit, after the last write-back: hand everything to NOTIFY, and
 * the summary of what was coalesced (the count may include changes a
 * rolled-back savepoint made).
 */
void
sh_notify_pre_commit(void)
{
	ListCell   *lc;

	foreach(lc, pending)
		Async_Notify(CHANNEL, ((Pending *) lfirst(lc))->payload);
	if (overflow > 0)
	{
		char		payload[64];

		snprintf(payload, sizeof(payload), "{\"overflow\": " INT64_FORMAT "}", overflow);
		Async_Notify(CHANNEL, payload);
	}
	sh_notify_reset();
}

/* The transaction ended (or is being prepared): nothing carries over. */
void
sh_notify_reset(void)
{
	pending = NIL;				/* freed with TopTransactionContext */
	overflow = 0;
}

/* A subtransaction ended: drop what an aborted one queued, or hand it up. */
void
sh_notify_subxact(bool commit)
{
	int			level = GetCurrentTransactionNestLevel();
	ListCell   *lc;

	foreach(lc, pending)
	{
		Pending    *p = lfirst(lc);

		if (p->level < level)
			continue;
		if (commit)
			p->level = level - 1;
		else
			pending = foreach_delete_current(pending, lc);
	}
}

void
sh_notify_init(void)
{
	DefineCustomBoolVariable("status_history.notify",
							 "Send NOTIFY status_history when an object's current status changes.",
							 "Off (the default) sends nothing: PostgreSQL commits the transactions that notify one at a time.",
							 &notify_enabled, false, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("status_history.notify_limit",
							"Notifications one transaction sends before it coalesces the rest.",
							"Past it, changes are counted and one {\"overflow\": n} notification is sent at commit.",
							&notify_limit, 1000, 0, 100000,
							PGC_USERSET, 0, NULL, NULL, NULL);
}
