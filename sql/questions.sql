-- history_of(), intervals() and time_in_status() against brute force over
-- the history, on a random history with a fixed seed: imported reports at
-- chosen stamps (some imported stale), live reports from several replicas,
-- stale ones below a fence, and imported stamps in the future.  Windows start
-- before the first report, end in the future, hold no report, are empty or
-- unbounded.  Output is booleans and counts only (nothing that depends on
-- now()).
CREATE EXTENSION status_history;
SET status_history.max_import_lead = -1;
SELECT setseed(0.31);

-- 1. Imported reports on 8 objects from 3 replicas (or none) in the first
--    half of 2020, stamps chosen (1 to 600 minutes apart); one in ten
--    imported as stale; then q-0 is dropped (what it reports later is stale).
INSERT INTO status_history.history (occurred_at, object_id, status, error, replica_id, stale)
SELECT t, 'q-' || floor(random() * 8)::int,
       (ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'])[1 + floor(random() * 5)::int],
       CASE WHEN random() < 0.2 THEN 'error ' || i END,
       CASE WHEN random() < 0.1 THEN NULL ELSE 'r' || floor(random() * 3)::int END,
       CASE WHEN random() < 0.1 THEN true END
  FROM (SELECT i, timestamptz '2020-01-01 00:00:00+00'
                  + sum(1 + floor(random() * 600)::int) OVER (ORDER BY i) * interval '1 minute' AS t
          FROM generate_series(1, 800) AS i) AS g
 ORDER BY t;
SELECT max(occurred_at) < '2020-07-01' AS first_half FROM status_history.history;
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id)
VALUES ('2020-07-01 00:00:00+00', 'q-0', 'dropped', 'r0');

