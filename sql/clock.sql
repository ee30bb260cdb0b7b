-- The clock: unique, increasing, at or after clock_timestamp(), and only in
-- writable transactions.
CREATE EXTENSION status_history;

-- 10000 stamps in one statement: all distinct and strictly increasing.
WITH s AS (
    SELECT i, status_history.monotonic_now() AS t FROM generate_series(1, 10000) AS i
), d AS (
    SELECT t, lag(t) OVER (ORDER BY i) AS prev FROM s
)
SELECT count(*) AS stamps,
       count(DISTINCT t) AS distinct_stamps,
       count(*) FILTER (WHERE t <= prev) AS not_increasing
  FROM d;
-- Never behind the system clock (clock_timestamp() is read first).
SELECT clock_timestamp() <= status_history.monotonic_now() AS at_or_after_clock;
-- Later than every stamp in the table.
SELECT occurred_at < status_history.monotonic_now() AS after_table
  FROM status_history.report('c1', 'running');

-- The persisted bound is ahead of every stamp handed out.
SELECT status_history.monotonic_now() AS stamp \gset
SELECT last_value >= (extract(epoch FROM :'stamp'::timestamptz - '2000-01-01 00:00:00+00') * 1000000)::bigint
       AS bound_ahead
  FROM status_history.clock_bound;

-- ... and kept at least half a second ahead: a stamp that comes closer raises
-- it early (so that concurrent stampers do not all wait for one WAL flush when
-- it is reached).  Stamps for 1.2 seconds, longer than the bound's lead.
DO $$
DECLARE
    t0 timestamptz := clock_timestamp();
    s timestamptz;
    gap bigint;
    min_gap bigint := NULL;
BEGIN
    WHILE clock_timestamp() < t0 + interval '1.2 seconds' LOOP
        s := status_history.monotonic_now();
        SELECT last_value - (extract(epoch FROM s - '2000-01-01 00:00:00+00') * 1000000)::bigint
          INTO gap FROM status_history.clock_bound;
        min_gap := LEAST(min_gap, gap);
    END LOOP;
    RAISE NOTICE 'bound at least half a second ahead of every stamp: %', min_gap >= 500000;
END
$$;

-- Read-only transactions cannot take stamps (the clock persists its bound).
BEGIN READ ONLY;
SELECT status_history.monotonic_now();
ROLLBACK;
BEGIN READ ONLY;
SELECT status_history.report('c1', 'running');
ROLLBACK;
-- ... but may read.
BEGIN READ ONLY;
SELECT object_id, status FROM status_history.statuses;
SELECT object_id, status FROM status_history.latest();
ROLLBACK;

DROP EXTENSION status_history;
