-- Heartbeats without growth: a report that repeats its key's newest row
-- appends no row and moves the key's last_seen_at; the per-key state
-- (replica_state, replica_statuses).  Stamps are compared, never printed.
CREATE EXTENSION status_history;
\i sql/oracle.psql

-- A repeat appends no row; report() returns the row it repeats.
SELECT occurred_at AS first_at FROM status_history.report('hb', 'running', replica_id => 'r1') \gset
SELECT occurred_at = :'first_at' AS same_row, status, stale
  FROM status_history.report('hb', 'running', replica_id => 'r1');
SELECT count(*) AS rows FROM status_history.history WHERE object_id = 'hb';
-- ... and moves last_seen_at past the row's stamp.
SELECT replica_id, status, occurred_at = :'first_at' AS current_is_first,
       last_at = :'first_at' AS last_is_first, last_seen_at > :'first_at' AS seen_later
  FROM status_history.replica_statuses WHERE object_id = 'hb';
-- A plain INSERT of a repeat inserts nothing and raises nothing (INSERT 0 0).
WITH i AS (INSERT INTO status_history.history (object_id, status, replica_id)
           VALUES ('hb', 'running', 'r1') RETURNING 1)
SELECT count(*) AS inserted FROM i;

-- Any difference in status, error, details or generation is a new row;
-- details compare as jsonb (key order does not matter).
SELECT status, error, details, generation, occurred_at > :'first_at' AS new_row
  FROM status_history.report('hb', 'running', error => 'slow', replica_id => 'r1');
SELECT occurred_at AS slow_at FROM status_history.history
 WHERE object_id = 'hb' ORDER BY occurred_at DESC LIMIT 1 \gset
SELECT occurred_at = :'slow_at' AS repeat_of_slow
  FROM status_history.report('hb', 'running', error => 'slow', replica_id => 'r1');
SELECT occurred_at > :'slow_at' AS new_row
  FROM status_history.report('hb', 'running', error => 'slow', details => '{"a": 1, "b": 2}', replica_id => 'r1');
SELECT occurred_at AS d_at FROM status_history.history
 WHERE object_id = 'hb' ORDER BY occurred_at DESC LIMIT 1 \gset
SELECT occurred_at = :'d_at' AS repeat_despite_key_order
  FROM status_history.report('hb', 'running', error => 'slow', details => '{"b": 2, "a": 1}', replica_id => 'r1');
SELECT occurred_at > :'d_at' AS new_row_generation
  FROM status_history.report('hb', 'running', error => 'slow', details => '{"a": 1, "b": 2}', replica_id => 'r1', generation => 1);
-- Keys are (object_id, replica_id): the same report from another replica,
-- or without one, is a row of its own key.
SELECT replica_id, occurred_at > :'d_at' AS new_row
  FROM status_history.report('hb', 'running', error => 'slow', details => '{"a": 1, "b": 2}', replica_id => 'r2', generation => 1);
SELECT replica_id IS NULL AS null_key, occurred_at > :'d_at' AS new_row
  FROM status_history.report('hb', 'running', error => 'slow', details => '{"a": 1, "b": 2}', generation => 1);
SELECT count(*) AS null_key_repeat_rows_before FROM status_history.history WHERE object_id = 'hb' AND replica_id IS NULL;
SELECT stale FROM status_history.report('hb', 'running', error => 'slow', details => '{"a": 1, "b": 2}', generation => 1);
SELECT count(*) AS null_key_rows_after FROM status_history.history WHERE object_id = 'hb' AND replica_id IS NULL;
SELECT coalesce(replica_id, '(null)') AS key, status, error, generation
  FROM status_history.replica_statuses WHERE object_id = 'hb' ORDER BY replica_id NULLS FIRST;

-- Repeats inside one statement: only the first of a run is a row.
WITH i AS (INSERT INTO status_history.history (object_id, status, replica_id)
           VALUES ('multi', 'starting', 'r1'), ('multi', 'starting', 'r1'),
                  ('multi', 'running', 'r1'), ('multi', 'running', 'r1'),
                  ('multi', 'starting', 'r1') RETURNING status)
SELECT string_agg(status, ',') AS inserted FROM i;

-- The README's scenario: the old deployment's stalled after the new one's
-- running becomes current, although the old one said stalled before.
SELECT status, replica_id FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT status, replica_id FROM status_history.report('s1', 'running', replica_id => 'r-new', generation => 2);
SELECT status, replica_id, stale FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT status, replica_id FROM status_history.statuses WHERE object_id = 's1';
SELECT count(*) AS s1_rows FROM status_history.history WHERE object_id = 's1';

-- A stale writer repeating its stale status adds no rows either.
SELECT count(*) AS copies FROM status_history.reconnect(2, object_ids => ARRAY['s1']);
SELECT status, stale FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT count(*) AS s1_rows FROM status_history.history WHERE object_id = 's1';
SELECT status, stale FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT status, stale FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT count(*) AS s1_rows_unchanged FROM status_history.history WHERE object_id = 's1';
SELECT status, replica_id FROM status_history.statuses WHERE object_id = 's1';

-- reconnect() always appends its copies, even when they equal what they copy.
SELECT count(*) AS copies FROM status_history.reconnect(3, object_ids => ARRAY['s1']);
SELECT count(*) AS copies FROM status_history.reconnect(3, object_ids => ARRAY['s1']);
SELECT count(*) AS s1_rows_two_more FROM status_history.history WHERE object_id = 's1';

-- A rolled-back repeat leaves last_seen_at as it was.
SELECT last_seen_at AS seen_before FROM status_history.replica_statuses
 WHERE object_id = 'hb' AND replica_id = 'r2' \gset
