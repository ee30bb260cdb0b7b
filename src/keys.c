/*
 * keys.c — an object's keys (one per replica, the NULL replica included) in
 * its state entry: finding one, and adding an empty one the first time a
 * replica's row is folded (state.c folds; this only keeps the array).
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "status_history.h"

/* Is r the replica of key (NULL: no replica)? */
bool
sh_same_replica(text *r, text *replica)
{
	return r == NULL ? replica == NULL :
		(replica != NULL && sh_text_key_match(&r, &replica, 0) == 0);
}

/* The object's key for replica (NULL: the NULL key), or NULL when it has none. */
ShKey *
sh_state_key(ShObject *obj, text *replica)
{
	for (int i = 0; i < obj->nkeys; i++)
		if (sh_same_replica(obj->keys[i].replica_id, replica))
			return &obj->keys[i];
	return NULL;
}

/* Room for one more key at the end of obj's keys (in cxt, the entries' context), not filled in. */
ShKey *
sh_key_append(ShObject *obj, MemoryContext cxt)
{
	if (obj->nkeys == obj->maxkeys)
	{
		/* From one: most objects have one key, and a long COPY keeps many states. */
		obj->maxkeys = Max(1, obj->maxkeys * 2);
		obj->keys = obj->keys == NULL ?
			MemoryContextAlloc(cxt, obj->maxkeys * sizeof(ShKey)) :
			repalloc(obj->keys, obj->maxkeys * sizeof(ShKey));
	}
	return &obj->keys[obj->nkeys++];
}

/* The object's key for replica, added empty (in cxt, the entries' context) when it has none yet. */
ShKey *
sh_key_for(ShObject *obj, text *replica, MemoryContext cxt)
{
	ShKey	   *key = sh_state_key(obj, replica);

	if (key != NULL)
		return key;
	key = sh_key_append(obj, cxt);
	memset(key, 0, sizeof(ShKey));
	ItemPointerSetInvalid(&key->tid);
	ItemPointerSetInvalid(&key->last_tid);
	key->last_at = key->last_seen_at = key->current_at = key->status_since = SH_NO_STAMP;
	key->expires_at = SH_NO_STAMP;
	if (replica != NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(cxt);

		key->replica_id = DatumGetTextPCopy(PointerGetDatum(replica));
		MemoryContextSwitchTo(old);
	}
	return key;
}
