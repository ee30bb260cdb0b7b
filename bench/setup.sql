-- Benchmark setup: the extension, and the plain-SQL baseline a user would
-- build by hand -- the same columns, an index on (object_id, occurred_at DESC),
-- stamps from clock_timestamp(), and DISTINCT ON for the latest status.
CREATE EXTENSION status_history;

-- The same columns, NOT NULLs and defaults as the history; no triggers, no
-- unique stamp, one index.
CREATE TABLE plain (LIKE status_history.history INCLUDING DEFAULTS);
-- (The history's stale has no default: its trigger sets it.  The baseline has no trigger.)
ALTER TABLE plain ALTER stale SET DEFAULT false;
CREATE INDEX plain_object_idx ON plain (object_id, occurred_at DESC);

-- A plain table keyed by object, for the primary-key lookup baseline.
CREATE TABLE plain_pk (object_id text PRIMARY KEY, status text NOT NULL, occurred_at timestamptz NOT NULL);

-- The physical work of report() written by hand (figure 1's second
-- baseline): a history with the history's two indexes (the primary key on the
-- stamp, one object's reports in stamp order) and a per-object row laid out as
-- status_history.objects (same columns, primary key, fillfactor), written by
-- one statement: INSERT ... RETURNING in a CTE, and an UPDATE of the object's
-- row from it.  bench/run.sh fills both from the extension's tables after the
-- load, so the objects exist and the indexes are as large as the history's.
CREATE TABLE hand_history (LIKE status_history.history INCLUDING DEFAULTS, PRIMARY KEY (occurred_at));
ALTER TABLE hand_history ALTER stale SET DEFAULT false;
CREATE INDEX hand_history_object_idx ON hand_history (object_id, occurred_at DESC);
CREATE TABLE hand_objects (LIKE status_history.objects INCLUDING ALL) WITH (fillfactor = 50);

CREATE SEQUENCE bench_gen;

-- Median execution time, in milliseconds, of a query run reps times: the
-- executor's own time from EXPLAIN ANALYZE (no planning, no client), with
-- count(*) over the query so that every row is produced but none shipped.
CREATE FUNCTION bench_median_ms(sql text, reps int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    plan json;
    times float8[] := '{}';
BEGIN
    FOR i IN 1 .. reps LOOP
        EXECUTE 'EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) SELECT count(*) FROM (' || sql || ') AS q'
           INTO plan;
        times := times || (plan -> 0 ->> 'Execution Time')::float8;
    END LOOP;
    RETURN (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY t) FROM unnest(times) AS t);
END $$;

-- Median wall time of a statement that changes data (run reps times).
CREATE FUNCTION bench_median_stmt_ms(sql text, reps int) RETURNS float8 LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
    times float8[] := '{}';
BEGIN
    FOR i IN 1 .. reps LOOP
        t0 := clock_timestamp();
        EXECUTE sql;
        times := times || extract(epoch FROM clock_timestamp() - t0) * 1000;
    END LOOP;
    RETURN (SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY t) FROM unnest(times) AS t);
END $$;

-- Wall time, in milliseconds, of a statement run in a subtransaction that is
-- then rolled back, and the rows it affected (a DELETE's row count, or the
-- value a SELECT returns): a destructive statement (prune(), a DELETE) can
-- be timed again on the same data.
CREATE FUNCTION bench_rolled_back_ms(sql text, OUT ms float8, OUT n bigint) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz;
BEGIN
    BEGIN
        t0 := clock_timestamp();
        IF sql ~* '^\s*delete' THEN
            EXECUTE sql;
            GET DIAGNOSTICS n = ROW_COUNT;
        ELSE
            EXECUTE sql INTO n;
        END IF;
        ms := extract(epoch FROM clock_timestamp() - t0) * 1000;
        RAISE EXCEPTION USING ERRCODE = 'P0001', MESSAGE = 'bench: roll back';
    EXCEPTION WHEN raise_exception THEN
        NULL;   -- ms and n keep their values; the statement's work is undone
    END;
END $$;
