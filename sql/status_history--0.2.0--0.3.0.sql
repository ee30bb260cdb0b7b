-- status_history upgrade script, 0.2.0 to 0.3.0.
--
-- Brings a 0.2.0 installation to exactly what sql/status_history.sql installs
-- as 0.3.0 (test/t/005_upgrade.pl compares the two catalogs and checks that the
-- data and per-object state survive).  Same rules as the install script:
-- schema-qualify every name and operator, pin search_path on every function,
-- and back-fill any new per-object state from the history.

\echo Use "ALTER EXTENSION status_history UPDATE TO '0.3.0'" to load this file. \quit

-- @@ per-key state (keys)

-- @@ retention (prune)

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

