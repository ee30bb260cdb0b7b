/*
 * retire.c — retire_replica(): a replica that is gone for good.
 *
 * Retiring marks the replica's floor retired (fence.c): from then on every
 * report of it is stale, and neither a report nor reconnect() brings it
 * back.  Then, for each object whose current report the replica made, the
 * status must stop showing that leftover: the newest non-stale report of
 * another live key of the object (found through status_history.replica_state)
 * is re-stamped, as reconnect() re-stamps, so that it is again the newest
 * non-stale row; with no live key left, a paused report without a replica
 * is appended, its details saying why (Materialize appends exactly such a
 * row when a replica is dropped).
 *
 * Ordering and deadlocks are reconnect()'s: the floor is changed first and
 * every reporter that read it before is waited for, then the objects in
 * scope are locked in bytewise order with the same back-off.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_retire_replica);

/* Refuse what retire_replica() cannot do; the messages say how to call it. */
static void
check_retire_args(FunctionCallInfo fcinfo)
{
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("replica_id must not be null"),
				 errhint("Name the replica to retire; reports without a replica cannot be retired.")));
	if (VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(0)) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("replica_id must not be empty"),
				 errhint("Name the replica to retire.")));
	if (!PG_ARGISNULL(1))
		sh_check_generation(PG_GETARG_INT64(1), "Pass the controller's generation, or NULL to keep each copied report's.");
	sh_fence_check_unreported("retire_replica()");
}

/* The objects whose current report the replica made, read as of now. */
static int
current_from(Datum replica_id, Datum **ids)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		args[1] = {replica_id};
	MemoryContext outer = CurrentMemoryContext;
	ShSavedUser saved;
	int			n;

	SPI_connect();
	sh_become_owner(sh_relation_oid("objects"), &saved);
	if (plan == NULL)
		plan = sh_prepare_kept("SELECT k.object_id FROM status_history.replica_state AS k"
							   "  JOIN status_history.objects AS o"
							   "    ON o.object_id OPERATOR(pg_catalog.=) k.object_id"
							   "   AND o.replica_id OPERATOR(pg_catalog.=) k.replica_id"
							   " WHERE k.replica_id OPERATOR(pg_catalog.=) $1", 1, types);
	if (sh_execute_latest(plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading the objects of a replica failed");
	n = (int) SPI_processed;
	*ids = MemoryContextAlloc(outer, Max(n, 1) * sizeof(Datum));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		(*ids)[i] = SPI_datumTransfer(SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
													1, &isnull), false, -1);
	}
	sh_restore_user(&saved);
	SPI_finish();
	return n;
}

/*
 * Append, for each locked object still showing the replica, its replacement:
 * another live key's newest non-stale report, or paused.  Without a
 * generation a row keeps the one it copies (0 for paused), raised to the
 * object's fence and floors when below them (it would be stale otherwise).
 * Returns the number of objects whose status is not the one they showed.
 */
