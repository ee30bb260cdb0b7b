-- status_history upgrade script, 0.3.0 to 0.4.0.
--
-- Brings a 0.3.0 installation to exactly what sql/status_history.sql installs
-- as 0.4.0 (test/t/005_upgrade.pl compares the two catalogs and checks that the
-- data and per-object state survive).  Same rules as the install script:
-- schema-qualify every name and operator, pin search_path on every function,
-- and back-fill any new per-object state from the history.

\echo Use "ALTER EXTENSION status_history UPDATE TO '0.4.0'" to load this file. \quit

-- @@ stored rows decide (the write path)
-- The per-object state is folded from each row as stored (an AFTER ROW
-- trigger) instead of being written back after each statement from what the
-- insert trigger saw.  The state itself is unchanged.
DROP TRIGGER history_statement_end ON status_history.history;
DROP FUNCTION status_history.history_statement_trigger();
CREATE FUNCTION status_history.history_fold_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_fold_trigger'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_fold_trigger() IS
    'Folds each stored report into its object''s state, and writes the state back once no stored report of the object waits to be folded.';
CREATE TRIGGER history_fold
    AFTER INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION status_history.history_fold_trigger();
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_fold;
COMMENT ON FUNCTION status_history.history_insert_trigger() IS
    'Validates a report, serializes it per object, stamps it, and decides from stored reports whether it is stale (fenced) or a repeat.';
-- Not for PUBLIC, as every function of a fresh install but the granted ones.
REVOKE ALL ON FUNCTION status_history.history_fold_trigger() FROM PUBLIC;

-- @@ versions: the library serves the SQL objects of its own version only
-- (every upgrade script ends by replacing versions(), see the install script).
CREATE OR REPLACE FUNCTION status_history.versions(OUT library text, OUT extension text)
RETURNS record
AS 'MODULE_PATHNAME', 'status_history_versions'
LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.versions() IS
    'The version of the loaded status_history library, and of the extension installed in this database; they must be equal.';
REVOKE ALL ON FUNCTION status_history.versions() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.versions() TO PUBLIC;
