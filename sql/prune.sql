-- prune(): a random workload with a fixed seed (objects, replicas and the
-- NULL replica, stale reports below a fence, dropped objects with late
-- reports, imported stamps in the past and ahead of the clock, more objects
-- than one batch holds), then prune with several arguments; before each call
-- a brute-force oracle says which rows must remain, and afterwards the
-- history must be exactly those rows, the count returned the rows removed,
-- and the per-object state unchanged.
--
-- In a database of its own: the stamps imported ahead of the clock move this
-- database's clock, and other tests' stamps must not move the counts here.
SELECT current_database() AS regress_db \gset
CREATE DATABASE sh_prune_regress;
\c sh_prune_regress
CREATE EXTENSION status_history;
\set SHOW_CONTEXT never

-- The rule, by brute force (correlated subqueries, no window function): a
-- row stays when it is its key's newest, its key's newest non-stale, its
-- object's current report, or among its key's newest keep_last and not older
-- than now() - older_than.  The key is (object_id, replica_id), NULL a key of its own.
CREATE FUNCTION prune_expected(keep_last int, older_than interval)
RETURNS TABLE (occurred_at timestamptz) LANGUAGE sql AS $$
    SELECT h.occurred_at FROM status_history.history AS h
     WHERE NOT EXISTS (SELECT FROM status_history.history AS k
                        WHERE k.object_id = h.object_id AND k.replica_id IS NOT DISTINCT FROM h.replica_id
                          AND k.occurred_at > h.occurred_at)
        OR (NOT h.stale
            AND NOT EXISTS (SELECT FROM status_history.history AS k
                             WHERE k.object_id = h.object_id AND k.replica_id IS NOT DISTINCT FROM h.replica_id
                               AND NOT k.stale AND k.occurred_at > h.occurred_at))
        OR EXISTS (SELECT FROM status_history.objects AS o
                    WHERE o.object_id = h.object_id AND o.occurred_at = h.occurred_at)
        OR ((SELECT count(*) FROM status_history.history AS k
              WHERE k.object_id = h.object_id AND k.replica_id IS NOT DISTINCT FROM h.replica_id
                AND k.occurred_at > h.occurred_at) < keep_last
            AND (older_than IS NULL OR h.occurred_at >= now() - older_than))
$$;

-- One prune call checked against the oracle, in one transaction (one now()).
CREATE FUNCTION prune_check(keep_last int, older_than interval,
    OUT removed bigint, OUT remaining_as_expected boolean, OUT count_is_removed boolean,
    OUT state_unchanged boolean, OUT current_reports_kept boolean)
LANGUAGE plpgsql AS $$
DECLARE
    before bigint := (SELECT count(*) FROM status_history.history);
BEGIN
    CREATE TEMP TABLE expected AS SELECT * FROM prune_expected(keep_last, older_than);
    CREATE TEMP TABLE objects_before AS SELECT * FROM status_history.objects;
    removed := status_history.prune(keep_last, older_than);
    remaining_as_expected := NOT EXISTS (SELECT occurred_at FROM status_history.history
                                         EXCEPT SELECT occurred_at FROM expected)
                         AND NOT EXISTS (SELECT occurred_at FROM expected
                                         EXCEPT SELECT occurred_at FROM status_history.history);
    count_is_removed := removed = before - (SELECT count(*) FROM status_history.history);
    state_unchanged := NOT EXISTS (SELECT * FROM status_history.objects EXCEPT SELECT * FROM objects_before)
                   AND NOT EXISTS (SELECT * FROM objects_before EXCEPT SELECT * FROM status_history.objects);
    -- latest() still equals brute force over what is left.
    current_reports_kept := NOT EXISTS (
        WITH brute AS (SELECT DISTINCT ON (object_id) * FROM status_history.history
                        WHERE NOT stale ORDER BY object_id, occurred_at DESC),
             kept AS (SELECT * FROM status_history.latest(include_dropped => true))
        (SELECT * FROM kept EXCEPT SELECT * FROM brute)
        UNION ALL
        (SELECT * FROM brute EXCEPT SELECT * FROM kept));
    DROP TABLE expected, objects_before;
END $$;

