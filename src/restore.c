/*
 * restore.c — what other SQL on the state tables means for the extension:
 * the guard that makes the transaction's states be read again after someone
 * else's statement on status_history.objects, floors or replica_state, and
 * the merge that turns rows a restore inserts there (or into roles) into
 * changes of what exists.
 *
 * A restore (pg_restore, psql < dump, or an owner's import) loads the
 * history as imports, which rebuild each object's state, and loads these
 * tables too: their fences and floors, and each key's last_seen_at and
 * lease expiry, are not derivable from the history (reconnect() raises
 * fences; a heartbeat leaves no row).  A restored row is merged into what the history's restore
 * built, before or after it: the higher fence or floor wins, a key keeps the
 * dumped last_seen_at.  So the order in which the tables are loaded, in one
 * job or several, does not matter.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "executor/spi.h"
#include "storage/lmgr.h"
#include "utils/rel.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_objects_guard);
PG_FUNCTION_INFO_V1(status_history_restore_merge);

/*
 * SQL: BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE FOR EACH STATEMENT on
 * status_history.objects, floors and replica_state.  Statements other than the
 * extension's own (the owner's, or a restore) see and change what the
 * transaction's states describe: write them back first, read rows again
 * afterwards.
 */
Datum
status_history_objects_guard(PG_FUNCTION_ARGS)
{
	sh_check_version();
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("objects_guard: not called by trigger manager")));
	if (!sh_own_write())
	{
		sh_state_invalidate();
		sh_fence_forget_floors();
	}
	return PointerGetDatum(NULL);
}

/*
 * SQL: BEFORE INSERT FOR EACH ROW on status_history.objects, floors and replica_state.  A
 * row the extension did not write is a restore (pg_restore, psql < dump) or
 * an owner's import: merge it into what exists instead of failing on the
 * key, keeping the higher fence or floor.  Restoring the history rebuilds
 * each object's current report, before or after this, as a series of imports.
 */
Datum
status_history_restore_merge(PG_FUNCTION_ARGS)
{
	/*
	 * Per table: keep the higher fence and the higher floor, and a retirement
	 * (the earlier, when both are retired: LEAST ignores a NULL); a key's
	 * last_seen_at is the dump's (the history's restore counts controller
	 * copies as sightings, the dump knows better), and so is when the lease
	 * of the current report runs out if it is the same report (a heartbeat
	 * renewed it, which the history does not show); the roles are the dump's.
	 */
	static const char *const merges[4] = {
		"INSERT INTO status_history.objects AS o SELECT ($1).*"
		"    ON CONFLICT (object_id) DO UPDATE"
		"   SET fence = pg_catalog.int8larger(o.fence, excluded.fence),"
		"       expires_at = CASE WHEN o.occurred_at IS NOT DISTINCT FROM excluded.occurred_at"
		"                         THEN excluded.expires_at ELSE o.expires_at END,"
		"       lapse_error = CASE WHEN o.occurred_at IS NOT DISTINCT FROM excluded.occurred_at"
		"                          THEN excluded.lapse_error ELSE o.lapse_error END",
		"INSERT INTO status_history.floors AS f SELECT ($1).*"
		"    ON CONFLICT (replica_id) DO UPDATE"
		"   SET generation = pg_catalog.int8larger(f.generation, excluded.generation),"
		"       retired_at = LEAST(f.retired_at, excluded.retired_at)",
		"INSERT INTO status_history.replica_state AS k SELECT ($1).*"
		"    ON CONFLICT (object_id, replica_id) DO UPDATE"
		"   SET last_seen_at = excluded.last_seen_at,"
		"       expires_at = CASE WHEN k.occurred_at IS NOT DISTINCT FROM excluded.occurred_at"
		"                         THEN excluded.expires_at ELSE k.expires_at END",
		"INSERT INTO status_history.roles AS r SELECT ($1).*"
		"    ON CONFLICT (singleton) DO UPDATE"
		"   SET reporter = excluded.reporter, controller = excluded.controller,"
		"       reader = excluded.reader, admin = excluded.admin,"
		"       public_reads = excluded.public_reads"
	};
	static SPIPlanPtr plans[4] = {NULL, NULL, NULL, NULL};
	static Oid	plan_types[4] = {InvalidOid, InvalidOid, InvalidOid, InvalidOid};
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	Relation	rel;
	int			which;
	Datum		args[1];
	Oid			types[1];
	ShSavedUser saved;
	SPIPlanPtr *plan;
	int			ret;

	sh_check_version();
	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("restore_merge: must be fired before insert for each row")));
	if (sh_own_write())
		return PointerGetDatum(trigdata->tg_trigtuple);

	rel = trigdata->tg_relation;
	which = RelationGetRelid(rel) == sh_relation_oid("objects") ? 0 :
		RelationGetRelid(rel) == sh_relation_oid("floors") ? 1 :
		RelationGetRelid(rel) == sh_relation_oid("replica_state") ? 2 : 3;
	/*
	 * A parallel restore loads the history (whose trigger locks object rows
	 * in history order) and this table (in its own order) at once: merge
	 * only while no reporter holds rows, so that the two cannot deadlock.
	 */
	LockRelationOid(RelationGetRelid(rel), ShareRowExclusiveLock);
	/* A key's dumped last_seen_at: later stamps come after it (folding checks that). */
	if (which == 2)
	{
		bool		isnull;
		Datum		seen = heap_getattr(trigdata->tg_trigtuple,
										sh_attnum(RelationGetDescr(rel), "replica_state", "last_seen_at"),
										RelationGetDescr(rel), &isnull);

		if (!isnull)
			sh_clock_observe(DatumGetTimestampTz(seen));
	}
	types[0] = rel->rd_rel->reltype;
	args[0] = heap_copy_tuple_as_datum(trigdata->tg_trigtuple, RelationGetDescr(rel));
	plan = &plans[which];
	SPI_connect();
	sh_become_owner(RelationGetRelid(rel), &saved);
	/* The row type is the plan's parameter: a recreated extension has a new one. */
	if (*plan != NULL && plan_types[which] != types[0])
	{
		SPI_freeplan(*plan);
		*plan = NULL;
	}
	plan_types[which] = types[0];
	if (*plan == NULL)
		*plan = sh_prepare_kept(merges[which], 1, types);
	ret = sh_execute_own(*plan, args, NULL);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: merging a restored row failed: %s", SPI_result_code_string(ret));
	sh_restore_user(&saved);
	/* Restored roles get their privileges (GRANTs an upgrade made are the extension's: not dumped). */
	if (which == 3)
	{
		if (!superuser())
			ereport(NOTICE,
					(errmsg("the roles of status_history were restored, but not their privileges"),
					 errhint("Run SELECT status_history.apply_privileges() as a superuser.")));
		else if (SPI_execute("SELECT status_history.apply_privileges()", false, 0) != SPI_OK_SELECT)
			elog(ERROR, "status_history: applying the restored roles' privileges failed");
	}
	SPI_finish();
	/* Merged: the original row is not inserted. */
	return PointerGetDatum(NULL);
}
