-- status_history upgrade script, 0.1.0 to 0.2.0.
--
-- Brings a 0.1.0 installation to exactly what sql/status_history.sql installs
-- as 0.2.0 (test/t/005_upgrade.pl compares the two catalogs and checks that the
-- data and per-object state survive).  Same rules as the install script:
-- schema-qualify every name and operator, pin search_path on every function,
-- and back-fill any new per-object state from the history.

\echo Use "ALTER EXTENSION status_history UPDATE TO '0.2.0'" to load this file. \quit

-- Generation floors (reconnect() without an object list fences objects that
-- do not exist yet).  A 0.1.0 install has no floors: the database-wide floor
-- starts at 0, like every object's fence did.
CREATE TABLE status_history.floors (
    replica_id text,
    generation bigint NOT NULL DEFAULT 0,
    CONSTRAINT floors_replica_key UNIQUE NULLS NOT DISTINCT (replica_id)
);
INSERT INTO status_history.floors (replica_id, generation) VALUES (NULL, 0);
COMMENT ON TABLE status_history.floors IS
    'Generation floors raised by reconnect() without an object list; a report below its floor is stale. Maintained by the extension only.';
COMMENT ON COLUMN status_history.floors.replica_id IS
    'The replica the floor applies to; NULL for the database-wide floor.';
COMMENT ON COLUMN status_history.floors.generation IS
    'Reports (of that replica, or any report for the NULL row) below this generation are stale.';
REVOKE ALL ON status_history.floors FROM PUBLIC;
GRANT SELECT ON status_history.floors TO PUBLIC;

-- The write-back no longer needs a statement start: it is written back after
-- the statement, the executor run, and before commit.
DROP TRIGGER history_statement_begin ON status_history.history;
COMMENT ON FUNCTION status_history.history_statement_trigger() IS
    'Writes back the per-object state an INSERT statement changed, once per object rather than once per report.';
DROP FUNCTION status_history.history_prefetch(text[]);

-- SQL on objects other than the extension's own writes back the cache first.
CREATE FUNCTION status_history.objects_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_objects_guard'
LANGUAGE C
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION status_history.objects_guard() IS
    'Before any statement on status_history.objects or floors not issued by the extension itself, writes back and forgets the cached per-object state and floors.';
REVOKE ALL ON FUNCTION status_history.objects_guard() FROM PUBLIC;
CREATE TRIGGER objects_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON status_history.objects
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.objects_guard();
ALTER TABLE status_history.objects ENABLE ALWAYS TRIGGER objects_guard;

-- Batches that cannot deadlock.
CREATE FUNCTION status_history.report_many(
    object_ids  text[],
    statuses    text[],
    errors      text[]        DEFAULT NULL,
    details     jsonb[]       DEFAULT NULL,
    replica_ids text[]        DEFAULT NULL,
    generations bigint[]      DEFAULT NULL,
    reported_at timestamptz[] DEFAULT NULL)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_report_many'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[]) IS
    'Appends a batch of reports (element i of each array is report i) after locking their objects in one fixed order, so that batches never deadlock; returns the stored rows.';
GRANT EXECUTE ON FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[]) TO PUBLIC;

-- reconnect() is written in C now.  CREATE OR REPLACE keeps the function
-- (its OID and its grants to controllers) and swaps the body.
CREATE OR REPLACE FUNCTION status_history.reconnect(
    generation bigint,
    replica_id text   DEFAULT NULL,
    object_ids text[] DEFAULT NULL)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_reconnect'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION status_history.reconnect(bigint, text, text[]) IS
    'Raises the fence of every object in scope to generation (and, without an object list, the database-wide or the replica''s floor) and re-stamps their current status so it sorts last; returns the appended rows.';

-- Dump and restore keep fences and floors: objects and floors are dumped, a
-- restore's rows are merged into what exists, and an import keeps the stale
-- flag it gives (stale has no default: the insert trigger sets it).
ALTER TABLE status_history.history ALTER COLUMN stale DROP DEFAULT;
COMMENT ON COLUMN status_history.history.stale IS
    'True when the report arrived below the object''s fence or a floor, or after it was dropped; a stale report never becomes current. Set by the extension; kept as given only on imports (occurred_at supplied).';
SELECT pg_catalog.pg_extension_config_dump('status_history.objects', '');
SELECT pg_catalog.pg_extension_config_dump('status_history.floors', '');
CREATE FUNCTION status_history.restore_merge()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_restore_merge'
LANGUAGE C
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION status_history.restore_merge() IS
    'Rows inserted into objects or floors by anyone but the extension (a restore) are merged with what exists: fences and floors keep the higher generation.';
REVOKE ALL ON FUNCTION status_history.restore_merge() FROM PUBLIC;
CREATE TRIGGER objects_restore_merge
    BEFORE INSERT ON status_history.objects
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.objects ENABLE ALWAYS TRIGGER objects_restore_merge;
CREATE TRIGGER floors_restore_merge
    BEFORE INSERT ON status_history.floors
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_restore_merge;
CREATE TRIGGER floors_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON status_history.floors
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.objects_guard();
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_guard;
