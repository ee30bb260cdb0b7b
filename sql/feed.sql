-- The change feed: stable_horizon() and changes().  One session here (the
-- isolation spec feed.spec has the concurrent cases, test/t/011_feed.pl a
-- load with prepared transactions and a crash).  Stamps are compared, never
-- printed.
CREATE EXTENSION status_history;

SELECT count(*) FROM status_history.report('a', 'running', replica_id => 'r1');
SELECT count(*) FROM status_history.report('b', 'stalled', replica_id => 'r1');
SELECT count(*) FROM status_history.reconnect(2);
SELECT count(*) FROM status_history.report('a', 'paused', replica_id => 'r1', generation => 2);

-- Every committed row is below the horizon; it never goes back.
SELECT status_history.stable_horizon() AS h1 \gset
SELECT :'h1'::timestamptz > (SELECT max(occurred_at) FROM status_history.history) AS above_every_row;
SELECT status_history.stable_horizon() >= :'h1'::timestamptz AS never_back;

-- changes(): every row after the position, in stamp order, at most max_rows.
SELECT object_id, status, generation FROM status_history.changes();
SELECT count(*) AS first_two FROM status_history.changes(max_rows => 2);
SELECT (SELECT occurred_at FROM status_history.changes(max_rows => 2) ORDER BY occurred_at DESC LIMIT 1) AS pos \gset
SELECT object_id, status FROM status_history.changes(:'pos');
SELECT count(*) AS none_after_the_last FROM status_history.changes((SELECT max(occurred_at) FROM status_history.history));
-- The loop a consumer runs sees every row once, in order.
CREATE TEMP TABLE got (LIKE status_history.history);
DO $$
DECLARE n bigint;
BEGIN
    LOOP
        INSERT INTO got SELECT * FROM status_history.changes((SELECT max(occurred_at) FROM got), 1);
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n = 0;
    END LOOP;
END $$;
SELECT (SELECT count(*) FROM got) AS got, (SELECT count(*) FROM status_history.history) AS history,
       (SELECT count(*) FROM (SELECT * FROM got EXCEPT SELECT * FROM status_history.history) AS d) AS differ;

-- A transaction's own stamps hold its horizon too: its rows may roll back.
BEGIN;
SELECT occurred_at AS mine FROM status_history.report('c', 'running') \gset
SELECT status_history.stable_horizon() <= :'mine'::timestamptz AS held_by_my_row;
SELECT count(*) AS not_mine_yet FROM status_history.changes() WHERE object_id = 'c';
ROLLBACK;
SELECT count(*) AS gone FROM status_history.changes() WHERE object_id = 'c';

-- A stamp from monotonic_now() is no row: it holds nothing up.
BEGIN;
SELECT status_history.monotonic_now() AS stamp \gset
SELECT status_history.stable_horizon() > :'stamp'::timestamptz AS not_held;
COMMIT;

-- Bad arguments.
\set VERBOSITY sqlstate
SELECT * FROM status_history.changes(max_rows => 0);
SELECT * FROM status_history.changes(max_rows => NULL);
\set VERBOSITY default
SELECT * FROM status_history.changes(max_rows => 0);

-- An import below a horizon already given out is refused (55000): a
-- consumer may be past it.  Above it, an import is held like a report.
\set VERBOSITY sqlstate
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (:'h1'::timestamptz - interval '1 hour', 'old', 'running');
\set VERBOSITY default
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (clock_timestamp() + interval '1 second', 'ahead', 'running');
SELECT object_id FROM status_history.changes((SELECT max(occurred_at) FROM got));
-- status_history.import_below_horizon lets a superuser import anyway.
SET status_history.import_below_horizon = on;
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (:'h1'::timestamptz - interval '1 hour', 'old', 'running');
RESET status_history.import_below_horizon;
CREATE ROLE sh_feed_nobody;
SET ROLE sh_feed_nobody;
\set VERBOSITY sqlstate
SET status_history.import_below_horizon = on;
\set VERBOSITY default
RESET ROLE;

-- prune(): a consumer behind the newest row it removed may have lost rows:
-- changes() from there fails (55000), unless skip_pruned.
SELECT count(*) FROM status_history.report('a', 'running', replica_id => 'r1', generation => 2);
SELECT count(*) FROM status_history.report('a', 'stalled', replica_id => 'r1', generation => 2);
SELECT status_history.prune(1) > 0 AS pruned;
SELECT pruned_through IS NOT NULL AS recorded FROM status_history.feed;
\set VERBOSITY sqlstate
SELECT count(*) FROM status_history.changes();
\set VERBOSITY default
SELECT count(*) > 0 AS read_on FROM status_history.changes(skip_pruned => true);
SELECT count(*) > 0 AS from_after_it_is_fine
  FROM status_history.changes((SELECT pruned_through FROM status_history.feed));

-- Readers may follow the feed: PUBLIC, until grant_roles(..., public_reads => false)
-- (changes() reads the history as its caller; stable_horizon() is everyone's).
SET ROLE sh_feed_nobody;
SELECT count(*) > 0 AS public_reads FROM status_history.changes(skip_pruned => true);
RESET ROLE;
SELECT status_history.grant_roles(public_reads => false);
SET ROLE sh_feed_nobody;
\set VERBOSITY sqlstate
SELECT count(*) FROM status_history.changes(skip_pruned => true);
\set VERBOSITY default
SELECT status_history.stable_horizon() IS NOT NULL AS everyones;
RESET ROLE;
DROP ROLE sh_feed_nobody;
DROP EXTENSION status_history;
