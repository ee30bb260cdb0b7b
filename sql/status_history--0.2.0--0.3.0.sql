-- status_history upgrade script, 0.2.0 to 0.3.0.
--
-- Brings a 0.2.0 installation to exactly what sql/status_history.sql installs
-- as 0.3.0 (test/t/005_upgrade.pl compares the two catalogs and checks that the
-- data and per-object state survive).  Same rules as the install script:
-- schema-qualify every name and operator, pin search_path on every function,
-- and back-fill any new per-object state from the history.

\echo Use "ALTER EXTENSION status_history UPDATE TO '0.3.0'" to load this file. \quit

-- The C trigger functions pin no search_path: they resolve no name through
-- it (their SQL runs as the extension owner with search_path pinned), and a
-- SET clause would save and restore settings for every row.
ALTER FUNCTION status_history.history_insert_trigger() RESET search_path;
ALTER FUNCTION status_history.history_statement_trigger() RESET search_path;
ALTER FUNCTION status_history.objects_guard() RESET search_path;
ALTER FUNCTION status_history.history_refuse_change() RESET search_path;
ALTER FUNCTION status_history.restore_merge() RESET search_path;

COMMENT ON FUNCTION status_history.objects_guard() IS
'Before any statement on status_history.objects, floors or replica_state not issued by the extension itself, writes back and forgets the cached per-object state and floors.';
COMMENT ON FUNCTION status_history.restore_merge() IS
'Rows inserted into objects, floors or replica_state by anyone but the extension (a restore) are merged with what exists: fences and floors keep the higher generation, a key keeps the restored last_seen_at.';

-- @@ per-key state (keys)
-- A replica's newest report is found through replica_state now.
DROP INDEX status_history.history_replica_idx;
ALTER TABLE status_history.floors ADD COLUMN retired_at timestamptz;
COMMENT ON COLUMN status_history.floors.retired_at IS
    'When retire_replica() retired the replica: every later report of it is stale, and it never comes back. NULL: live.';
CREATE TABLE status_history.replica_state (
    object_id    text        NOT NULL,
    replica_id   text,
    last_at      timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    occurred_at  timestamptz,
    status       text,
    status_since timestamptz,
    CONSTRAINT replica_state_key UNIQUE NULLS NOT DISTINCT (object_id, replica_id)
) WITH (fillfactor = 50);   -- heartbeats update it in place (HOT)
-- The objects a replica reported on (reconnect(generation, replica_id),
-- retire_replica()); its columns never change, so updates stay HOT.
CREATE INDEX replica_state_replica_idx
    ON status_history.replica_state (replica_id, object_id) WHERE replica_id IS NOT NULL;

COMMENT ON TABLE status_history.replica_state IS
    'One row per key (object_id, replica_id): its newest row, when it last reported (repeats included) and its newest non-stale report. Maintained by the extension only.';
COMMENT ON COLUMN status_history.replica_state.object_id IS 'The object.';
COMMENT ON COLUMN status_history.replica_state.replica_id IS
    'The replica; NULL is the key of the object''s reports without a replica.';
COMMENT ON COLUMN status_history.replica_state.last_at IS
    'Stamp of the key''s newest row in the history, stale or not.';
COMMENT ON COLUMN status_history.replica_state.last_seen_at IS
    'When the key last reported anything: the stamp of its newest row, or later when it repeated that row (a repeat appends no row).';
COMMENT ON COLUMN status_history.replica_state.occurred_at IS
    'Stamp of the key''s newest non-stale report; NULL when it has none.';
COMMENT ON COLUMN status_history.replica_state.status IS 'Status of that report.';
COMMENT ON COLUMN status_history.replica_state.status_since IS
    'Stamp of the first report of the key''s current unbroken run of that status.';

SELECT pg_catalog.pg_extension_config_dump('status_history.replica_state', '');

-- Back-fill: each key's state from the history (brute force, the definition).
-- A 0.2.0 history has no repeats, so last_seen_at is the newest row's stamp.
INSERT INTO status_history.replica_state
    (object_id, replica_id, last_at, last_seen_at, occurred_at, status, status_since)
