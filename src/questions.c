/*
 * questions.c — asking the history about the past: history_of(), intervals()
 * and time_in_status().
 *
 * Owns: the three read-only set-returning functions over a window of the
 * history, their kept SPI plans, and how a window's periods are built.
 *
 * The window is half-open, [since, until).  intervals() and time_in_status()
 * clip its end at "now", which is the transaction's now() (its start time):
 * the functions are STABLE, so every call in a transaction sees the same
 * window; a report stamped later than that (made later in the same
 * transaction, or imported with a stamp in the future) counts from a later
 * transaction on.  history_of() returns stored rows and does not clip.
 *
 * Periods.  The current status of an object at time t is its newest
 * non-stale report with occurred_at <= t.  A period is a maximal run of
 * consecutive non-stale reports with the same status (the rule of
 * status_since), clipped to the window; its replica_id and error are those of
 * the report that started the run, also when that report is before since.
 * The object's non-stale reports are fed in stamp order to periods_feed(),
 * which closes a period when the status changes and hands it to a callback:
 * intervals() emits it, time_in_status() adds its length to the object's
 * total for that status.
 *
 * Plans (all prepared once per backend and kept, through sh_prepare_kept, so
 * generic; every one is driven by history_object_idx (object_id, occurred_at
 * DESC) or the primary key (occurred_at)):
 *   history_of      one range scan of the object's index entries in the window;
 *   intervals       the run in force at since: the newest non-stale report
 *                   before since, the newest report of another status before
 *                   that, the report after it (three index probes; the middle
 *                   one walks back over the run), then one range scan of the
 *                   object's window;
 *   time_in_status  ONE query for all objects: per object, one index probe for
 *                   the status in force at since (newest non-stale report
 *                   before since), UNION ALL the window's non-stale reports
 *                   (a range scan of the primary key, or of the object index
 *                   per listed object), sorted by object_id, occurred_at.  C
 *                   reads it once through a cursor and accumulates per object,
 *                   so memory holds one object's totals, whatever the count.
 *
 * Memory.  Rows come from a cursor in batches, each freed after use.  What
 * must outlive a batch lives in a context of its own, reset when it changes:
 * the replica_id and error of the open period (intervals), the current
 * object's id (time_in_status).  Results go to a tuplestore (spills past
 * work_mem).
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "access/xact.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#include "status_history.h"

PG_FUNCTION_INFO_V1(status_history_history_of);
PG_FUNCTION_INFO_V1(status_history_intervals);
PG_FUNCTION_INFO_V1(status_history_time_in_status);

#define QUESTIONS_BATCH 1000

/* history_of: the object's reports in [$2, $3), oldest first. */
#define HISTORY_OF_SQL \
	"SELECT h.* FROM status_history.history AS h" \
	" WHERE h.object_id OPERATOR(pg_catalog.=) $1" \
	"   AND h.occurred_at OPERATOR(pg_catalog.>=) $2" \
	"   AND h.occurred_at OPERATOR(pg_catalog.<) $3" \
	" ORDER BY h.occurred_at"

/*
 * intervals: the report that started the run in force at $2 (at most one row):
 * "at" is the newest non-stale report before $2, "brk" the newest non-stale
 * report of another status before "at", and the run starts at the first
 * non-stale report after "brk".
 */
#define RUN_START_SQL \
	"SELECT r.occurred_at, r.status, r.replica_id, r.error" \
	"  FROM (SELECT h.occurred_at, h.status FROM status_history.history AS h" \
	"         WHERE h.object_id OPERATOR(pg_catalog.=) $1" \
	"           AND h.occurred_at OPERATOR(pg_catalog.<) $2 AND NOT h.stale" \
	"         ORDER BY h.occurred_at DESC LIMIT 1) AS at" \
	"  LEFT JOIN LATERAL" \
	"       (SELECT h.occurred_at FROM status_history.history AS h" \
	"         WHERE h.object_id OPERATOR(pg_catalog.=) $1" \
	"           AND h.occurred_at OPERATOR(pg_catalog.<) at.occurred_at AND NOT h.stale" \
	"           AND h.status OPERATOR(pg_catalog.<>) at.status" \
	"         ORDER BY h.occurred_at DESC LIMIT 1) AS brk ON true" \
	" CROSS JOIN LATERAL" \
	"       (SELECT h.occurred_at, h.status, h.replica_id, h.error FROM status_history.history AS h" \
	"         WHERE h.object_id OPERATOR(pg_catalog.=) $1" \
	"           AND h.occurred_at OPERATOR(pg_catalog.>)" \
	"               COALESCE(brk.occurred_at, '-infinity'::pg_catalog.timestamptz)" \
	"           AND h.occurred_at OPERATOR(pg_catalog.<=) at.occurred_at AND NOT h.stale" \
	"         ORDER BY h.occurred_at LIMIT 1) AS r"