-- 2. Live reports, a reconnect, and reports below its fence (stale).
DO $$
BEGIN
    FOR i IN 1 .. 60 LOOP
        PERFORM status_history.report('q-' || floor(random() * 8)::int,
            (ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'])[1 + floor(random() * 5)::int],
            replica_id => 'r' || floor(random() * 3)::int, generation => 1);
    END LOOP;
END $$;
SELECT count(*) AS fenced FROM status_history.reconnect(2, object_ids => ARRAY['q-1', 'q-2', 'q-3']);
DO $$
BEGIN
    FOR i IN 1 .. 60 LOOP
        PERFORM status_history.report('q-' || floor(random() * 8)::int,
            (ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'])[1 + floor(random() * 5)::int],
            replica_id => 'r' || floor(random() * 3)::int, generation => 1 + floor(random() * 2)::int);
    END LOOP;
END $$;

-- 3. Imported stamps in the future (a source whose clock runs ahead), above
--    the clock, which may already be ahead after earlier tests.
SELECT status_history.monotonic_now() AS t0 \gset
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id)
VALUES (:'t0'::timestamptz + interval '1 hour', 'q-4', 'stalled', 'r9'),
       (:'t0'::timestamptz + interval '2 hours', 'q-4', 'running', 'r9'),
       (:'t0'::timestamptz + interval '3 hours', 'q-5', 'paused', 'r9');

SELECT count(*) AS reports, count(*) FILTER (WHERE stale) > 10 AS some_stale,
       count(DISTINCT object_id) AS objects, count(DISTINCT replica_id) AS replicas
  FROM status_history.history;

-- ---------------------------------------------------------------------------
-- Brute force.  Periods: a run of consecutive non-stale reports of one status
-- lasts from its first report to the next run's; it carries its first
-- report's replica_id and error; clipped to [since, least(until, now())).
-- ---------------------------------------------------------------------------
CREATE FUNCTION brute_periods(since timestamptz, until timestamptz)
RETURNS TABLE (object_id text, status text, started_at timestamptz, ended_at timestamptz,
               duration interval, replica_id text, error text)
LANGUAGE sql STABLE AS $$
    WITH ns AS (
        SELECT h.*, lag(h.status) OVER (PARTITION BY h.object_id ORDER BY h.occurred_at) AS prev
          FROM status_history.history AS h WHERE NOT h.stale
    ), runs AS (
        SELECT ns.object_id, ns.status, ns.replica_id, ns.error, ns.occurred_at AS s,
               lead(ns.occurred_at) OVER (PARTITION BY ns.object_id ORDER BY ns.occurred_at) AS e
          FROM ns WHERE ns.prev IS DISTINCT FROM ns.status
    ), clipped AS (
        SELECT r.object_id, r.status, greatest(r.s, since) AS a,
               least(coalesce(r.e, 'infinity'), until, now()) AS b, r.replica_id, r.error
          FROM runs AS r
    )
    SELECT c.object_id, c.status, c.a, c.b, c.b - c.a, c.replica_id, c.error
      FROM clipped AS c WHERE c.b > c.a
$$;

CREATE FUNCTION brute_time(since timestamptz, until timestamptz)
RETURNS TABLE (object_id text, status text, duration interval, share double precision)
LANGUAGE sql STABLE AS $$
    SELECT p.object_id, p.status, sum(p.duration),
           CASE WHEN since > '-infinity' THEN
               extract(epoch FROM sum(p.duration)) / extract(epoch FROM least(until, now()) - since)
           END
      FROM brute_periods(since, until) AS p
     GROUP BY p.object_id, p.status
$$;

-- Windows: random ones within the imported year, and the edge cases.
CREATE TEMP TABLE windows (w serial, since timestamptz, until timestamptz, kind text);
INSERT INTO windows (since, until, kind)
SELECT a, a + random() * interval '60 days', 'random'
  FROM (SELECT timestamptz '2020-01-01 00:00:00+00' + random() * interval '200 days' AS a
          FROM generate_series(1, 30)) AS r;
INSERT INTO windows (since, until, kind) VALUES
    ('2019-06-01 00:00:00+00', '2020-02-01 00:00:00+00', 'starts before the first report'),
    ('2020-06-01 00:00:00+00', now() + interval '1 day', 'ends in the future'),
    ('2020-03-01 00:00:00+00', 'infinity', 'no end'),
    ('-infinity', '2020-05-01 00:00:00+00', 'no start'),
    ('-infinity', 'infinity', 'everything'),
    ('2019-01-01 00:00:00+00', '2019-12-01 00:00:00+00', 'before every report'),
    ('2020-04-01 12:00:00+00', '2020-04-01 12:00:00+00', 'since = until'),
    (now() + interval '1 minute', now() + interval '1 day', 'entirely in the future'),
    ('infinity', 'infinity', 'empty at infinity'),
    ('-infinity', '-infinity', 'empty at -infinity'),
    ('4000-01-01 00:00:00+00 BC', '2020-03-01 00:00:00+00', 'huge'),
    (now() - interval '1 day', now() + interval '4 hours', 'the live and future reports');
-- A window with no report in it, but a status in force (just after a report).
INSERT INTO windows (since, until, kind)
SELECT occurred_at + interval '1 microsecond', occurred_at + interval '2 microseconds', 'no report inside'
  FROM status_history.history WHERE object_id = 'q-3' AND NOT stale ORDER BY occurred_at OFFSET 20 LIMIT 1;
-- Windows starting exactly at a report, and ending exactly at one.
INSERT INTO windows (since, until, kind)
SELECT occurred_at, occurred_at + interval '20 days', 'starts at a report'
  FROM status_history.history WHERE object_id = 'q-2' AND NOT stale ORDER BY occurred_at OFFSET 30 LIMIT 1;
INSERT INTO windows (since, until, kind)
SELECT occurred_at - interval '20 days', occurred_at, 'ends at a report'
  FROM status_history.history WHERE object_id = 'q-2' AND NOT stale ORDER BY occurred_at OFFSET 40 LIMIT 1;
SELECT count(*) AS windows FROM windows;

-- The brute force is not vacuous: most windows hold periods, and some start
-- before since (the period in force at since).
SELECT count(DISTINCT w) FILTER (WHERE p.object_id IS NOT NULL) > 30 AS windows_with_periods,
       count(*) FILTER (WHERE p.started_at = windows.since) > 30 AS periods_in_force_at_since
  FROM windows LEFT JOIN LATERAL brute_periods(windows.since, windows.until) AS p ON true;

-- ---------------------------------------------------------------------------
-- history_of(): every object's rows in the window, in stamp order, stale ones too.
-- ---------------------------------------------------------------------------
SELECT count(*) AS history_of_mismatches
  FROM windows, (SELECT DISTINCT object_id FROM status_history.history) AS o
 WHERE (SELECT array_agg(x) FROM status_history.history_of(o.object_id, windows.since, windows.until) AS x)
       IS DISTINCT FROM
       (SELECT array_agg(h ORDER BY h.occurred_at) FROM status_history.history AS h
         WHERE h.object_id = o.object_id AND h.occurred_at >= windows.since
           AND h.occurred_at < windows.until);
-- NULL bounds are unbounded; stale rows are returned and marked.
SELECT (SELECT count(*) FROM status_history.history_of('q-1'))
         = (SELECT count(*) FROM status_history.history WHERE object_id = 'q-1') AS all_rows,
       (SELECT count(*) FROM status_history.history_of('q-1', until => '2020-06-01'))
         = (SELECT count(*) FROM status_history.history WHERE object_id = 'q-1'
             AND occurred_at < '2020-06-01') AS no_start,
       (SELECT count(*) FROM status_history.history_of('q-1', since => '2020-06-01'))
         = (SELECT count(*) FROM status_history.history WHERE object_id = 'q-1'
             AND occurred_at >= '2020-06-01') AS no_end,
       (SELECT count(*) FILTER (WHERE stale) FROM status_history.history_of('q-1')) > 0 AS stale_marked,
       (SELECT count(*) FROM status_history.history_of('no-such-object')) AS unknown_object;

-- ---------------------------------------------------------------------------
-- intervals(): every object and window equals brute force (both ways), and
-- periods are in order and contiguous.
-- ---------------------------------------------------------------------------
SELECT count(*) AS intervals_mismatches
  FROM windows, (SELECT DISTINCT object_id FROM status_history.history) AS o,
       LATERAL (SELECT count(*) AS n FROM (
                    (SELECT * FROM status_history.intervals(o.object_id, windows.since, windows.until)
                     EXCEPT ALL
                     SELECT status, started_at, ended_at, duration, replica_id, error
                       FROM brute_periods(windows.since, windows.until) AS b WHERE b.object_id = o.object_id)
                    UNION ALL
                    (SELECT status, started_at, ended_at, duration, replica_id, error
                       FROM brute_periods(windows.since, windows.until) AS b WHERE b.object_id = o.object_id
                     EXCEPT ALL
                     SELECT * FROM status_history.intervals(o.object_id, windows.since, windows.until))) AS d
               ) AS x
 WHERE x.n > 0;
SELECT count(*) AS out_of_order
  FROM windows, (SELECT DISTINCT object_id FROM status_history.history) AS o,
       LATERAL (SELECT i.started_at, i.ended_at, i.status,
                       lag(i.ended_at) OVER (ORDER BY n) AS prev_end,
                       lag(i.status) OVER (ORDER BY n) AS prev_status
                  FROM status_history.intervals(o.object_id, windows.since, windows.until)
                       WITH ORDINALITY AS i(status, started_at, ended_at, duration, replica_id, error, n)) AS p
 WHERE p.started_at < windows.since OR p.ended_at > least(windows.until, now())
    OR p.ended_at <= p.started_at OR p.started_at <> coalesce(p.prev_end, p.started_at)
    OR p.status = p.prev_status;

-- ---------------------------------------------------------------------------
-- time_in_status(): all objects and listed ones equal brute force; shares of
-- an object add up to the part of the window it had a status in.
-- ---------------------------------------------------------------------------
CREATE FUNCTION time_mismatches(since timestamptz, until timestamptz, ids text[]) RETURNS bigint
LANGUAGE sql STABLE AS $$
    WITH f AS (SELECT * FROM status_history.time_in_status(since, until, ids)),
         b AS (SELECT * FROM brute_time(since, until) AS b WHERE ids IS NULL OR b.object_id = ANY (ids))
    SELECT (SELECT count(*) FROM (SELECT object_id, status, duration FROM f
                                  EXCEPT ALL SELECT object_id, status, duration FROM b) AS x)
         + (SELECT count(*) FROM (SELECT object_id, status, duration FROM b
                                  EXCEPT ALL SELECT object_id, status, duration FROM f) AS x)
         + (SELECT count(*) FROM f JOIN b USING (object_id, status)
             WHERE NOT (abs(f.share - b.share) < 1e-9 OR (f.share IS NULL AND b.share IS NULL)))
$$;
SELECT count(*) FILTER (WHERE time_mismatches(since, until, NULL) > 0) AS all_objects_mismatches,
       count(*) FILTER (WHERE time_mismatches(since, until, ARRAY['q-3', 'q-5', NULL, 'q-3', 'no-such']) > 0)
           AS listed_mismatches
  FROM windows;
SELECT count(*) AS shares_over_one
  FROM windows, LATERAL (SELECT object_id, sum(share) AS total
                           FROM status_history.time_in_status(windows.since, windows.until)
                          GROUP BY object_id) AS s
 WHERE s.total > 1 + 1e-9;
-- Rows come sorted by object, then status in the order of the status list.
SELECT array_agg(object_id ORDER BY n) = array_agg(object_id ORDER BY object_id COLLATE "C", n) AS sorted_by_object
  FROM status_history.time_in_status('2020-01-01', '2021-01-01') WITH ORDINALITY AS t(object_id, status, duration, share, n);
-- No objects: an empty list; an unbounded start leaves the share NULL.
SELECT count(*) AS empty_list FROM status_history.time_in_status('2020-01-01', '2021-01-01', '{}');
SELECT count(*) > 0 AS rows, bool_and(share IS NULL) AS share_null
  FROM status_history.time_in_status('-infinity', '2020-06-01');

-- A small history, by hand: the run in force at since started before it
-- (replica r1, error e1) and a later report of that run (r2) does not
-- change its replica or error.
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, error) VALUES
    ('2021-01-01 00:00:00+00', 'hand', 'running', 'r1', 'e1'),
    ('2021-01-01 01:00:00+00', 'hand', 'running', 'r2', NULL),
    ('2021-01-01 02:00:00+00', 'hand', 'stalled', 'r2', 'e2'),
    ('2021-01-01 03:00:00+00', 'hand', 'running', 'r2', NULL);
