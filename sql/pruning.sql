-- The state rows' pages are pruned once their free space runs low
-- (src/lock.c), not at every report: every update of an object's row and
-- of its key's row must still be HOT (the new version on the same page,
-- no index entry), and the pages must not grow.  1 000 reports, each its
-- own transaction, on 10 objects: 100 updates of each row, far more than a
-- page holds without pruning.
CREATE EXTENSION status_history;
SET status_history.deduplicate = off;

CREATE PROCEDURE many_reports(n int) LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        PERFORM status_history.report('o' || (i % 10), (ARRAY['running', 'stalled'])[1 + i % 2],
                                      replica_id => 'r1');
        COMMIT;
    END LOOP;
END $$;

CALL many_reports(10);
SELECT pg_stat_force_next_flush();
CREATE TEMP TABLE before AS
    SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_all_tables
     WHERE schemaname = 'status_history' AND relname IN ('objects', 'replica_state');

CALL many_reports(1000);
SELECT pg_stat_force_next_flush();

SELECT t.relname, t.n_tup_upd - b.n_tup_upd AS updated,
       t.n_tup_hot_upd - b.n_tup_hot_upd AS hot,
       pg_relation_size(t.relid) / current_setting('block_size')::int AS pages
  FROM pg_stat_all_tables AS t JOIN before AS b USING (relname)
 WHERE t.schemaname = 'status_history'
 ORDER BY t.relname;

-- Every report is there, and the state is the newest report per object.
SELECT count(*) AS reports FROM status_history.history;
SELECT count(*) AS objects_matching
  FROM status_history.statuses AS s
  JOIN LATERAL (SELECT h.occurred_at FROM status_history.history AS h
                 WHERE h.object_id = s.object_id ORDER BY h.occurred_at DESC LIMIT 1) AS n
    ON n.occurred_at = s.occurred_at;

DROP PROCEDURE many_reports(int);
DROP EXTENSION status_history;