/* intervals: the object's non-stale reports in [$2, $3), oldest first. */
#define WINDOW_ROWS_SQL \
	"SELECT h.occurred_at, h.status, h.replica_id, h.error FROM status_history.history AS h" \
	" WHERE h.object_id OPERATOR(pg_catalog.=) $1" \
	"   AND h.occurred_at OPERATOR(pg_catalog.>=) $2" \
	"   AND h.occurred_at OPERATOR(pg_catalog.<) $3 AND NOT h.stale" \
	" ORDER BY h.occurred_at"

/*
 * time_in_status: per object of OBJECTS (a relation o(object_id)), the status
 * in force at $1 (one index probe each), and the window's non-stale reports
 * (FILTER restricts them to the listed objects), sorted per object by stamp.
 */
#define TIME_IN_STATUS_SQL(OBJECTS, FILTER) \
	"SELECT p.object_id, p.occurred_at, p.status FROM (" \
	"  SELECT o.object_id, b.occurred_at, b.status FROM " OBJECTS \
	"   CROSS JOIN LATERAL" \
	"       (SELECT h.occurred_at, h.status FROM status_history.history AS h" \
	"         WHERE h.object_id OPERATOR(pg_catalog.=) o.object_id" \
	"           AND h.occurred_at OPERATOR(pg_catalog.<) $1 AND NOT h.stale" \
	"         ORDER BY h.occurred_at DESC LIMIT 1) AS b" \
	"  UNION ALL" \
	"  SELECT h.object_id, h.occurred_at, h.status FROM status_history.history AS h" \
	"   WHERE h.occurred_at OPERATOR(pg_catalog.>=) $1" \
	"     AND h.occurred_at OPERATOR(pg_catalog.<) $2 AND NOT h.stale" FILTER \
	") AS p ORDER BY p.object_id COLLATE pg_catalog.\"C\", p.occurred_at"

/* Objects with a non-stale report (the per-object state says which). */
#define ALL_OBJECTS \
	"(SELECT s.object_id FROM status_history.objects AS s WHERE s.occurred_at IS NOT NULL) AS o"
#define LISTED_OBJECTS \
	"(SELECT DISTINCT l.id FROM pg_catalog.unnest($3) AS l(id)) AS o(object_id)"
#define LISTED_FILTER " AND h.object_id OPERATOR(pg_catalog.=) ANY ($3)"

static SPIPlanPtr history_of_plan = NULL;
static SPIPlanPtr run_start_plan = NULL;
static SPIPlanPtr window_rows_plan = NULL;
static SPIPlanPtr tis_all_plan = NULL;
static SPIPlanPtr tis_listed_plan = NULL;

/* Inside SPI: the kept plan in *slot, prepared on first use. */
static SPIPlanPtr
kept_plan(SPIPlanPtr *slot, const char *sql, int nargs, Oid *types)
{
	if (*slot == NULL)
		*slot = sh_prepare_kept(sql, nargs, types);
	return *slot;
}

/* ---------------------------------------------------------------------------
 * Arguments and the window.
 * ---------------------------------------------------------------------------
 */

/* A required argument must not be NULL (22004). */
static void
require_arg(FunctionCallInfo fcinfo, int argno, const char *name, const char *hint)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", name),
				 errhint("%s", hint)));
}

#define UNBOUNDED_HINT "Pass '-infinity' for a window with no start, 'infinity' for one with no end."

/* until must not be earlier than since (22023). */
static void
check_window(TimestampTz since, TimestampTz until)
{
	if (until < since)
	{
		/* timestamptz_to_str() returns a static buffer: copy each. */
		char	   *since_str = pstrdup(timestamptz_to_str(since));
		char	   *until_str = pstrdup(timestamptz_to_str(until));

		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("until must not be earlier than since"),
				 errdetail("The window is [since, until): since %s, until %s.", since_str, until_str),
				 errhint("Swap the two bounds.")));
	}
}