static uint64
append_replacements(Datum *ids, int n, Datum replica_id, bool gen_null, int64 generation)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[3] = {TEXTARRAYOID, INT8OID, TEXTOID};
	Datum		args[3];
	char		nulls[3] = {' ', gen_null ? 'n' : ' ', ' '};
	int			ret;
	uint64		appended;

	args[0] = PointerGetDatum(sh_text_array(ids, n));
	args[1] = Int64GetDatum(generation);
	args[2] = replica_id;
	SPI_connect();
	if (plan == NULL)
		plan = sh_prepare_kept(
							   "WITH before AS MATERIALIZED ("
							   "     SELECT o.object_id, o.status FROM status_history.objects AS o"
							   "      WHERE o.object_id OPERATOR(pg_catalog.=) ANY ($1)),"
							   " appended AS ("
							   "INSERT INTO status_history.history AS h"
							   " (object_id, status, error, details, replica_id, generation, reported_at, lease)"
							   " SELECT o.object_id,"
							   "        CASE WHEN r.lapsed THEN 'stalled' ELSE COALESCE(r.status, 'paused') END,"
							   "        CASE WHEN r.lapsed THEN status_history.lapse_error(r.replica_id,"
							   "                 r.k_expires OPERATOR(pg_catalog.-) r.lease) ELSE r.error END,"
							   "        CASE WHEN r.lapsed THEN NULL"
							   "             WHEN r.occurred_at IS NULL"
							   "             THEN pg_catalog.jsonb_build_object('hints', pg_catalog.jsonb_build_array("
							   "                  'replica ' OPERATOR(pg_catalog.||) $3"
							   "                  OPERATOR(pg_catalog.||) ' was retired; no live replica reports this object'))"
							   "             ELSE r.details END,"
							   "        r.replica_id,"
							   "        COALESCE($2, GREATEST(COALESCE(r.generation, 0), o.fence,"
							   "                 (SELECT pg_catalog.max(f.generation) FROM status_history.floors AS f"
							   "                   WHERE f.retired_at IS NULL AND (f.replica_id IS NULL"
							   "                      OR f.replica_id OPERATOR(pg_catalog.=) r.replica_id)))),"
							   "        CASE WHEN r.lapsed THEN r.k_expires ELSE r.reported_at END,"
							   "        CASE WHEN r.lapsed THEN NULL ELSE r.lease END"
							   "   FROM pg_catalog.unnest($1) WITH ORDINALITY AS s(id, n)"
							   "   JOIN status_history.objects AS o ON o.object_id OPERATOR(pg_catalog.=) s.id"
							   "   LEFT JOIN LATERAL ("
							   "        SELECT c.*, k.expires_at AS k_expires,"
							   "               k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed"
							   "          FROM status_history.replica_state AS k"
							   "          JOIN status_history.history AS c ON c.occurred_at OPERATOR(pg_catalog.=) k.occurred_at"
							   "         WHERE k.object_id OPERATOR(pg_catalog.=) o.object_id"
							   "           AND k.replica_id IS DISTINCT FROM $3"
							   "           AND NOT EXISTS (SELECT FROM status_history.floors AS f"
							   "                            WHERE f.replica_id OPERATOR(pg_catalog.=) k.replica_id"
							   "                              AND f.retired_at IS NOT NULL)"
							   "         ORDER BY k.occurred_at DESC LIMIT 1) AS r ON true"
							   "  WHERE o.replica_id OPERATOR(pg_catalog.=) $3"
							   "    AND o.occurred_at IS NOT NULL AND o.status OPERATOR(pg_catalog.<>) 'dropped'"
							   "  ORDER BY s.n"
							   " RETURNING h.object_id, h.status)"
							   "SELECT pg_catalog.count(*) FROM appended AS a JOIN before AS b"
							   "    ON b.object_id OPERATOR(pg_catalog.=) a.object_id"
							   " WHERE b.status IS DISTINCT FROM a.status", 3, types);
	/* Runs as the caller's definer (SECURITY DEFINER): the extension owner. */
	ret = sh_execute_latest(plan, args, nulls, false, 0);
	if (ret != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "status_history: appending the replacements failed: %s", SPI_result_code_string(ret));
	{
		bool		isnull;

		appended = (uint64) DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	SPI_finish();
	return appended;
}

/*
 * SQL: status_history.retire_replica(replica_id text, generation bigint)
 * Returns the number of objects whose status changed; 0 when the replica
 * was retired already or never reported.
 */
Datum
status_history_retire_replica(PG_FUNCTION_ARGS)
{
	Datum		replica_id;
	bool		gen_null = PG_ARGISNULL(1);
	int64		generation = gen_null ? 0 : PG_GETARG_INT64(1);
	Datum	   *ids;
	int			n;
	volatile uint64 changed = 0;

	sh_check_version();
	check_retire_args(fcinfo);
	replica_id = PG_GETARG_DATUM(0);
	sh_state_settle();
	sh_lock_prune_eagerly(true);
	PG_TRY();
	{
		if (sh_fence_retire(replica_id))
		{
			if (!gen_null && generation < sh_fence_floor((Datum) 0, true))
				sh_fence_refuse(generation, sh_fence_floor((Datum) 0, true),
								"every object (database-wide)");
			n = current_from(replica_id, &ids);
			n = sh_sort_ids(ids, n);
			sh_fence_lock_scope(ids, n, true);
			for (int i = 0; i < n && !gen_null; i++)
			{
				ShObject   *obj = sh_state_lock(ids[i]);

				sh_state_catch_up(obj);
				if (obj->fence > generation)
					sh_fence_refuse(generation, obj->fence,
									psprintf("object \"%s\"", TextDatumGetCString(ids[i])));
			}
			/* The state SQL reads below must include this transaction's reports. */
			sh_state_settle();
			/* Only now: the rows folded before are reports, not copies. */
			sh_fence_set_in_reconnect(true);
			if (n > 0)
				changed = append_replacements(ids, n, replica_id, gen_null, generation);
		}
	}
	PG_FINALLY();
	{
		sh_lock_prune_eagerly(false);
		sh_fence_set_in_reconnect(false);
	}
	PG_END_TRY();
	PG_RETURN_INT64((int64) changed);
}
