/*
 * imports.c — the objects this transaction imported into (an admin or a
 * restore supplying occurred_at): their rows keep the stale flags the
 * importer gives, and after an import into an object's past no repeat is
 * decided on it.  Kept apart from the state's entries (state.c), which may
 * be dropped and read again; a savepoint rolled back takes its imports'
 * exemptions with it.
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

/*
 * Objects this transaction imported into (supplied occurred_at): their rows'
 * stale flags are the importer's to give, and after an import into their
 * past (below the newest row) a repeat is no longer decided (the key's newest
 * row may be an import not folded yet).  Kept apart from the entries, which
 * may be dropped and read again.
 */
typedef struct Imported
{
	text	   *id;
	SubTransactionId since;		/* the subtransaction that first imported into it */
	bool		past;
	SubTransactionId past_since;	/* the one that first imported into its past */
} Imported;
static HTAB *imported = NULL;	/* in TopTransactionContext */

static Imported *
imported_entry(ShObject *obj)
{
	return imported == NULL ? NULL : hash_search(imported, &obj->id, HASH_FIND, NULL);
}

/* Has this transaction imported into obj? */
bool
sh_state_imported(ShObject *obj)
{
	return imported_entry(obj) != NULL;
}

/* The transaction ended: its imports with it (the table was in its memory). */
void
sh_imports_reset(void)
{
	imported = NULL;
}

/* The insert trigger lets an import into obj be stored (past: below its newest row). */
void
sh_state_note_import(ShObject *obj, bool past)
{
	Imported   *entry;
	bool		found;

	if (imported == NULL)
		imported = sh_text_hash_create("status_history imports", sizeof(Imported),
									   TopTransactionContext);
	entry = hash_search(imported, &obj->id, HASH_ENTER, &found);
	if (!found)
	{
		entry->id = (text *) MemoryContextAlloc(TopTransactionContext, VARSIZE_ANY(obj->id));
		memcpy(entry->id, obj->id, VARSIZE_ANY(obj->id));
		entry->since = GetCurrentSubTransactionId();
		entry->past = false;
	}
	if (past && !entry->past)
	{
		entry->past = true;
		entry->past_since = GetCurrentSubTransactionId();
	}
}

/* An aborted subtransaction's imports are gone: so are their exemptions. */
void
sh_imports_abort(SubTransactionId aborted)
{
	HASH_SEQ_STATUS seq;
	Imported   *entry;

	if (imported == NULL)
		return;
	hash_seq_init(&seq, imported);
	while ((entry = hash_seq_search(&seq)) != NULL)
	{
		if (entry->since >= aborted)
			hash_search(imported, &entry->id, HASH_REMOVE, NULL);
		else if (entry->past && entry->past_since >= aborted)
			entry->past = false;
	}
}

/* May a report on obj be found to repeat its key's newest row? */
bool
sh_state_repeats_allowed(ShObject *obj)
{
	Imported   *entry = imported_entry(obj);

	return entry == NULL || !entry->past;
}