/* since, until (required), checked; the window's end clipped at now(). */
static void
window_args(FunctionCallInfo fcinfo, int since_arg, TimestampTz *since, TimestampTz *end)
{
	TimestampTz until;

	require_arg(fcinfo, since_arg, "since", UNBOUNDED_HINT);
	require_arg(fcinfo, since_arg + 1, "until", UNBOUNDED_HINT);
	*since = PG_GETARG_TIMESTAMPTZ(since_arg);
	until = PG_GETARG_TIMESTAMPTZ(since_arg + 1);
	check_window(*since, until);
	*end = Min(until, GetCurrentTransactionStartTimestamp());
}

/* A length in microseconds as an interval, hours justified into days like timestamptz - timestamptz. */
static Datum
duration_datum(int64 usecs, Interval *iv)
{
	iv->month = 0;
	iv->day = (int32) (usecs / USECS_PER_DAY);
	iv->time = usecs % USECS_PER_DAY;
	return IntervalPGetDatum(iv);
}

/* The index of a stored report's status; the insert trigger lets no other through. */
static int
status_of(Datum status)
{
	int			i = sh_status_index(status);

	if (i < 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("status_history.history holds an unknown status \"%s\"",
						TextDatumGetCString(status)),
				 errhint("Only starting, running, paused, stalled, ceased and dropped are valid.")));
	return i;
}

/* ---------------------------------------------------------------------------
 * Periods: one object's non-stale reports, in stamp order, in the window.
 * ---------------------------------------------------------------------------
 */
typedef struct Periods Periods;
typedef void (*PeriodClosed) (Periods *p, TimestampTz ended_at);

struct Periods
{
	TimestampTz since;			/* the window: [since, end), end > since */
	TimestampTz end;
	PeriodClosed closed;		/* called for each period of positive length */
	bool		open;			/* a period is in force */
	int			status;			/* its status, an index in sh_statuses */
	TimestampTz start;			/* its start, clipped to since */

	/* intervals(): the result, and the run's first report (in run_cxt) */
	ReturnSetInfo *rsinfo;
	MemoryContext run_cxt;
	Datum		replica_id;
	bool		replica_null;
	Datum		error;
	bool		error_null;

	/* time_in_status(): the current object's time per status, microseconds */
	int64		total[SH_NSTATUSES];
};

/*
 * The next report (stamp order, non-stale, stamp < end).  Returns true when
 * it starts a new period, after closing the one in force.  A report before
 * since starts its period at since; a period cut to nothing by that (the next
 * report is at since) is not closed, only replaced.
 */
static bool
periods_feed(Periods *p, TimestampTz at, int status)
{
	TimestampTz from = Max(at, p->since);

	if (p->open && p->status == status)
		return false;			/* the run goes on */
	if (p->open && from > p->start)
		p->closed(p, from);
	p->open = true;
	p->status = status;
	p->start = from;
	return true;
}

/* The period in force at the end of the window ends there. */
static void
periods_finish(Periods *p)
{
	if (p->open && p->end > p->start)
		p->closed(p, p->end);
	p->open = false;
}

/* ---------------------------------------------------------------------------
 * history_of(object_id text, since timestamptz, until timestamptz)
 * ---------------------------------------------------------------------------
 */
Datum
status_history_history_of(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			types[3] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[3];
	TimestampTz since;
	TimestampTz until;

	sh_check_version();
	require_arg(fcinfo, 0, "object_id", "Name the object whose reports to return.");
	/* NULL bounds are unbounded; stamps are always finite. */
	if (PG_ARGISNULL(1))
		TIMESTAMP_NOBEGIN(since);
	else
		since = PG_GETARG_TIMESTAMPTZ(1);
	if (PG_ARGISNULL(2))
		TIMESTAMP_NOEND(until);
	else
		until = PG_GETARG_TIMESTAMPTZ(2);
	check_window(since, until);

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (until == since)
		return (Datum) 0;
	args[0] = PG_GETARG_DATUM(0);
	args[1] = TimestampTzGetDatum(since);
	args[2] = TimestampTzGetDatum(until);

	SPI_connect();
	sh_put_history_rows(rsinfo, kept_plan(&history_of_plan, HISTORY_OF_SQL, 3, types), args);
	SPI_finish();
	return (Datum) 0;
}

