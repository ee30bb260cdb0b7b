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

