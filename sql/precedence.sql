-- One status per object by precedence (statuses_by_precedence,
-- latest_by_precedence()): hand cases, then a random multi-replica workload
-- compared with a brute-force oracle written from the rule.  Stamps are
-- compared, never printed.
CREATE EXTENSION status_history;

-- The rule, straight over the history: each key's newest non-stale row;
-- a retired replica's key only when that row is paused; then per object the
-- highest precedence, the newest among equals.  status_since: the first row
-- of the key's current unbroken run of non-stale rows of that status.  A
-- key whose lease ran out (replica_state.expires_at: its last sighting plus
-- the lease, which the history cannot tell) counts as stalled, with the
-- lapse as its error, and stalled since it ran out.
CREATE FUNCTION precedence_oracle()
RETURNS TABLE (object_id text, status text, error text, details jsonb, replica_id text,
               generation bigint, occurred_at timestamptz, status_since timestamptz,
               reported_at timestamptz, fence bigint, stale boolean, expires_at timestamptz,
               lease interval)
LANGUAGE sql AS $$
    WITH newest_per_key AS (
        SELECT DISTINCT ON (h.object_id, h.replica_id) h.*
          FROM status_history.history AS h
         WHERE NOT h.stale
         ORDER BY h.object_id, h.replica_id, h.occurred_at DESC
    ), per_key AS (
        SELECT n.occurred_at, n.object_id,
               CASE WHEN k.expires_at <= now() THEN 'stalled' ELSE n.status END AS status,
               CASE WHEN k.expires_at <= now()
                    THEN 'lease expired: no report' || COALESCE(' from replica ' || n.replica_id, '')
                         || ' since ' || to_char((k.expires_at - n.lease) AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD HH24:MI:SS.US') || '+00'
                    ELSE n.error END AS error,
               CASE WHEN k.expires_at <= now() THEN NULL ELSE n.details END AS details,
               n.replica_id, n.generation,
               CASE WHEN k.expires_at <= now() THEN k.expires_at ELSE n.reported_at END AS reported_at,
               n.stale,
               CASE WHEN k.expires_at <= now() THEN NULL ELSE n.lease END AS lease,
               k.expires_at, k.expires_at <= now() AND n.status <> 'stalled' AS lapsed_since
          FROM newest_per_key AS n
          JOIN status_history.replica_state AS k
            ON k.object_id = n.object_id AND k.replica_id IS NOT DISTINCT FROM n.replica_id
    ), counted AS (
        SELECT * FROM per_key AS k
         WHERE k.status = 'paused'
            OR NOT EXISTS (SELECT FROM status_history.floors AS f
                            WHERE f.replica_id = k.replica_id AND f.retired_at IS NOT NULL)
    ), chosen AS (
        SELECT DISTINCT ON (c.object_id) c.*
          FROM counted AS c
         ORDER BY c.object_id,
                  CASE c.status WHEN 'dropped' THEN 1 WHEN 'running' THEN 2 WHEN 'stalled' THEN 3
                                WHEN 'starting' THEN 4 WHEN 'paused' THEN 5 WHEN 'ceased' THEN 6 END,
                  c.occurred_at DESC
    ), runs AS (
        SELECT h.object_id, h.replica_id, h.occurred_at, h.status,
               lag(h.status) OVER (PARTITION BY h.object_id, h.replica_id ORDER BY h.occurred_at) AS prev
          FROM status_history.history AS h WHERE NOT h.stale
    )
    SELECT c.object_id, c.status, c.error, c.details, c.replica_id, c.generation, c.occurred_at,
           CASE WHEN c.lapsed_since THEN c.expires_at
                ELSE (SELECT max(r.occurred_at) FROM runs AS r
                       WHERE r.object_id = c.object_id AND r.replica_id IS NOT DISTINCT FROM c.replica_id
                         AND r.prev IS DISTINCT FROM r.status) END,
           c.reported_at, o.fence, c.stale, c.expires_at, c.lease
      FROM chosen AS c JOIN status_history.objects AS o USING (object_id)
$$;

-- Rows of the view and of the function (with and without dropped objects,
-- every object and a list with NULLs, duplicates and unknown ids) that the
-- oracle does not have, and the other way round.
CREATE FUNCTION precedence_mismatches()
RETURNS TABLE (objects bigint, view_extra bigint, view_missing bigint, fn_extra bigint, fn_missing bigint,
               fn_dropped_extra bigint, fn_dropped_missing bigint, list_extra bigint, list_missing bigint)
LANGUAGE sql AS $$
    WITH v AS (
        SELECT * FROM status_history.statuses_by_precedence
    ), ov AS (
        SELECT object_id, status, error, details, replica_id, generation, occurred_at, status_since,
               reported_at, fence, expires_at
          FROM precedence_oracle() WHERE status <> 'dropped'
    ), f AS (
        SELECT * FROM status_history.latest_by_precedence()
    ), fd AS (
        SELECT * FROM status_history.latest_by_precedence(include_dropped => true)
    ), oh AS (
        SELECT occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale,
               lease
          FROM precedence_oracle()
    ), l AS (
        SELECT * FROM status_history.latest_by_precedence(
            ARRAY['z1', NULL, 'z3', 'z1', 'nobody', 'z6', 'z13'], include_dropped => true)
    ), ol AS (
        SELECT * FROM oh WHERE object_id IN ('z1', 'z3', 'z6', 'z13')
    )
    SELECT (SELECT count(*) FROM oh),
           (SELECT count(*) FROM (SELECT * FROM v EXCEPT ALL SELECT * FROM ov) AS a),
           (SELECT count(*) FROM (SELECT * FROM ov EXCEPT ALL SELECT * FROM v) AS a),
           (SELECT count(*) FROM (SELECT * FROM f EXCEPT ALL SELECT * FROM oh WHERE status <> 'dropped') AS a),
           (SELECT count(*) FROM (SELECT * FROM oh WHERE status <> 'dropped' EXCEPT ALL SELECT * FROM f) AS a),
           (SELECT count(*) FROM (SELECT * FROM fd EXCEPT ALL SELECT * FROM oh) AS a),
           (SELECT count(*) FROM (SELECT * FROM oh EXCEPT ALL SELECT * FROM fd) AS a),
           (SELECT count(*) FROM (SELECT * FROM l EXCEPT ALL SELECT * FROM ol) AS a),
           (SELECT count(*) FROM (SELECT * FROM ol EXCEPT ALL SELECT * FROM l) AS a)
$$;

-- Hand cases.
-- p1: rb ceased, then ra paused (current).  p2: ra running, then rb stalled (current).
SELECT count(*) FROM status_history.report('p1', 'ceased', replica_id => 'rb');
SELECT count(*) FROM status_history.report('p1', 'paused', replica_id => 'ra');
SELECT count(*) FROM status_history.report('p2', 'running', replica_id => 'ra');
SELECT count(*) FROM status_history.report('p2', 'stalled', replica_id => 'rb');
-- Latest report wins in statuses; precedence picks paused over ceased, running over stalled.
SELECT object_id, status, replica_id FROM status_history.statuses WHERE object_id IN ('p1', 'p2') ORDER BY 1;
SELECT object_id, status, replica_id FROM status_history.statuses_by_precedence
 WHERE object_id IN ('p1', 'p2') ORDER BY 1;
-- Retiring ra: its paused row still counts (p1), its running does not (p2).
SELECT status_history.retire_replica('ra') AS changed;
SELECT object_id, status, replica_id FROM status_history.statuses WHERE object_id IN ('p1', 'p2') ORDER BY 1;
SELECT object_id, status, replica_id FROM status_history.statuses_by_precedence
 WHERE object_id IN ('p1', 'p2') ORDER BY 1;
-- status_since is the chosen key's.
SELECT p.status_since = k.status_since AS key_since, p.occurred_at = k.occurred_at AS key_stamp
  FROM status_history.statuses_by_precedence AS p
  JOIN status_history.replica_state AS k ON k.object_id = p.object_id AND k.replica_id = 'ra'
 WHERE p.object_id = 'p1';

-- Ties go to the newest: t1 r1 stalled, r2 stalled; then r1 stalled with
-- another error (a new row), then r3 starting (newer, lower precedence).
SELECT count(*) FROM status_history.report('t1', 'stalled', error => 'e1', replica_id => 'r1');
SELECT count(*) FROM status_history.report('t1', 'stalled', error => 'e2', replica_id => 'r2');
SELECT status, error, replica_id FROM status_history.statuses_by_precedence WHERE object_id = 't1';
SELECT count(*) FROM status_history.report('t1', 'stalled', error => 'e3', replica_id => 'r1');
SELECT count(*) FROM status_history.report('t1', 'starting', replica_id => 'r3');
SELECT status, error, replica_id FROM status_history.statuses_by_precedence WHERE object_id = 't1';
SELECT status, error, replica_id FROM status_history.statuses WHERE object_id = 't1';

-- Dropped beats everything: d1 r1 running, r2 stalled, then dropped (a
-- report after it is stale, so dropped is also the newest non-stale report).
SELECT count(*) FROM status_history.report('d1', 'running', replica_id => 'r1');
SELECT count(*) FROM status_history.report('d1', 'stalled', replica_id => 'r2');
SELECT count(*) FROM status_history.report('d1', 'dropped', replica_id => 'r2');
SELECT stale FROM status_history.report('d1', 'running', replica_id => 'r1');
SELECT count(*) AS shown FROM status_history.statuses_by_precedence WHERE object_id = 'd1';
SELECT count(*) AS shown FROM status_history.latest_by_precedence(ARRAY['d1']);
SELECT status, replica_id, stale FROM status_history.latest_by_precedence(ARRAY['d1'], include_dropped => true);
-- A plain dropped object is hidden by both, shown with include_dropped.
SELECT count(*) FROM status_history.report('d2', 'running', replica_id => 'r1');
SELECT count(*) FROM status_history.report('d2', 'dropped');
SELECT count(*) AS shown FROM status_history.statuses_by_precedence WHERE object_id = 'd2';
SELECT object_id, status, replica_id FROM status_history.latest_by_precedence(include_dropped => true)
 WHERE status = 'dropped' ORDER BY 1;
-- A dropped report of a replica retired later is that replica's key, so it
-- no longer counts (the rule; statuses keeps the tombstone): n1 shows the
-- other key's running, n0 (only the retired key) has no row.  Report
-- dropped without a replica_id, as Materialize's controller does, to keep it.
SELECT count(*) FROM status_history.report('n0', 'dropped', replica_id => 'rn');
SELECT count(*) FROM status_history.report('n1', 'running', replica_id => 'r1');
SELECT count(*) FROM status_history.report('n1', 'dropped', replica_id => 'rn');
SELECT status_history.retire_replica('rn') AS changed;
SELECT object_id, status, replica_id FROM status_history.latest(ARRAY['n0', 'n1'], true) ORDER BY 1;
SELECT object_id, status, replica_id FROM status_history.latest_by_precedence(ARRAY['n0', 'n1'], true) ORDER BY 1;
-- An object with only stale reports has no row.
SELECT count(*) FROM status_history.reconnect(5, object_ids => ARRAY['n2']);
SELECT stale FROM status_history.report('n2', 'running', generation => 1);
SELECT count(*) AS rows_for_n2 FROM status_history.latest_by_precedence(ARRAY['n2'], true);
-- A NULL list is every object; an empty list none; NULL include_dropped is false.
SELECT count(*) = (SELECT count(*) FROM status_history.statuses_by_precedence) AS all_objects
  FROM status_history.latest_by_precedence(NULL);
SELECT count(*) AS none FROM status_history.latest_by_precedence('{}');
SELECT count(*) AS no_dropped FROM status_history.latest_by_precedence(ARRAY['d2'], NULL);
SELECT * FROM precedence_mismatches();

-- Random replicas (one without a replica), reports of every status (some
-- dropped), reconnects that fence (stale rows), and retirements between the
-- rounds; the view and the function equal the oracle after each round.
CREATE FUNCTION workload(n integer, live text[], top bigint) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1..n LOOP
        IF random() < 0.05 THEN
            top := top + 1;
            PERFORM count(*) FROM status_history.reconnect(top,
                live[1 + floor(random() * cardinality(live))::int],
                ARRAY['z' || floor(random() * 16)::int]);
        ELSIF random() < 0.2 THEN
            -- z12..z15 only pause and cease: a retired replica's paused row can win there
            PERFORM status_history.report('z' || 12 + floor(random() * 4)::int,
                (ARRAY['paused', 'ceased'])[1 + floor(random() * 2)::int],
                replica_id => (ARRAY['q0', 'q1', 'q2', 'q3', 'q4', 'q5', NULL])[1 + floor(random() * 7)::int],
                generation => top - floor(random() * 2)::int);
        ELSE
            PERFORM status_history.report('z' || floor(random() * 12)::int,
                (ARRAY['starting', 'running', 'running', 'stalled', 'stalled', 'paused', 'ceased',
                       'dropped'])[1 + floor(random() * (CASE WHEN random() < 0.04 THEN 8 ELSE 7 END))::int],
                error => (ARRAY[NULL, 'e1', 'e2'])[1 + floor(random() * 3)::int],
                replica_id => (ARRAY['q0', 'q1', 'q2', 'q3', 'q4', 'q5', NULL])[1 + floor(random() * 7)::int],
                generation => top - floor(random() * 2)::int);
        END IF;
    END LOOP;
END $$;
SELECT setseed(0.42);
SELECT workload(500, ARRAY['q0', 'q1', 'q2', 'q3', 'q4', 'q5'], 10);
SELECT * FROM precedence_mismatches();
SELECT status_history.retire_replica('q1') AS changed_q1;
SELECT status_history.retire_replica('q4', 40) AS changed_q4;
SELECT workload(300, ARRAY['q0', 'q2', 'q3', 'q5'], 40);
SELECT status_history.retire_replica('q2') AS changed_q2;
SELECT workload(200, ARRAY['q0', 'q3', 'q5'], 70);
SELECT * FROM precedence_mismatches();
-- The workload reaches every case: stale rows, retired keys counted (paused)
-- and not, dropped objects, objects where precedence and "latest wins" differ.
SELECT count(*) FILTER (WHERE stale) > 50 AS stale_rows,
       count(DISTINCT object_id) FILTER (WHERE status = 'dropped' AND NOT stale) > 0 AS dropped_objects
  FROM status_history.history WHERE object_id LIKE 'z%';
SELECT count(*) FILTER (WHERE k.status = 'paused') > 0 AS retired_paused_keys,
       count(*) FILTER (WHERE k.status <> 'paused') > 0 AS retired_other_keys
  FROM status_history.replica_state AS k
  JOIN status_history.floors AS f ON f.replica_id = k.replica_id AND f.retired_at IS NOT NULL
 WHERE k.object_id LIKE 'z%' AND k.occurred_at IS NOT NULL;
SELECT count(*) > 0 AS differs_from_latest
  FROM status_history.statuses_by_precedence AS p JOIN status_history.statuses AS s USING (object_id)
 WHERE p.occurred_at <> s.occurred_at;
SELECT count(*) > 0 AS chose_retired_paused
  FROM status_history.statuses_by_precedence AS p
  JOIN status_history.floors AS f ON f.replica_id = p.replica_id AND f.retired_at IS NOT NULL
 WHERE p.object_id LIKE 'z%';

-- WHERE object_id = ... is an index lookup: no sequential scan of the
-- per-key state, the history or the objects, on a history of some size.
SELECT count(*)
  FROM (SELECT array_agg('big' || i % 2000) AS o, array_agg((ARRAY['running', 'stalled', 'paused'])[1 + i % 3]) AS s,
               array_agg('b' || i % 3) AS r
          FROM generate_series(1, 6000) AS i) AS a,
       LATERAL status_history.report_many(a.o, a.s, replica_ids => a.r);
ANALYZE status_history.history, status_history.objects, status_history.replica_state, status_history.floors;
CREATE FUNCTION scans(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE line text; found text[] := '{}';
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
        IF line ~ 'Seq Scan on (history|replica_state|objects)' THEN
            found := found || substring(line from 'Seq Scan on \w+');
        END IF;
    END LOOP;
    RETURN coalesce(array_to_string(found, ', '), '');
END $$;
SELECT scans($$SELECT * FROM status_history.statuses_by_precedence WHERE object_id = 'big7'$$) AS seq_scans;
SELECT status, replica_id FROM status_history.statuses_by_precedence WHERE object_id = 'big7';
SELECT scans($$SELECT * FROM status_history.statuses_by_precedence WHERE object_id IN ('big7', 'big8')$$) AS seq_scans;
-- The function with a list: no sequential scan counted on those tables.
SELECT pg_stat_force_next_flush();
SELECT sum(seq_scan) AS seq_before FROM pg_stat_user_tables
 WHERE relid IN ('status_history.history'::regclass, 'status_history.replica_state'::regclass,
                 'status_history.objects'::regclass) \gset
SELECT status, replica_id FROM status_history.latest_by_precedence(ARRAY['big8']);
SELECT pg_stat_force_next_flush();
SELECT sum(seq_scan) - :seq_before AS seq_scans FROM pg_stat_user_tables
 WHERE relid IN ('status_history.history'::regclass, 'status_history.replica_state'::regclass,
                 'status_history.objects'::regclass);
SELECT * FROM precedence_mismatches();

-- Readable by everyone.
CREATE ROLE sh_precedence_reader;
SET ROLE sh_precedence_reader;
SELECT count(*) > 0 AS can_read FROM status_history.statuses_by_precedence;
SELECT count(*) > 0 AS can_execute FROM status_history.latest_by_precedence();
RESET ROLE;
DROP ROLE sh_precedence_reader;

DROP EXTENSION status_history;