/* ---------------------------------------------------------------------------
 * intervals(object_id text, since timestamptz, until timestamptz)
 * ---------------------------------------------------------------------------
 */

/* Emit a period: status, started_at, ended_at, duration, replica_id, error. */
static void
interval_closed(Periods *p, TimestampTz ended_at)
{
	Datum		values[6];
	bool		nulls[6] = {false, false, false, false, p->replica_null, p->error_null};
	Interval	iv;

	values[0] = CStringGetTextDatum(sh_statuses[p->status]);
	values[1] = TimestampTzGetDatum(p->start);
	values[2] = TimestampTzGetDatum(ended_at);
	values[3] = duration_datum(ended_at - p->start, &iv);
	values[4] = p->replica_id;
	values[5] = p->error;
	tuplestore_putvalues(p->rsinfo->setResult, p->rsinfo->setDesc, values, nulls);
	pfree(DatumGetPointer(values[0]));
}

/* Feed rows (occurred_at, status, replica_id, error) of an intervals() query. */
static void
interval_rows(Periods *p, SPITupleTable *rows, uint64 n)
{
	for (uint64 i = 0; i < n; i++)
	{
		HeapTuple	row = rows->vals[i];
		bool		isnull;
		TimestampTz at = DatumGetTimestampTz(SPI_getbinval(row, rows->tupdesc, 1, &isnull));
		int			status = status_of(SPI_getbinval(row, rows->tupdesc, 2, &isnull));
		MemoryContext old;

		if (!periods_feed(p, at, status))
			continue;
		/* A new run: keep its first report's replica_id and error. */
		MemoryContextReset(p->run_cxt);
		old = MemoryContextSwitchTo(p->run_cxt);
		p->replica_id = SPI_getbinval(row, rows->tupdesc, 3, &p->replica_null);
		p->replica_id = p->replica_null ? (Datum) 0 : datumCopy(p->replica_id, false, -1);
		p->error = SPI_getbinval(row, rows->tupdesc, 4, &p->error_null);
		p->error = p->error_null ? (Datum) 0 : datumCopy(p->error, false, -1);
		MemoryContextSwitchTo(old);
	}
}

