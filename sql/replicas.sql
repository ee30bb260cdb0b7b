-- Replicas: per-key state, reconnect(generation, replica_id) through it,
-- and retire_replica().  Stamps are compared, never printed.
CREATE EXTENSION status_history;
\i sql/oracle.psql

-- a: r1 running, then r2 stalled (current).  b: only r2.  c: r2, then r1 (current).
SELECT count(*) FROM status_history.report('a', 'running', replica_id => 'r1', generation => 1);
SELECT count(*) FROM status_history.report('a', 'stalled', error => 'lag', replica_id => 'r2', generation => 1);
SELECT count(*) FROM status_history.report('b', 'running', replica_id => 'r2', generation => 1);
SELECT count(*) FROM status_history.report('c', 'starting', replica_id => 'r2', generation => 1);
SELECT count(*) FROM status_history.report('c', 'running', replica_id => 'r1', generation => 1);
SELECT object_id, coalesce(replica_id, '-') AS replica, status FROM status_history.replica_statuses
 ORDER BY object_id, replica_id;
SELECT object_id, replica_id, status FROM status_history.statuses ORDER BY object_id;

-- reconnect(generation, replica_id) re-stamps the replica's own newest report
-- (a controller's copy: the replica's last_seen_at does not move).
CREATE TEMP TABLE seen_before AS
SELECT object_id, last_seen_at FROM status_history.replica_state WHERE replica_id = 'r1';
SELECT object_id, status, replica_id, generation FROM status_history.reconnect(2, 'r1') ORDER BY object_id;
SELECT k.object_id, k.last_at > b.last_seen_at AS copy_is_newest_row, k.last_seen_at = b.last_seen_at AS seen_unchanged
  FROM status_history.replica_state k JOIN seen_before b USING (object_id)
 WHERE k.replica_id = 'r1' ORDER BY 1;
SELECT object_id, replica_id, status, fence FROM status_history.statuses ORDER BY object_id;
SELECT count(*) FROM status_history.report('a', 'stalled', error => 'lag', replica_id => 'r2', generation => 2);

-- Retiring r2: a shows r1's newest report again (re-stamped, newest row),
-- b has no live key left (paused, no replica, a hint), c is not r2's.
SELECT max(occurred_at) AS before_retire FROM status_history.history \gset
SELECT status_history.retire_replica('r2') AS changed;
SELECT object_id, coalesce(replica_id, '-') AS replica, status, error, details, generation,
       occurred_at > :'before_retire' AS restamped
  FROM status_history.statuses ORDER BY object_id;
SELECT count(*) AS rows_appended FROM status_history.history WHERE occurred_at > :'before_retire';
SELECT replica_id, retired_at IS NOT NULL AS retired FROM status_history.floors WHERE replica_id = 'r2';
SELECT object_id, replica_id, status, retired FROM status_history.replica_statuses
 WHERE replica_id IN ('r1', 'r2') ORDER BY object_id, replica_id;
-- Its reports are stale from now on, whatever their generation.
SELECT status, stale FROM status_history.report('a', 'running', replica_id => 'r2', generation => 100);
SELECT object_id, replica_id, status FROM status_history.statuses WHERE object_id = 'a';
-- It does not come back: reconnect() refuses it, retiring again is a no-op.
\set VERBOSITY default
SELECT * FROM status_history.reconnect(100, 'r2');
SELECT * FROM status_history.reconnect(100, 'r2', ARRAY['a']);
\set VERBOSITY terse
-- A restored floor row merges its retirement too: a dump taken after the
-- replica was retired, restored over a database where it is live with a
-- higher floor, keeps the higher floor and the retirement.
SELECT count(*) AS copies FROM status_history.reconnect(3, 'retired-in-dump');
INSERT INTO status_history.floors VALUES ('retired-in-dump', 0, '2026-01-01 00:00+00');
SELECT replica_id, generation, retired_at FROM status_history.floors WHERE replica_id = 'retired-in-dump';
SELECT status, stale FROM status_history.report('z9', 'running', replica_id => 'retired-in-dump', generation => 50);
SELECT status_history.retire_replica('r2') AS again;
-- An unknown replica is not an error (and is retired from then on).
SELECT status_history.retire_replica('never-seen') AS unknown;

-- With a generation: the rows it appends carry it, and it must not be below a fence.
SELECT count(*) FROM status_history.report('d', 'running', replica_id => 'r3', generation => 2);
SELECT count(*) FROM status_history.report('d', 'stalled', replica_id => 'r4', generation => 2);
SELECT count(*) FROM status_history.reconnect(3, object_ids => ARRAY['d']);
\set VERBOSITY default
SELECT status_history.retire_replica('r4', 2);
\set VERBOSITY terse
SELECT status_history.retire_replica('r4', 7) AS changed;
SELECT object_id, replica_id, status, generation FROM status_history.statuses WHERE object_id = 'd';
-- Without one, a copy keeps its generation, raised to the fence when below it.
SELECT count(*) FROM status_history.report('e', 'running', replica_id => 'r5', generation => 1);
SELECT count(*) FROM status_history.report('e', 'paused', replica_id => 'r6', generation => 1);
SELECT count(*) FROM status_history.reconnect(4, object_ids => ARRAY['e']);
SELECT status_history.retire_replica('r6') AS changed;
SELECT object_id, replica_id, status, generation, fence FROM status_history.statuses WHERE object_id = 'e';