WITH last AS (
    SELECT object_id, replica_id, pg_catalog.max(occurred_at) AS at
      FROM status_history.history GROUP BY object_id, replica_id
), cur AS (
    SELECT DISTINCT ON (object_id, replica_id) object_id, replica_id, occurred_at, status
      FROM status_history.history WHERE NOT stale
     ORDER BY object_id, replica_id, occurred_at DESC
), ns AS (
    SELECT object_id, replica_id, occurred_at, status,
           pg_catalog.lag(status) OVER (PARTITION BY object_id, replica_id ORDER BY occurred_at) AS prev
      FROM status_history.history WHERE NOT stale
), runs AS (
    SELECT object_id, replica_id, pg_catalog.max(occurred_at) AS since
      FROM ns WHERE prev IS DISTINCT FROM status GROUP BY object_id, replica_id
)
SELECT l.object_id, l.replica_id, l.at, l.at, c.occurred_at, c.status, r.since
  FROM last AS l
  LEFT JOIN cur AS c
    ON c.object_id OPERATOR(pg_catalog.=) l.object_id AND c.replica_id IS NOT DISTINCT FROM l.replica_id
  LEFT JOIN runs AS r
    ON r.object_id OPERATOR(pg_catalog.=) l.object_id AND r.replica_id IS NOT DISTINCT FROM l.replica_id;

CREATE TRIGGER replica_state_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON status_history.replica_state
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.objects_guard();
ALTER TABLE status_history.replica_state ENABLE ALWAYS TRIGGER replica_state_guard;
CREATE TRIGGER replica_state_restore_merge
    BEFORE INSERT ON status_history.replica_state
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.replica_state ENABLE ALWAYS TRIGGER replica_state_restore_merge;

CREATE VIEW status_history.replica_statuses AS
    SELECT k.object_id,
           k.replica_id,
           h.status,
           h.error,
           h.details,
           h.generation,
           k.occurred_at,
           k.status_since,
           h.reported_at,
           k.last_at,
           k.last_seen_at,
           f.retired_at IS NOT NULL AS retired
      FROM status_history.replica_state AS k
      LEFT JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
      LEFT JOIN status_history.floors AS f
        ON f.replica_id OPERATOR(pg_catalog.=) k.replica_id;

COMMENT ON VIEW status_history.replica_statuses IS
    'One row per key (object_id, replica_id): its newest non-stale report, and when it last reported; WHERE object_id = ... is an index lookup.';
COMMENT ON COLUMN status_history.replica_statuses.object_id IS 'The object.';
COMMENT ON COLUMN status_history.replica_statuses.replica_id IS 'The replica (NULL: reports without one).';
COMMENT ON COLUMN status_history.replica_statuses.status IS
    'Status of the key''s newest non-stale report; NULL when it has only stale ones.';
COMMENT ON COLUMN status_history.replica_statuses.error IS 'Error of that report.';
COMMENT ON COLUMN status_history.replica_statuses.details IS 'Details of that report.';
COMMENT ON COLUMN status_history.replica_statuses.generation IS 'Generation of that report.';
COMMENT ON COLUMN status_history.replica_statuses.occurred_at IS 'Stamp of that report.';
COMMENT ON COLUMN status_history.replica_statuses.status_since IS
    'When the key entered that status (first report of its current unbroken run).';
COMMENT ON COLUMN status_history.replica_statuses.reported_at IS 'Reporter clock of that report.';
COMMENT ON COLUMN status_history.replica_statuses.last_at IS
    'Stamp of the key''s newest row, stale or not.';
COMMENT ON COLUMN status_history.replica_statuses.last_seen_at IS
    'When the key last reported anything, repeats included (heartbeats).';
COMMENT ON COLUMN status_history.replica_statuses.retired IS
    'The replica was retired by retire_replica(): its reports are stale and its key no longer counts.';