SELECT array_agg(format('%s %s %s %s %s', status, started_at AT TIME ZONE 'UTC',
                        duration, replica_id, error) ORDER BY started_at) AS periods
  FROM status_history.intervals('hand', '2021-01-01 01:30:00+00', '2021-01-01 03:30:00+00');
SELECT status, duration, share
  FROM status_history.time_in_status('2021-01-01 01:30:00+00', '2021-01-01 03:30:00+00', ARRAY['hand']);

-- ---------------------------------------------------------------------------
-- Index-driven: one object's window is read through the index, not by a scan
-- of the history.  The counters are this backend's not yet reported ones:
-- report them first (at idle), so that each transaction shows its own alone.
-- ---------------------------------------------------------------------------
-- (Statistics taken now, as autovacuum may take them at any time -- under
-- valgrind it does, mid-test -- and the plans follow them.)
ANALYZE status_history.history;
-- (The thresholds are counted first: a count in the checking query itself would add its own fetches.)
SELECT count(*) / 4 AS q6_quarter FROM status_history.history WHERE object_id = 'q-6' \gset
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT count(*) AS in_window FROM status_history.history_of('q-6', '2020-05-01', '2020-05-20');
SELECT seq_scan AS seq_scans, idx_tup_fetch AS rows_fetched
  FROM pg_stat_xact_user_tables WHERE relid = 'status_history.history'::regclass;