BEGIN;
SAVEPOINT s;
SELECT stale FROM status_history.report('hb', 'running', error => 'slow', details => '{"a": 1, "b": 2}', replica_id => 'r2', generation => 1);
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT last_seen_at = :'seen_before' AS seen_unchanged FROM status_history.replica_statuses
 WHERE object_id = 'hb' AND replica_id = 'r2';

-- Imports (occurred_at supplied by the owner) are always rows.
SELECT status_history.monotonic_now() AS t0 \gset
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, stale)
VALUES (:'t0'::timestamptz - interval '1 hour', 'imp', 'running', 'r1', false),
       (:'t0'::timestamptz - interval '59 minutes', 'imp', 'running', 'r1', false);
SELECT count(*) AS imported_rows FROM status_history.history WHERE object_id = 'imp';

-- deduplicate = off records every report.
SET status_history.deduplicate = off;
SELECT status FROM status_history.report('hb', 'running', replica_id => 'off');
SELECT status FROM status_history.report('hb', 'running', replica_id => 'off');
SELECT count(*) AS rows_with_dedup_off FROM status_history.history WHERE object_id = 'hb' AND replica_id = 'off';
RESET status_history.deduplicate;
SELECT status FROM status_history.report('hb', 'running', replica_id => 'off');
SELECT count(*) AS no_more_rows FROM status_history.history WHERE object_id = 'hb' AND replica_id = 'off';

SELECT state_mismatches();

-- The rule against brute force on a random workload: before each report,
-- SQL over the history predicts whether it is a repeat (equal to its key's
-- newest row, stale flag included, and -- unless stale -- to the object's
-- current report); the report must append a row exactly when it is not.
-- Reconnects and drops make stale rows; every report goes through report().
SELECT setseed(0.42);
CREATE TEMP TABLE verdicts (n int, predicted boolean, appended boolean);
DO $$
DECLARE
    o text; r text; st text; e text; d jsonb; g bigint; top bigint := 0;
    before bigint; after bigint; newest status_history.history; cur status_history.history;
    will_be_stale boolean; rep boolean; row_back status_history.history;
BEGIN
    FOR n IN 1..1500 LOOP
        IF random() < 0.03 THEN
            top := top + 1;
            -- (With a list: a reconnect without one is refused after reports in the same transaction.)
            PERFORM status_history.reconnect(top, CASE WHEN random() < 0.5 THEN 'a' END,
                                             ARRAY['k' || (1 + floor(random() * 4))::int]);
            CONTINUE;
        END IF;
        o := 'k' || (1 + floor(random() * 4))::int;
        r := (ARRAY['a', 'b', NULL])[1 + floor(random() * 3)::int];
        st := (ARRAY['running', 'running', 'stalled', 'paused', 'dropped'])[1 + floor(random() * (CASE WHEN random() < 0.01 THEN 5 ELSE 4 END))::int];
        e := (ARRAY[NULL, 'e1'])[1 + floor(random() * 2)::int];
        d := (ARRAY[NULL, '{"x": 1}', '{"x": 2}'])[1 + floor(random() * 3)::int]::jsonb;
        g := greatest(top - floor(random() * 2)::int, 0);
        SELECT * INTO newest FROM status_history.history
         WHERE object_id = o AND replica_id IS NOT DISTINCT FROM r ORDER BY occurred_at DESC LIMIT 1;
        -- Half the time, say again what the key said last (a candidate repeat).
        IF newest.occurred_at IS NOT NULL AND random() < 0.5 THEN
            st := newest.status; e := newest.error; d := newest.details; g := newest.generation;
        END IF;
        SELECT * INTO cur FROM status_history.history
         WHERE object_id = o AND NOT stale ORDER BY occurred_at DESC LIMIT 1;
        -- Stale: below the object's fence or a floor, or after a drop.
        will_be_stale := g < coalesce((SELECT o2.fence FROM status_history.objects o2 WHERE o2.object_id = o), 0)
                      OR g < (SELECT max(generation) FROM status_history.floors
                               WHERE replica_id IS NULL OR replica_id = r)
                      OR coalesce(cur.status = 'dropped', false);
        rep := coalesce(newest.occurred_at IS NOT NULL
               AND newest.status = st AND newest.error IS NOT DISTINCT FROM e
               AND newest.details IS NOT DISTINCT FROM d AND newest.generation = g
               AND newest.stale = will_be_stale
               AND (will_be_stale OR (cur.status = st AND cur.error IS NOT DISTINCT FROM e
                                      AND cur.details IS NOT DISTINCT FROM d AND cur.generation = g)), false);
        SELECT count(*) INTO before FROM status_history.history;
        row_back := status_history.report(o, st, e, d, r, g);
        SELECT count(*) INTO after FROM status_history.history;
        INSERT INTO verdicts VALUES (n, rep, after > before);
        IF rep AND row_back.occurred_at IS DISTINCT FROM newest.occurred_at THEN
            RAISE EXCEPTION 'report % returned another row than the one it repeats', n;
        END IF;
    END LOOP;
END $$;
SELECT count(*) FILTER (WHERE predicted) > 100 AS many_repeats,
       count(*) FILTER (WHERE NOT predicted) > 100 AS many_rows,
       count(*) FILTER (WHERE predicted = appended) AS wrong_verdicts
  FROM verdicts;
SELECT count(*) FILTER (WHERE stale) > 0 AS some_stale_rows FROM status_history.history;
SELECT state_mismatches();

-- Settings made before the library is loaded (a new session) are kept.
\c
SET status_history.deduplicate = off;
SET status_history.notify = on;
SELECT status_history.monotonic_now() IS NOT NULL AS loaded;
SHOW status_history.deduplicate;
SHOW status_history.notify;

DROP EXTENSION status_history;
