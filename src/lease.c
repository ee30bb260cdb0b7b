/*
 * lease.c — leases: a report that holds for a while only, unless its key
 * reports again.
 *
 * A report may carry a lease (history.lease).  Its key's state keeps when it
 * runs out (replica_state.expires_at, and objects.expires_at for the
 * object's current report): the report's stamp plus the lease, moved on by
 * every repeat of it (state.c).  Readers compare that with now() and show
 * a lapsed report as stalled (the views, latest()), so a lapse is seen at
 * once, on a standby too, without any writer.  expire() records the lapse
 * readers show for each object whose current report's lease ran out: one
 * row, stalled, re-checked under the object's lock by the insert trigger
 * (sh_lease_still_due), so a report that renewed the lease meanwhile wins
 * and a fenced key is not revived.  The background worker (worker.c) calls
 * it.
 *
 * Also: checking a lease as given (positive, no months; a day is 24 hours,
 * stored so), and the arithmetic on it, in microseconds.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "common/int.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_expire);

static bool in_expire = false;

/* A lease, in microseconds (as stored: days and time; months are refused). */
int64
sh_lease_usecs(Datum lease)
{
	Interval   *iv = DatumGetIntervalP(lease);
	int64		days;
	int64		usecs;

	if (pg_mul_s64_overflow(iv->day, USECS_PER_DAY, &days) ||
		pg_add_s64_overflow(days, iv->time, &usecs))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("lease is out of range"),
				 errhint("Give a lease of at most a few thousand years.")));
	return usecs;
}

/*
 * When a lease given by a report or repeat stamped from runs out: from its
 * stamp, or from the time it is decided if that is earlier -- stamps run
 * ahead of the time of day after an import stamped ahead (max_import_lead),
 * and readers compare with now().  An error past the last timestamp.
 */
TimestampTz
sh_lease_expiry(TimestampTz from, int64 lease)
{
	TimestampTz at;

	from = Min(from, GetCurrentTimestamp());
	if (pg_add_s64_overflow(from, lease, &at) || !IS_VALID_TIMESTAMP(at))
		ereport(ERROR,
				(errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE),
				 errmsg("lease would run out after the last timestamp"),
				 errhint("Give a shorter lease, or none (NULL) for a status that holds until the next report.")));
	return at;
}

/*
 * Check a report's lease, given for a report stamped stamp, and store it as
 * microseconds of time (a day is 24 hours: the same in every time zone, so
 * that every session computes the same expiry).  Returns it in
 * microseconds.
 */
int64
sh_lease_check(Datum *lease, TimestampTz stamp, const char *status)
{
	Interval   *iv = DatumGetIntervalP(*lease);
	int64		usecs;

	if (iv->month != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must not be given in months or years"),
				 errdetail("A month has no fixed length."),
				 errhint("Give the lease in days, hours, minutes or seconds, e.g. '30 seconds'.")));
	usecs = sh_lease_usecs(*lease);
	if (usecs <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be positive"),
				 errdetail("The lease given is %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out, *lease))),
				 errhint("Give how long the status holds unless the reporter reports again, e.g. '30 seconds', or NULL for no lease.")));
	if (strcmp(status, "dropped") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a dropped report takes no lease"),
				 errdetail("Dropped is final: it cannot lapse."),
				 errhint("Report dropped without a lease.")));
	(void) sh_lease_expiry(stamp, usecs);
	if (iv->day != 0)
	{
		Interval   *stored = palloc0(sizeof(Interval));

		stored->time = usecs;
		*lease = IntervalPGetDatum(stored);
	}
	return usecs;
}

/* Is the insert trigger looking at one of expire()'s lapses? */
bool
sh_lease_in_expire(void)
{
	return in_expire;
}

/*
 * Is the lapse expire() read, of the lease that runs out at expected, still
 * due now that the object is locked and its stored rows folded?  Only if the
 * object's current report is still the key's and its lease was not renewed
 * or replaced (expires_at moved) since.
 */
bool
sh_lease_still_due(ShObject *obj, ShKey *key, TimestampTz expected)
{
	return obj->has_current && obj->expires_at != SH_NO_STAMP && obj->expires_at == expected &&
		key != NULL && key->has_current && key->current_at == obj->current_at &&
		expected <= GetCurrentStatementStartTimestamp();
}

/* The ids of (at most max of) the objects whose current report's lease has run out. */
static int
lapsed_ids(int64 max, Datum **ids)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {INT8OID};
	Datum		args[1] = {Int64GetDatum(max)};

	return sh_read_ids(&plan, "SELECT o.object_id FROM status_history.objects AS o"
					   " WHERE o.expires_at OPERATOR(pg_catalog.<=) pg_catalog.statement_timestamp()"
					   "   AND o.occurred_at IS NOT NULL"
					   " LIMIT $1", 1, types, args, ids);
}