COMMIT;
SELECT pg_stat_force_next_flush();
BEGIN;
SELECT count(*) > 0 AS periods FROM status_history.intervals('q-6', '2020-05-01', '2020-05-20');
SELECT seq_scan AS seq_scans,
       idx_tup_fetch < :q6_quarter AS few_rows_fetched
  FROM pg_stat_xact_user_tables WHERE relid = 'status_history.history'::regclass;
COMMIT;
SELECT pg_stat_force_next_flush();
BEGIN;
-- (time_in_status: no full scan.  How many rows its per-object probes read
-- depends on the plan statistics choose: with few objects a probe may walk
-- the primary key backwards, with many it takes the object index.)
SELECT count(*) > 0 AS totals FROM status_history.time_in_status('2020-05-01', '2020-05-20');
SELECT seq_scan AS seq_scans,
       idx_scan > 0 AS by_index
  FROM pg_stat_xact_user_tables WHERE relid = 'status_history.history'::regclass;
COMMIT;

-- ---------------------------------------------------------------------------
-- Errors: 22023 for until < since, 22004 for a NULL where one is required.
-- ---------------------------------------------------------------------------
\set SHOW_CONTEXT never
SELECT * FROM status_history.history_of('q-1', '2020-02-01', '2020-01-01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.intervals('q-1', '2020-02-01', '2020-01-01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.time_in_status('infinity', '-infinity');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.history_of(NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.intervals(NULL, '2020-01-01', '2020-02-01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.intervals('q-1', NULL, '2020-02-01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.intervals('q-1', '2020-01-01', NULL);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.time_in_status(NULL, '2020-02-01');
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM status_history.time_in_status('2020-01-01', NULL);
\echo :LAST_ERROR_SQLSTATE
\set SHOW_CONTEXT errors

-- PUBLIC may ask.
CREATE ROLE sh_questions_nobody;
SET ROLE sh_questions_nobody;
SELECT (SELECT count(*) FROM status_history.history_of('hand')) AS history_of,
       (SELECT count(*) FROM status_history.intervals('hand', '2021-01-01', '2021-01-02')) AS intervals,
       (SELECT count(*) FROM status_history.time_in_status('2021-01-01', '2021-01-02', ARRAY['hand'])) AS time_in_status;
RESET ROLE;
DROP ROLE sh_questions_nobody;

DROP FUNCTION time_mismatches(timestamptz, timestamptz, text[]);
DROP FUNCTION brute_time(timestamptz, timestamptz);
DROP FUNCTION brute_periods(timestamptz, timestamptz);
DROP EXTENSION status_history;