Datum
status_history_intervals(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			types[3] = {TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID};
	Datum		args[3];
	Periods		p = {0};
	Portal		portal;
	int			rc;

	sh_check_version();
	require_arg(fcinfo, 0, "object_id", "Name the object whose periods to return.");
	window_args(fcinfo, 1, &p.since, &p.end);
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (p.end <= p.since)
		return (Datum) 0;		/* empty, or entirely after now() */

	p.closed = interval_closed;
	p.rsinfo = rsinfo;
	p.run_cxt = AllocSetContextCreate(CurrentMemoryContext, "status_history intervals run",
									  ALLOCSET_SMALL_SIZES);
	args[0] = PG_GETARG_DATUM(0);
	args[1] = TimestampTzGetDatum(p.since);
	args[2] = TimestampTzGetDatum(p.end);

	SPI_connect();
	/* The run in force at since, if any: its first report. */
	rc = SPI_execute_plan(kept_plan(&run_start_plan, RUN_START_SQL, 2, types), args, NULL, true, 1);
	if (rc != SPI_OK_SELECT)
		elog(ERROR, "status_history: intervals run start: %s", SPI_result_code_string(rc));
	interval_rows(&p, SPI_tuptable, SPI_processed);
	SPI_freetuptable(SPI_tuptable);

	/* The reports in the window. */
	portal = SPI_cursor_open(NULL, kept_plan(&window_rows_plan, WINDOW_ROWS_SQL, 3, types),
							 args, NULL, true);
	for (;;)
	{
		SPI_cursor_fetch(portal, true, QUESTIONS_BATCH);
		if (SPI_processed == 0)
			break;
		interval_rows(&p, SPI_tuptable, SPI_processed);
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_cursor_close(portal);
	periods_finish(&p);
	SPI_finish();
	MemoryContextDelete(p.run_cxt);
	return (Datum) 0;
}

/* ---------------------------------------------------------------------------
 * time_in_status(since timestamptz, until timestamptz, object_ids text[])
 * ---------------------------------------------------------------------------
 */

static void
time_closed(Periods *p, TimestampTz ended_at)
{
	p->total[p->status] += ended_at - p->start;
}

/* Emit the object's totals: object_id, status, duration, share; then start afresh. */
static void
time_emit(Periods *p, text *object_id)
{
	/* With since = -infinity the window has no finite length: share is NULL. */
	bool		no_share = TIMESTAMP_NOT_FINITE(p->since);
	double		window = no_share ? 0 : (double) (p->end - p->since);

	periods_finish(p);
	for (int s = 0; s < SH_NSTATUSES; s++)
	{
		Datum		values[4];
		bool		nulls[4] = {false, false, false, no_share};
		Interval	iv;

		if (p->total[s] == 0)
			continue;
		values[0] = PointerGetDatum(object_id);
		values[1] = CStringGetTextDatum(sh_statuses[s]);
		values[2] = duration_datum(p->total[s], &iv);
		values[3] = Float8GetDatum(no_share ? 0 : p->total[s] / window);
		tuplestore_putvalues(p->rsinfo->setResult, p->rsinfo->setDesc, values, nulls);
		pfree(DatumGetPointer(values[1]));
		p->total[s] = 0;
	}
}

Datum
status_history_time_in_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		listed = !PG_ARGISNULL(2);
	Oid			types[3] = {TIMESTAMPTZOID, TIMESTAMPTZOID, TEXTARRAYOID};
	Datum		args[3];
	Periods		p = {0};
	Portal		portal;
	MemoryContext object_cxt;
	text	   *object_id = NULL;	/* the object being summed, in object_cxt */

	sh_check_version();
	window_args(fcinfo, 0, &p.since, &p.end);
	if (listed)
		sh_check_id_list(PG_GETARG_DATUM(2));
	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);
	if (p.end <= p.since)
		return (Datum) 0;		/* empty, or entirely after now() */

	p.closed = time_closed;
	p.rsinfo = rsinfo;
	object_cxt = AllocSetContextCreate(CurrentMemoryContext, "status_history time_in_status object",
									   ALLOCSET_SMALL_SIZES);
	args[0] = TimestampTzGetDatum(p.since);
	args[1] = TimestampTzGetDatum(p.end);
	args[2] = listed ? PG_GETARG_DATUM(2) : (Datum) 0;

	SPI_connect();
	portal = SPI_cursor_open(NULL,
							 listed ?
							 kept_plan(&tis_listed_plan,
									   TIME_IN_STATUS_SQL(LISTED_OBJECTS, LISTED_FILTER), 3, types) :
							 kept_plan(&tis_all_plan, TIME_IN_STATUS_SQL(ALL_OBJECTS, ""), 2, types),
							 args, NULL, true);
	for (;;)
	{
		SPI_cursor_fetch(portal, true, QUESTIONS_BATCH);
		if (SPI_processed == 0)
			break;
		for (uint64 i = 0; i < SPI_processed; i++)
		{
			HeapTuple	row = SPI_tuptable->vals[i];
			TupleDesc	desc = SPI_tuptable->tupdesc;
			bool		isnull;
			text	   *id = DatumGetTextPP(SPI_getbinval(row, desc, 1, &isnull));
			TimestampTz at = DatumGetTimestampTz(SPI_getbinval(row, desc, 2, &isnull));

			/* Rows come grouped by object: a new id closes the previous object. */
			if (object_id == NULL || sh_text_key_match(&id, &object_id, sizeof(text *)) != 0)
			{
				if (object_id != NULL)
					time_emit(&p, object_id);
				MemoryContextReset(object_cxt);
				object_id = (text *) MemoryContextAlloc(object_cxt, VARSIZE_ANY(id));
				memcpy(object_id, id, VARSIZE_ANY(id));
			}
			periods_feed(&p, at, status_of(SPI_getbinval(row, desc, 3, &isnull)));
		}
		SPI_freetuptable(SPI_tuptable);
	}
	if (object_id != NULL)
		time_emit(&p, object_id);
	SPI_cursor_close(portal);
	SPI_finish();
	MemoryContextDelete(object_cxt);
	return (Datum) 0;
}
