-- Per-object state is cached for the length of one INSERT statement and
-- written back at its end.  Every way a statement can nest, fail or be rolled
-- back must leave the state equal to a brute-force recomputation.
CREATE EXTENSION status_history;

\i sql/oracle.psql

-- Many reports per object in one statement, with status changes.
INSERT INTO status_history.history (object_id, status, error)
SELECT 'm' || (i % 10), (ARRAY['running', 'running', 'stalled'])[1 + (i / 10) % 3], 'e' || i
  FROM generate_series(1, 1000) AS i;
SELECT state_mismatches() AS after_bulk;

-- Rolled back to a savepoint: the statement's reports and state vanish together.
BEGIN;
INSERT INTO status_history.history (object_id, status) SELECT 'm1', 'paused' FROM generate_series(1, 5);
SAVEPOINT s;
INSERT INTO status_history.history (object_id, status) SELECT 'm1', 'ceased' FROM generate_series(1, 5);
ROLLBACK TO SAVEPOINT s;
INSERT INTO status_history.history (object_id, status) VALUES ('m1', 'starting');
COMMIT;
SELECT status FROM status_history.statuses WHERE object_id = 'm1';
SELECT state_mismatches() AS after_savepoint;

-- A statement that fails halfway inside an exception block: a new object
-- (f1) and an existing one whose status run must continue unbroken (m5).
SELECT status FROM status_history.statuses WHERE object_id = 'm5';
CREATE TEMP TABLE m5_before AS SELECT status_since FROM status_history.statuses WHERE object_id = 'm5';
DO $$
BEGIN
    BEGIN
        INSERT INTO status_history.history (object_id, status)
        SELECT o, CASE WHEN i < 50 THEN 'stalled' ELSE 'bogus' END
          FROM generate_series(1, 50) AS i, unnest(ARRAY['f1', 'm5']) AS o;
    EXCEPTION WHEN invalid_parameter_value THEN
        RAISE NOTICE 'statement failed as expected';
    END;
    INSERT INTO status_history.history (object_id, status) VALUES ('f1', 'paused'), ('m5', 'running');
END
$$;
SELECT object_id, status FROM status_history.statuses WHERE object_id IN ('f1', 'm5') ORDER BY object_id;
SELECT s.status_since = b.status_since AS m5_run_unbroken
  FROM status_history.statuses s, m5_before b WHERE s.object_id = 'm5';
SELECT state_mismatches() AS after_failed_statement;

-- A nested INSERT: the outer statement's rows come from a function that
-- reports on the same objects itself.
CREATE FUNCTION pg_temp.report_and_pass(o text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    PERFORM status_history.report(o, 'stalled');
    RETURN o;
END $$;
INSERT INTO status_history.history (object_id, status)
SELECT pg_temp.report_and_pass('m' || (i % 3)), 'running' FROM generate_series(1, 30) AS i;
SELECT state_mismatches() AS after_nested;

-- reconnect() inside an INSERT: the fence it raises applies to the rows the
-- outer statement inserts afterwards.
INSERT INTO status_history.history (object_id, status, generation)
SELECT r.object_id, 'stalled', 1
  FROM status_history.reconnect(5, object_ids => ARRAY['m3', 'm4']) AS r;
SELECT object_id, status, generation, stale FROM status_history.history
 WHERE object_id IN ('m3', 'm4') AND generation = 1 ORDER BY object_id;
SELECT object_id, status, generation FROM status_history.statuses
 WHERE object_id IN ('m3', 'm4') ORDER BY object_id;
SELECT state_mismatches() AS after_reconnect_inside_insert;

-- COPY fires the statement triggers too.
COPY status_history.history (object_id, status, replica_id) FROM STDIN;
c1	starting	r
c1	running	r
c2	stalled	\N
c1	stalled	r
\.
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'c%' ORDER BY object_id;
SELECT state_mismatches() AS after_copy;

-- An executor stopped early by a row limit (PL/Perl's spi_exec_query with a
-- limit on an INSERT ... RETURNING) stores only the rows it returned, fires
-- no AFTER STATEMENT trigger, and still fires AFTER ROW for every stored
-- row: the state folds exactly those.
CREATE EXTENSION plperl;
CREATE FUNCTION pg_temp.limited_insert(q text, n integer) RETURNS integer LANGUAGE plperl AS $$
    return spi_exec_query($_[0], $_[1])->{processed};
$$;
SELECT pg_temp.limited_insert($q$INSERT INTO status_history.history (object_id, status)
    SELECT 'w' || (i % 4), (ARRAY['running', 'stalled', 'paused'])[1 + i % 3]
      FROM generate_series(1, 40) AS i RETURNING object_id$q$, 6) AS stored;
SELECT count(*) AS rows_stored FROM status_history.history WHERE object_id LIKE 'w%';
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'w%' ORDER BY object_id;
SELECT state_mismatches() AS after_early_stop;
DROP FUNCTION pg_temp.limited_insert(text, integer);
DROP EXTENSION plperl;

-- With room for only 3 objects the cache is written back and forgotten as
-- it fills, and objects seen again are read again.
SET status_history.cache_max_objects = 3;
INSERT INTO status_history.history (object_id, status)
SELECT 'e' || (i % 10), (ARRAY['running', 'stalled', 'stalled', 'paused'])[1 + (i / 10) % 4]
  FROM generate_series(1, 200) AS i;
SELECT state_mismatches() AS after_eviction;
-- reconnect() reads only as many objects ahead as fit.
SELECT count(*) AS restamped FROM status_history.reconnect(7);
SELECT count(*) FILTER (WHERE fence = 7) = count(*) AS all_fenced FROM status_history.objects;
SELECT state_mismatches() AS after_small_reconnect;
-- More objects in one statement than the cache holds (issue 21): each row is
-- folded as it is stored, so every state but those still in use can be
-- written back and dropped: the cache stays at its size (a COPY of millions
-- of objects too).  When entries cannot be dropped, it is shrunk again only
-- once they have doubled -- not at every new object, which made a bulk
-- INSERT or reconnect() over more objects than the cache quadratic (54 s for
-- 600 000 objects).  reconnect() over more objects than the cache locks them
-- all, then does them in parts of half the cache, dropping each part's
-- states after it.  (Each shrink says what it dropped at DEBUG1.)
SET status_history.cache_max_objects = 10;
SET client_min_messages = debug1;
INSERT INTO status_history.history (object_id, status, generation)
SELECT 'big' || i, 'running', 7 FROM generate_series(1, 100) AS i;
SELECT count(*) AS restamped FROM status_history.reconnect(8, object_ids => ARRAY(SELECT 'big' || i FROM generate_series(1, 30) AS i));
RESET client_min_messages;
SELECT count(*) FILTER (WHERE fence = 8) AS fenced, count(*) FILTER (WHERE fence = 7) AS not_fenced
  FROM status_history.objects WHERE object_id LIKE 'big%';
SELECT count(*) AS copies FROM status_history.history WHERE object_id LIKE 'big%' AND generation = 8;
SELECT state_mismatches() AS after_big_statements;
RESET status_history.cache_max_objects;
SET status_history.cache_max_objects = 0;

DROP EXTENSION status_history;
