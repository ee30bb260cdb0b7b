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
-- stamp, one object's reports in stamp order), a per-object row laid out as
-- status_history.objects (same columns, primary key, fillfactor) and a
-- per-key row laid out as replica_state, written by hand_report() below.
-- bench/run.sh fills them from the extension's tables after the load, so the
-- objects and keys exist and the indexes are as large as the history's.
CREATE TABLE hand_history (LIKE status_history.history INCLUDING DEFAULTS, PRIMARY KEY (occurred_at));
ALTER TABLE hand_history ALTER stale SET DEFAULT false;
CREATE INDEX hand_history_object_idx ON hand_history (object_id, occurred_at DESC);
CREATE TABLE hand_objects (LIKE status_history.objects INCLUDING ALL) WITH (fillfactor = 50);
-- The key state (status_history.replica_state: per (object, replica) its
-- newest row, current report and run) and the floors, laid out the same.
CREATE TABLE hand_keys (LIKE status_history.replica_state INCLUDING ALL) WITH (fillfactor = 50);
CREATE TABLE hand_floors (LIKE status_history.floors INCLUDING ALL);
INSERT INTO hand_floors VALUES (NULL, 0);

-- report()'s work written by hand, as a fair floor (issue 21): a PL/pgSQL
-- function, so every statement's plan is cached per session (as report()'s
-- SPI plans are), doing what report() does for one non-repeating report --
-- read the floors, lock the object's row before taking a stamp (so that one
-- object's stamp order is commit order), stamp from the extension's clock,
-- decide stale, insert the history row (two indexes), update the object's
-- row and the key's row (HOT, as report()'s are; each run of a status kept
-- from the row's old values).  It
-- relies on the object and its key existing (bench/run.sh copies them from
-- the extension's tables after the load); a missing key is inserted.
CREATE FUNCTION hand_report(p_object text, p_status text, p_replica text) RETURNS timestamptz
LANGUAGE plpgsql AS $$
DECLARE
    fl bigint;
    o hand_objects;
    stamp timestamptz;
BEGIN
    SELECT max(f.generation) INTO fl FROM hand_floors AS f
     WHERE f.replica_id IS NULL OR f.replica_id = p_replica;
    SELECT * INTO o FROM hand_objects AS h WHERE h.object_id = p_object FOR NO KEY UPDATE;
    stamp := status_history.monotonic_now();
    INSERT INTO hand_history (occurred_at, object_id, status, replica_id, generation, stale)
    VALUES (stamp, p_object, p_status, p_replica, 0, 0 < o.fence OR 0 < fl);
    UPDATE hand_objects AS h
       SET occurred_at = stamp, status = p_status, error = NULL, details = NULL, replica_id = p_replica,
           generation = 0, reported_at = NULL, lease = NULL, expires_at = NULL, lapse_error = NULL,
           status_since = CASE WHEN o.status = p_status THEN o.status_since ELSE stamp END
     WHERE h.object_id = p_object;
    UPDATE hand_keys AS h
       SET last_at = stamp, last_seen_at = stamp, occurred_at = stamp, status = p_status, expires_at = NULL,
           status_since = CASE WHEN h.status = p_status THEN h.status_since ELSE stamp END
     WHERE h.object_id = p_object AND h.replica_id = p_replica;
    IF NOT FOUND THEN
        INSERT INTO hand_keys VALUES (p_object, p_replica, stamp, stamp, stamp, p_status, stamp, NULL);
    END IF;
    RETURN stamp;
END $$;

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