/*
 * Is the history a logical-replication subscription's target here?  Then
 * heartbeats (which append no row) do not arrive, leases seem to run out,
 * and lapses recorded here would be rows the publisher never had.
 */
static bool
history_subscribed(void)
{
	Oid			types[1] = {OIDOID};
	Datum		args[1] = {ObjectIdGetDatum(sh_relation_oid("history"))};
	bool		subscribed;

	SPI_connect();
	if (SPI_execute_with_args("SELECT 1 FROM pg_catalog.pg_subscription_rel AS s"
							  " WHERE s.srrelid OPERATOR(pg_catalog.=) $1",
							  1, types, args, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "status_history: reading the subscriptions failed");
	subscribed = SPI_processed > 0;
	SPI_finish();
	return subscribed;
}

/* Append the lapses of the locked objects; the insert trigger re-checks each. */
static uint64
append_lapses(Datum *ids, int n)
{
	static SPIPlanPtr plan = NULL;
	Oid			types[1] = {TEXTARRAYOID};
	Datum		args[1];
	int			ret;

	args[0] = PointerGetDatum(sh_text_array(ids, n));
	if (plan == NULL)
		plan = sh_prepare_kept("INSERT INTO status_history.history"
							   " (object_id, status, error, details, replica_id, generation, reported_at)"
							   " SELECT o.object_id, 'stalled',"
							   "        o.lapse_error,"
							   "        NULL, o.replica_id, o.generation, o.expires_at"
							   "   FROM status_history.objects AS o"
							   "  WHERE o.object_id OPERATOR(pg_catalog.=) ANY ($1)"
							   "    AND o.expires_at OPERATOR(pg_catalog.<=) pg_catalog.statement_timestamp()"
							   "    AND o.occurred_at IS NOT NULL"
							   "  ORDER BY o.object_id", 1, types);
	/* Runs as the caller's definer (SECURITY DEFINER): the extension owner. */
	ret = sh_execute_latest(plan, args, NULL, false, 0);
	if (ret != SPI_OK_INSERT)
		elog(ERROR, "status_history: recording lapses failed: %s", SPI_result_code_string(ret));
	return SPI_processed;
}

/*
 * SQL: status_history.expire(max_objects) -- record, for every object (at
 * most max_objects) whose current report's lease has run out, the lapse
 * readers already show.  The objects
 * are locked first, in the one fixed order reconnect() and report_many()
 * use, then their lapses appended in one statement.  Returns how many.
 */
Datum
status_history_expire(PG_FUNCTION_ARGS)
{
	Datum	   *ids;
	int			n;
	volatile uint64 appended = 0;

	sh_check_version();
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("expire() cannot run on a standby"),
				 errdetail("It appends to the history; a standby's readers show the lapses without it."),
				 errhint("Call it on the primary (the background worker does).")));
	if (history_subscribed())
	{
		ereport(DEBUG1,
				(errmsg("status_history: the history is a subscription's target here: no lapses recorded")));
		PG_RETURN_INT64(0);
	}
	if (!PG_ARGISNULL(0) && PG_GETARG_INT32(0) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_objects must be at least 1"),
				 errhint("Pass how many lapses one call may record, or NULL for all of them.")));
	n = lapsed_ids(PG_ARGISNULL(0) ? PG_INT64_MAX : PG_GETARG_INT32(0), &ids);
	SPI_connect();
	sh_lock_prune_eagerly(true);
	PG_TRY();
	{
		n = sh_sort_ids(ids, n);
		if (n > 0)
		{
			sh_fence_lock_scope(ids, n, true);
			for (int i = 0; i < n; i++)
				sh_state_catch_up(sh_state_lock(ids[i]));
			/* The lapses are read from the state tables: bring them up to date. */
			sh_state_settle();
			/*
			 * Lapses are no one's report: no repeats, no sightings -- set
			 * only now, so that the rows folded above (a caller's reports
			 * in flight) count as reports.
			 */
			sh_fence_set_in_reconnect(true);
			in_expire = true;
			appended = append_lapses(ids, n);
		}
	}
	PG_FINALLY();
	{
		sh_lock_prune_eagerly(false);
		in_expire = false;
		sh_fence_set_in_reconnect(false);
	}
	PG_END_TRY();
	SPI_finish();
	PG_RETURN_INT64((int64) appended);
}

/* An error anywhere leaves no lapse mode behind. */
static void
lease_xact_callback(XactEvent event, void *arg)
{
	in_expire = false;
}

void
sh_lease_init(void)
{
	RegisterXactCallback(lease_xact_callback, NULL);
}
