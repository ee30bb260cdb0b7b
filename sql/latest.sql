-- latest() and the statuses view: agreement with brute force after a random
-- workload, status_since, argument handling, and index lookups.
CREATE EXTENSION status_history;

-- A random workload: 4000 reports on 60 objects from 3 replicas with mixed
-- generations, drops and reconnects at rising generations.
SELECT setseed(0.42);
DO $$
DECLARE
    statuses text[] := ARRAY['starting', 'running', 'paused', 'stalled', 'ceased', 'dropped'];
    gen bigint := 0;
BEGIN
    FOR i IN 1 .. 4000 LOOP
        IF i % 500 = 0 THEN
            COMMIT;  -- reconnect() runs first in its transaction
            gen := gen + 1;
            PERFORM status_history.reconnect(gen, CASE WHEN i % 1000 = 0 THEN 'rep-1' END);
        END IF;
        PERFORM status_history.report(
            'obj-' || floor(random() * 60)::int,
            -- dropped is rare, so most objects stay live
            statuses[CASE WHEN random() < 0.01 THEN 6 ELSE 1 + floor(random() * 5)::int END],
            CASE WHEN random() < 0.2 THEN 'error ' || i END,
            CASE WHEN random() < 0.2 THEN jsonb_build_object('hints', jsonb_build_array('h' || i)) END,
            'rep-' || floor(random() * 3)::int,
            greatest(gen - floor(random() * 2)::int, 0));
    END LOOP;
END
$$;
SELECT count(*) AS reports, count(*) FILTER (WHERE stale) > 0 AS some_stale,
       count(DISTINCT object_id) AS objects
  FROM status_history.history;

-- Brute force: newest non-stale row per object.
CREATE TEMP VIEW brute AS
SELECT DISTINCT ON (object_id) *
  FROM status_history.history
 WHERE NOT stale
 ORDER BY object_id, occurred_at DESC;

SELECT (SELECT count(*) FROM (SELECT * FROM status_history.latest(include_dropped => true)
                              EXCEPT SELECT * FROM brute) AS x) AS only_in_latest,
       (SELECT count(*) FROM (SELECT * FROM brute
                              EXCEPT SELECT * FROM status_history.latest(include_dropped => true)) AS x) AS only_in_brute,
       (SELECT count(*) FROM status_history.latest(include_dropped => true))
         = (SELECT count(*) FROM brute) AS same_count;
-- Without include_dropped, dropped objects are left out, and the view agrees.
SELECT (SELECT count(*) FROM status_history.latest())
         = (SELECT count(*) FROM brute WHERE status <> 'dropped') AS latest_live,
       (SELECT count(*) FROM (SELECT object_id, status, error, details, replica_id, generation, occurred_at
                                FROM status_history.statuses
                              EXCEPT
                              SELECT object_id, status, error, details, replica_id, generation, occurred_at
                                FROM brute WHERE status <> 'dropped') AS x) AS view_mismatches;

-- status_since is the stamp of the first report of the current unbroken run.
WITH ns AS (
    SELECT object_id, occurred_at, status,
           lag(status) OVER (PARTITION BY object_id ORDER BY occurred_at) AS prev
      FROM status_history.history WHERE NOT stale
), runs AS (
    SELECT object_id, max(occurred_at) AS since
      FROM ns WHERE prev IS DISTINCT FROM status GROUP BY object_id
)
SELECT count(*) AS since_mismatches
  FROM status_history.statuses AS s JOIN runs USING (object_id)
 WHERE s.status_since <> runs.since;

-- Listed objects: unknown ids, duplicates and NULLs are ignored.
SELECT object_id FROM status_history.latest(ARRAY['obj-1', 'obj-1', NULL, 'no-such']);
SELECT count(*) FROM status_history.latest('{}');
SELECT count(*) FROM status_history.latest(ARRAY[NULL]::text[]);
SELECT * FROM status_history.latest(NULL, NULL);

-- One object's status through the view is a primary-key lookup.
EXPLAIN (COSTS OFF) SELECT * FROM status_history.statuses WHERE object_id = 'obj-1';
SELECT (SELECT status FROM status_history.statuses WHERE object_id = 'obj-1')
       IS NOT DISTINCT FROM
       (SELECT status FROM brute WHERE object_id = 'obj-1' AND status <> 'dropped') AS lookup_agrees;

-- status_since moves only when the status changes.
SELECT stale FROM status_history.report('since', 'running', generation => 8);
CREATE TEMP TABLE first_run AS SELECT occurred_at FROM status_history.statuses WHERE object_id = 'since';
SELECT stale FROM status_history.report('since', 'running', error => 'slow', generation => 8);
SELECT s.status_since = f.occurred_at AS since_kept, s.occurred_at > f.occurred_at AS newer_report
  FROM status_history.statuses s, first_run f WHERE s.object_id = 'since';
SELECT stale FROM status_history.report('since', 'stalled', generation => 8);
SELECT status_since = occurred_at AS since_moved FROM status_history.statuses WHERE object_id = 'since';

-- A list is one-dimensional.
SELECT * FROM status_history.latest('{{a}}');
SELECT * FROM status_history.time_in_status('-infinity', 'infinity', '{{a}}');

DROP VIEW brute;
DROP EXTENSION status_history;