-- @@ precedence
-- One status per object by precedence, the rule of Materialize's
-- mz_source_statuses (opt-in; statuses and latest() keep "latest report
-- wins"): of each counted key's newest non-stale report, the one of highest
-- precedence dropped > running > stalled > starting > paused > ceased, the
-- newest among equals.  A retired replica's keys count only with a paused
-- report.  One LATERAL probe per object over replica_state_key picks the key;
-- the history is read once per object, by its primary key.
CREATE VIEW status_history.statuses_by_precedence AS
    SELECT o.object_id,
           h.status,
           h.error,
           h.details,
           h.replica_id,
           h.generation,
           h.occurred_at,
           k.status_since,
           h.reported_at,
           o.fence
      FROM status_history.objects AS o
     CROSS JOIN LATERAL (
           SELECT s.occurred_at, s.status_since
             FROM status_history.replica_state AS s
            WHERE s.object_id OPERATOR(pg_catalog.=) o.object_id
              AND s.occurred_at IS NOT NULL
              AND (s.status OPERATOR(pg_catalog.=) 'paused'
                   OR NOT EXISTS (SELECT FROM status_history.floors AS f
                                   WHERE f.replica_id OPERATOR(pg_catalog.=) s.replica_id
                                     AND f.retired_at IS NOT NULL))
            ORDER BY pg_catalog.array_position('{ceased,paused,starting,stalled,running,dropped}'::text[],
                                               s.status) DESC NULLS LAST,
                     s.occurred_at DESC
            LIMIT 1) AS k
      JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
     WHERE h.status OPERATOR(pg_catalog.<>) 'dropped';

COMMENT ON VIEW status_history.statuses_by_precedence IS
    'One status per object by precedence (Materialize''s rule, opt-in): of each live key''s newest non-stale report (a retired replica''s key only when paused), the highest of dropped > running > stalled > starting > paused > ceased, the newest among equals; dropped objects hidden. WHERE object_id = ... is an index lookup.';
COMMENT ON COLUMN status_history.statuses_by_precedence.object_id IS 'The object.';
COMMENT ON COLUMN status_history.statuses_by_precedence.status IS 'Status of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.error IS 'Error of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.details IS 'Details of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.replica_id IS
    'Replica of the chosen report (NULL: a report without one).';
COMMENT ON COLUMN status_history.statuses_by_precedence.generation IS 'Generation of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.occurred_at IS 'Stamp of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.status_since IS
    'When the chosen key entered that status (first report of its current unbroken run).';
COMMENT ON COLUMN status_history.statuses_by_precedence.reported_at IS 'Reporter clock of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.fence IS 'The object''s fence generation.';

CREATE FUNCTION status_history.latest_by_precedence(
    object_ids      text[]  DEFAULT NULL,
    include_dropped boolean DEFAULT false)
RETURNS SETOF status_history.history
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Every object, or (a second branch, so that a list is an index lookup
    -- also under the generic plan a SQL function gets) the listed ones.  The
    -- key is chosen as in statuses_by_precedence, verbatim (a shared view or
    -- function would cost a schema object or a call per object); the
    -- regression test precedence checks both against brute force.
    WITH scope AS (
        SELECT o.object_id FROM status_history.objects AS o
         WHERE object_ids IS NULL
        UNION ALL
        SELECT o.object_id FROM status_history.objects AS o
         WHERE o.object_id OPERATOR(pg_catalog.=) ANY (object_ids)
    )
    SELECT h.*
      FROM scope AS o
     CROSS JOIN LATERAL (
           SELECT s.occurred_at
             FROM status_history.replica_state AS s
            WHERE s.object_id OPERATOR(pg_catalog.=) o.object_id
              AND s.occurred_at IS NOT NULL
              AND (s.status OPERATOR(pg_catalog.=) 'paused'
                   OR NOT EXISTS (SELECT FROM status_history.floors AS f
                                   WHERE f.replica_id OPERATOR(pg_catalog.=) s.replica_id
                                     AND f.retired_at IS NOT NULL))
            ORDER BY pg_catalog.array_position('{ceased,paused,starting,stalled,running,dropped}'::text[],
                                               s.status) DESC NULLS LAST,
                     s.occurred_at DESC
            LIMIT 1) AS k
      JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
     WHERE include_dropped IS TRUE OR h.status OPERATOR(pg_catalog.<>) 'dropped'
$$;

COMMENT ON FUNCTION status_history.latest_by_precedence(text[], boolean) IS
    'For each object (or each listed one), its report chosen by precedence as in statuses_by_precedence; dropped objects only when include_dropped.';
-- As the install script does (REVOKE ALL ... FROM PUBLIC, then GRANT).
REVOKE ALL ON FUNCTION status_history.latest_by_precedence(text[], boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.latest_by_precedence(text[], boolean) TO PUBLIC;
REVOKE ALL ON status_history.statuses_by_precedence FROM PUBLIC;
GRANT SELECT ON status_history.statuses_by_precedence TO PUBLIC;


CREATE FUNCTION status_history.retire_replica(
    replica_id text,
    generation bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'status_history_retire_replica'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.retire_replica(text, bigint) IS
    'Retires a replica for good: its later reports are stale, and every object whose current report it made shows another live replica''s newest report (re-stamped) or paused; returns the number of objects whose status changed.';
REVOKE ALL ON FUNCTION status_history.retire_replica(text, bigint) FROM PUBLIC;

REVOKE ALL ON status_history.replica_state, status_history.replica_statuses FROM PUBLIC;
GRANT SELECT ON status_history.replica_state, status_history.replica_statuses TO PUBLIC;

-- @@ retention (prune)
CREATE FUNCTION status_history.prune(
    keep_last  integer  DEFAULT 5,
    older_than interval DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'status_history_prune'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.prune(integer, interval) IS
    'Removes old history: per object and replica all but the newest keep_last reports, and with older_than also those stamped before now() - older_than; never a key''s newest report, its newest non-stale report, or an object''s current report. Returns the number of rows removed.';

-- Not for PUBLIC: grant EXECUTE to an admin role (README, Keeping the history bounded).
REVOKE ALL ON FUNCTION status_history.prune(integer, interval) FROM PUBLIC;

-- @@ history questions
CREATE FUNCTION status_history.history_of(
    object_id text,
    since     timestamptz DEFAULT NULL,
    until     timestamptz DEFAULT NULL)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_history_of'
LANGUAGE C STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.history_of(text, timestamptz, timestamptz) IS
    'The object''s reports with since <= occurred_at < until (a NULL bound: unbounded), oldest first, stale ones included.';

CREATE FUNCTION status_history.intervals(
    object_id text,
    since     timestamptz,
    until     timestamptz)
RETURNS TABLE (status text, started_at timestamptz, ended_at timestamptz, duration interval,
               replica_id text, error text)
AS 'MODULE_PATHNAME', 'status_history_intervals'
LANGUAGE C STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.intervals(text, timestamptz, timestamptz) IS
    'The object''s current status over [since, least(until, now())) as contiguous periods (a run of non-stale reports of one status each), clipped to the window; replica_id and error are those of the report that started the run.';

CREATE FUNCTION status_history.time_in_status(
    since      timestamptz,
    until      timestamptz,
    object_ids text[] DEFAULT NULL)
RETURNS TABLE (object_id text, status text, duration interval, share double precision)
AS 'MODULE_PATHNAME', 'status_history_time_in_status'
LANGUAGE C STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.time_in_status(timestamptz, timestamptz, text[]) IS
    'Per object (or per listed one) and status, the time spent in that status within [since, least(until, now())) and its share of that window; one pass over the window''s reports.';

-- As the install script does (REVOKE ALL ... FROM PUBLIC, then GRANT), so that
-- the ACLs are the same, entry order included.
REVOKE ALL ON FUNCTION status_history.history_of(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION status_history.intervals(text, timestamptz, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION status_history.time_in_status(timestamptz, timestamptz, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.history_of(text, timestamptz, timestamptz) TO PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.intervals(text, timestamptz, timestamptz) TO PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.time_in_status(timestamptz, timestamptz, text[]) TO PUBLIC;