-- Dropped objects keep their tombstone.
SELECT count(*) FROM status_history.report('f', 'running', replica_id => 'r7');
SELECT count(*) FROM status_history.report('f', 'dropped', replica_id => 'r7');
SELECT status_history.retire_replica('r7') AS changed;
SELECT status FROM status_history.latest(ARRAY['f'], true);

-- A report needs a replica id that can be fenced and retired: NULL or non-empty.
SELECT status_history.report('a', 'running', replica_id => '');

-- Another BEFORE trigger that changes the report: the state follows the stored
-- row, and report() returns it as stored.
CREATE FUNCTION other_replica() RETURNS trigger LANGUAGE plpgsql AS
$$BEGIN NEW.replica_id := 'r9'; NEW.error := 'rewritten'; NEW.generation := 9; RETURN NEW; END$$;
CREATE TRIGGER zz_other_replica BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION other_replica();
SELECT replica_id, error, generation FROM status_history.report('t', 'running', replica_id => 'r1', generation => 3);
SELECT replica_id, error, generation FROM status_history.report('t', 'stalled', replica_id => 'r1', generation => 3);
DROP TRIGGER zz_other_replica ON status_history.history;
DROP FUNCTION other_replica();
SELECT object_id, replica_id, status, error, generation FROM status_history.statuses WHERE object_id = 't';
SELECT state_mismatches();

-- Ids that make a long notification payload: the report is stored (the payload is cut).
SELECT length(object_id), status FROM status_history.report(repeat('"', 4000), 'running', replica_id => repeat(E'\x01', 3000));
SELECT length(object_id), status FROM status_history.report(repeat('x', 9000), 'running', replica_id => repeat('r', 9000));

-- Bad input, and who may call it.
SELECT status_history.retire_replica(NULL);
SELECT status_history.retire_replica('');
SELECT status_history.retire_replica('x', -1);
BEGIN;
SELECT count(*) FROM status_history.report('g', 'running');
SELECT status_history.retire_replica('x');
ROLLBACK;
CREATE ROLE sh_replicas_reader;
SET ROLE sh_replicas_reader;
SELECT status_history.retire_replica('x');
SELECT count(*) > 0 AS can_read FROM status_history.replica_statuses;
RESET ROLE;
DROP ROLE sh_replicas_reader;

SELECT state_mismatches();

-- Random replicas, reports, reconnects and retirements: the per-key state
-- equals brute force per (object_id, replica_id) (the oracle), no retired
-- replica's report is non-stale after its retirement, and no object's
-- current report comes from a retired replica unless it is dropped.
SELECT setseed(0.17);
DO $$
DECLARE top bigint := 10;
BEGIN
    FOR n IN 1..600 LOOP
        IF random() < 0.05 THEN
            top := top + 1;
            PERFORM count(*) FROM status_history.reconnect(top, 'q' || floor(random() * 6)::int,
                                                          ARRAY['z' || floor(random() * 8)::int]);
        ELSE
            PERFORM status_history.report('z' || floor(random() * 8)::int,
                (ARRAY['starting', 'running', 'stalled', 'paused'])[1 + floor(random() * 4)::int],
                replica_id => (ARRAY['q0', 'q1', 'q2', 'q3', 'q4', 'q5', NULL])[1 + floor(random() * 7)::int],
                generation => top - floor(random() * 2)::int);
        END IF;
    END LOOP;
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    RAISE EXCEPTION 'unexpected: %', SQLERRM;
END $$;
SELECT status_history.retire_replica('q1') AS changed_q1;
SELECT status_history.retire_replica('q4') AS changed_q4;
DO $$
BEGIN
    FOR n IN 1..200 LOOP
        PERFORM status_history.report('z' || floor(random() * 8)::int,
            (ARRAY['starting', 'running', 'stalled', 'paused'])[1 + floor(random() * 4)::int],
            replica_id => (ARRAY['q0', 'q1', 'q2', 'q3', 'q4', 'q5', NULL])[1 + floor(random() * 7)::int],
            generation => 20);
    END LOOP;
END $$;
SELECT state_mismatches();
SELECT count(*) AS live_rows_of_retired FROM status_history.history h
  JOIN status_history.floors f ON f.replica_id = h.replica_id
 WHERE f.retired_at IS NOT NULL AND h.occurred_at > f.retired_at AND NOT h.stale;
SELECT count(*) AS current_from_retired FROM status_history.statuses s
  JOIN status_history.floors f ON f.replica_id = s.replica_id WHERE f.retired_at IS NOT NULL;

-- The floors a backend keeps across transactions are bounded in bytes, not
-- only in replicas: replica ids have no length limit (50 ids of 100 kB each
-- would keep 5 MB).
DO $$ BEGIN
    FOR i IN 1..50 LOOP
        PERFORM status_history.report('long-' || i, 'running', replica_id => repeat('x', 100000) || i);
    END LOOP;
END $$;
SELECT sum(total_bytes) < 2 * 1024 * 1024 AS kept_floors_bounded
  FROM pg_backend_memory_contexts WHERE name = 'status_history floors';

DROP EXTENSION status_history;