-- The workload.  Reports from three replicas and the NULL replica, with
-- generations 0 to 2, on six objects.
SELECT setseed(0.42);
CREATE FUNCTION random_reports(n int) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. n LOOP
        PERFORM status_history.report(
            'o' || (1 + floor(random() * 6))::int,
            (ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'])[1 + floor(random() * 5)::int],
            replica_id => (ARRAY['r1', 'r2', 'r3', NULL])[1 + floor(random() * 4)::int],
            generation => floor(random() * 3)::int);
    END LOOP;
END $$;
SELECT random_reports(150);
-- Fences: reports below them from now on are stale.
SELECT count(*) > 0 AS restamped FROM status_history.reconnect(1, object_ids => ARRAY['o1', 'o2', 'o3']);
SELECT random_reports(100);
SELECT count(*) > 0 AS restamped FROM status_history.reconnect(2, 'r1');
SELECT random_reports(100);
-- A dropped object, and late reports after it (stale).
SELECT stale FROM status_history.report('o6', 'dropped', replica_id => 'r2', generation => 2);
SELECT random_reports(50);
-- Imports: old stamps (many per key, so that older_than matters inside
-- keep_last), an object known only from imports, and stamps ahead of the clock.
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
SELECT now() - interval '10 days' + (3 * i + k) * interval '1 minute', o,
       (ARRAY['starting', 'running', 'stalled'])[1 + i % 3], (ARRAY['r1', NULL])[1 + i % 2], 0
  FROM generate_series(1, 12) AS i, unnest(ARRAY['o1', 'o4', 'imp']) WITH ORDINALITY AS u(o, k)
 ORDER BY 1;
SET status_history.max_import_lead = -1;
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
VALUES (now() + interval '3 hours', 'o2', 'stalled', 'r3', 2),
       (now() + interval '3 hours 1 second', 'fut', 'running', NULL, 0),
       (now() + interval '3 hours 2 seconds', 'fut', 'paused', NULL, 0);
RESET status_history.max_import_lead;
SELECT random_reports(50);
-- More objects than one batch (1000 objects) holds, four reports each.
INSERT INTO status_history.history (object_id, status, replica_id)
SELECT 'b' || lpad(i::text, 4, '0'), (ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'])[1 + (i + j) % 5],
       CASE WHEN j % 2 = 0 THEN 'r1' END
  FROM generate_series(1, 4) AS j, generate_series(1, 1500) AS i
 ORDER BY j, i;

-- What the workload made.
SELECT count(*) FILTER (WHERE stale) > 0 AS has_stale,
       count(DISTINCT replica_id) AS replicas, bool_or(replica_id IS NULL) AS has_null_replica,
       count(DISTINCT object_id) AS objects
  FROM status_history.history;
SELECT object_id, status FROM status_history.latest(ARRAY['o6'], include_dropped => true);

-- Prune, each call against the oracle.
SELECT * FROM prune_check(5, NULL);
SELECT * FROM prune_check(5, NULL);   -- nothing left to remove
SELECT (c).remaining_as_expected, (c).count_is_removed, (c).state_unchanged, (c).current_reports_kept
  FROM (SELECT prune_check(3, interval '1 day') AS c) AS x;
SELECT * FROM prune_check(2, NULL);
SELECT random_reports(60);
SELECT (c).remaining_as_expected, (c).count_is_removed, (c).state_unchanged, (c).current_reports_kept
  FROM (SELECT prune_check(2, interval '0') AS c) AS x;
SELECT random_reports(60);
SELECT * FROM prune_check(1, NULL);
-- The protections survive every argument.
SELECT random_reports(30);
SELECT (c).remaining_as_expected, (c).count_is_removed, (c).state_unchanged, (c).current_reports_kept
  FROM (SELECT prune_check(1, interval '0 seconds') AS c) AS x;
-- What is left: per key one row, or two when the newest is stale.
SELECT max(n) AS most_rows_per_key FROM (
    SELECT count(*) AS n FROM status_history.history GROUP BY object_id, replica_id) AS k;
SELECT status_history.prune(keep_last => 1, older_than => '0 seconds') AS removed_again;

-- The dropped object's late report is still stale, and it stays dropped.
SELECT stale FROM status_history.report('o6', 'running', replica_id => 'r2', generation => 5);
SELECT object_id, status FROM status_history.latest(ARRAY['o6'], include_dropped => true);
-- The view and status_since keep working on what is left.
SELECT count(*) AS objects_shown, bool_and(status_since <= occurred_at) AS since_before_current
  FROM status_history.statuses;
SELECT status_history.prune() AS default_arguments;

-- Arguments prune() refuses (22023), with a hint.
SELECT status_history.prune(0);
SELECT status_history.prune(NULL);
SELECT status_history.prune(-3);
SELECT status_history.prune(5, interval '-1 second');
SELECT status_history.prune(5, interval '1 day -25 hours');

-- Direct DELETE and TRUNCATE stay refused, for the owner too.
DELETE FROM status_history.history WHERE object_id = 'o1';
TRUNCATE status_history.history;

-- An owner's trigger on the history that deletes while prune runs is refused,
-- and nothing is removed: the door opens only for prune's own statement.
SELECT random_reports(30);
CREATE TABLE history_count AS SELECT count(*) AS n FROM status_history.history;
CREATE FUNCTION delete_more() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM status_history.history WHERE occurred_at = OLD.occurred_at;
    RETURN OLD;
END $$;
CREATE TRIGGER delete_more BEFORE DELETE ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION delete_more();
SELECT status_history.prune(1);
DROP TRIGGER delete_more ON status_history.history;
-- ... and so is one from a statement trigger that fires before the extension's.
CREATE FUNCTION delete_first() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF pg_trigger_depth() = 1 THEN   -- not again for its own DELETE
        DELETE FROM status_history.history WHERE object_id = 'o1';
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER a_delete_first BEFORE DELETE ON status_history.history
    FOR EACH STATEMENT EXECUTE FUNCTION delete_first();
SELECT status_history.prune(1);
DROP TRIGGER a_delete_first ON status_history.history;
SELECT (SELECT count(*) FROM status_history.history) = n AS nothing_removed FROM history_count;
-- A trigger that only looks is fine.
CREATE FUNCTION count_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE public.history_count SET n = n - 1;   -- prune pins search_path
    RETURN OLD;
END $$;
CREATE TRIGGER count_deleted BEFORE DELETE ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION count_deleted();
SELECT status_history.prune(1) > 0 AS removed_some;
SELECT (SELECT count(*) FROM status_history.history) = n AS trigger_saw_every_row FROM history_count;
DROP TRIGGER count_deleted ON status_history.history;
DELETE FROM status_history.history WHERE false;

-- Not executable by PUBLIC; works once granted.
CREATE ROLE sh_prune_admin;
SET ROLE sh_prune_admin;
SELECT status_history.prune(1);
RESET ROLE;
GRANT EXECUTE ON FUNCTION status_history.prune(integer, interval) TO sh_prune_admin;
SET ROLE sh_prune_admin;
SELECT status_history.prune(1) >= 0 AS granted;
DELETE FROM status_history.history;
RESET ROLE;

-- In a read-only transaction: refused like any write.
BEGIN READ ONLY;
SELECT status_history.prune(1);
ROLLBACK;

-- The SQLSTATEs of the refusals above.
CREATE FUNCTION sqlstate_of(sql text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE sql;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END $$;
SELECT sql, sqlstate_of(sql) FROM (VALUES
    ('SELECT status_history.prune(0)'),
    ('SELECT status_history.prune(NULL)'),
    ('SELECT status_history.prune(1, interval ''-1 day'')'),
    ('DELETE FROM status_history.history'),
    ('TRUNCATE status_history.history'),
    ('SELECT status_history.prune(1, interval ''1 day'')')) AS t(sql);
REVOKE EXECUTE ON FUNCTION status_history.prune(integer, interval) FROM sh_prune_admin;
SET ROLE sh_prune_admin;
SELECT sqlstate_of('SELECT status_history.prune()') AS not_granted;
RESET ROLE;

DROP TABLE history_count;
DROP FUNCTION prune_check(int, interval), prune_expected(int, interval), random_reports(int),
              delete_more(), delete_first(), count_deleted(), sqlstate_of(text);
-- older_than beyond the oldest timestamp: nothing is that old (no error).
SELECT status_history.prune(1, older_than => interval '1000000 years') >= 0 AS far_enough;
DROP EXTENSION status_history;
DROP ROLE sh_prune_admin;
\c :regress_db
DROP DATABASE sh_prune_regress;
