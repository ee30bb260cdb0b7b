-- status_history install script.
--
-- `make` copies this file to status_history--<version>.sql, the version being
-- the one in status_history.control.  Every name is schema-qualified and every
-- function pins search_path, so a hostile search_path at CREATE EXTENSION time
-- or at call time cannot redirect anything.

\echo Use "CREATE EXTENSION status_history" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The schema must be the extension's alone.  PostgreSQL installs into a
-- status_history schema that exists already: one a database owner created
-- (or may create in) could hold functions that shadow ours for callers, and
-- that role could change what the extension runs with its owner's rights.
-- @@ schema guard (every upgrade script checks the same)
-- ---------------------------------------------------------------------------
DO $$
DECLARE
    owner_is_superuser boolean;
    creators text;
    foreign_objects text[];
BEGIN
    SELECT r.rolsuper,
           (SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                             ELSE a.grantee::pg_catalog.regrole::text END, ', ')
              FROM pg_catalog.aclexplode(n.nspacl) AS a
             WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
               AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner)
      INTO owner_is_superuser, creators
      FROM pg_catalog.pg_namespace AS n JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'status_history';
    IF NOT owner_is_superuser OR creators IS NOT NULL THEN
        RAISE EXCEPTION 'schema status_history is not the extension''s alone'
            USING ERRCODE = '42501',
                  DETAIL = CASE WHEN NOT owner_is_superuser THEN 'Its owner is not a superuser.'
                           ELSE pg_catalog.format('CREATE on it is granted to %s.', creators) END,
                  HINT = 'Let CREATE EXTENSION create the schema: drop the one that exists (after checking what is in it), or give it to a superuser and revoke CREATE from everyone else.';
    END IF;
    WITH nsp AS (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'status_history'),
        ext AS (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'status_history'),
        member AS (SELECT d.classid, d.objid FROM pg_catalog.pg_depend AS d, ext
                    WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                      AND d.refobjid OPERATOR(pg_catalog.=) ext.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'),
        objs AS (
          SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass AS classid, p.oid AS objid FROM pg_catalog.pg_proc AS p, nsp WHERE p.pronamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid FROM pg_catalog.pg_operator AS o, nsp WHERE o.oprnamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_class AS c, nsp WHERE c.relnamespace OPERATOR(pg_catalog.=) nsp.oid AND c.relkind OPERATOR(pg_catalog.<>) ALL (ARRAY['i', 'I', 't', 'c']::pg_catalog."char"[])
          UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid FROM pg_catalog.pg_type AS t, nsp WHERE t.typnamespace OPERATOR(pg_catalog.=) nsp.oid AND t.typrelid OPERATOR(pg_catalog.=) 0
                AND NOT EXISTS (SELECT FROM pg_catalog.pg_type AS e WHERE e.oid OPERATOR(pg_catalog.=) t.typelem AND e.typrelid OPERATOR(pg_catalog.<>) 0)
          UNION ALL SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_collation AS c, nsp WHERE c.collnamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_conversion AS c, nsp WHERE c.connamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, f.oid FROM pg_catalog.pg_opfamily AS f, nsp WHERE f.opfnamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_extension'::pg_catalog.regclass, e.oid FROM pg_catalog.pg_extension AS e, nsp WHERE e.extnamespace OPERATOR(pg_catalog.=) nsp.oid AND e.extname OPERATOR(pg_catalog.<>) 'status_history'
        )
        SELECT pg_catalog.array_agg(pg_catalog.pg_describe_object(o.classid, o.objid, 0)) FROM objs AS o
         WHERE NOT EXISTS (SELECT FROM member AS m WHERE m.classid OPERATOR(pg_catalog.=) o.classid AND m.objid OPERATOR(pg_catalog.=) o.objid) INTO foreign_objects;
    IF foreign_objects IS NOT NULL THEN
        RAISE EXCEPTION 'schema status_history holds objects that are not the extension''s'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Not the extension''s: %s.', pg_catalog.array_to_string(foreign_objects, ', ')),
                  HINT = 'They could shadow the extension''s functions for its callers: drop them (after checking what they do), then try again.';
    END IF;
END
$$;


-- ---------------------------------------------------------------------------
-- The history: one row per report, never updated or deleted.
-- ---------------------------------------------------------------------------
CREATE TABLE status_history.history (
    occurred_at timestamptz NOT NULL,
    object_id   text        NOT NULL,
    status      text        NOT NULL,
    error       text,
    details     jsonb,
    replica_id  text,
    generation  bigint      NOT NULL DEFAULT 0,
    reported_at timestamptz,
    stale       boolean     NOT NULL,   -- set by the insert trigger unless imported
    lease       interval,               -- NULL: the status holds until the next report
    CONSTRAINT history_pkey PRIMARY KEY (occurred_at)
);
-- The one secondary index: one object's reports in stamp order (recomputing
-- its state, prune(), history_of(), intervals(), time_in_status()).  A
-- replica's newest report is found through status_history.replica_state.
CREATE INDEX history_object_idx
    ON status_history.history (object_id, occurred_at DESC);

COMMENT ON TABLE status_history.history IS
    'Append-only history of status reports; rows are stamped by status_history.monotonic_now() and never change.';
COMMENT ON COLUMN status_history.history.occurred_at IS
    'Stamp from the database clock (status_history.monotonic_now()); unique, and the only ordering of reports.';
COMMENT ON COLUMN status_history.history.object_id IS
    'The object reported on (a source, sink, job or connector); never empty.';
COMMENT ON COLUMN status_history.history.status IS
    'One of starting, running, paused, stalled, ceased, dropped.';
COMMENT ON COLUMN status_history.history.error IS
    'Error text that came with the report, if any.';
COMMENT ON COLUMN status_history.history.details IS
    'Free-form details, e.g. {"hints": [...], "namespaced": {...}}.';
COMMENT ON COLUMN status_history.history.replica_id IS
    'The replica or deployment that reported; NULL for an object-wide event.';
COMMENT ON COLUMN status_history.history.generation IS
    'The reporter''s fence generation; a report below the object''s fence is recorded as stale.';
COMMENT ON COLUMN status_history.history.reported_at IS
    'The reporter''s own clock; informational, never used for ordering.';
COMMENT ON COLUMN status_history.history.lease IS
    'How long the status holds unless its key reports again (a repeat renews it); past it, readers show the key stalled and expire() records that. Positive, in days, hours, minutes and seconds (a day is 24 hours; stored as hours). NULL: no lease.';
COMMENT ON COLUMN status_history.history.stale IS
    'True when the report arrived below the object''s fence or a floor, or after it was dropped; a stale report never becomes current. Set by the extension; kept as given only on imports (occurred_at supplied).';

-- ---------------------------------------------------------------------------
-- Per-object state: the fence and a copy of the current report.  Written only
-- by the insert trigger and reconnect(); it is what makes "current status of
-- every object" cost one row per object rather than a pass over the history.
-- ---------------------------------------------------------------------------
CREATE TABLE status_history.objects (
    object_id    text   NOT NULL PRIMARY KEY,
    fence        bigint NOT NULL DEFAULT 0,
    occurred_at  timestamptz,
    status       text,
    error        text,
    details      jsonb,
    replica_id   text,
    generation   bigint,
    reported_at  timestamptz,
    status_since timestamptz,
    lease        interval,
    expires_at   timestamptz,
    lapse_error  text
) WITH (fillfactor = 50);   -- room on the page, so the frequent updates stay HOT

COMMENT ON TABLE status_history.objects IS
    'One row per object: its fence generation and a copy of its newest non-stale report. Maintained by the extension only.';
COMMENT ON COLUMN status_history.objects.object_id IS 'The object.';
COMMENT ON COLUMN status_history.objects.fence IS
    'Fence generation raised by reconnect(); reports below it are stale.';
COMMENT ON COLUMN status_history.objects.occurred_at IS
    'Stamp of the current report; NULL while the object has no non-stale report.';
COMMENT ON COLUMN status_history.objects.status IS 'Status of the current report.';
COMMENT ON COLUMN status_history.objects.error IS 'Error of the current report.';
COMMENT ON COLUMN status_history.objects.details IS 'Details of the current report.';
COMMENT ON COLUMN status_history.objects.replica_id IS 'Replica of the current report.';
COMMENT ON COLUMN status_history.objects.generation IS 'Generation of the current report.';
COMMENT ON COLUMN status_history.objects.reported_at IS 'Reporter clock of the current report.';
COMMENT ON COLUMN status_history.objects.status_since IS
    'Stamp of the first report of the current unbroken run of this status.';
COMMENT ON COLUMN status_history.objects.lease IS 'Lease of the current report.';
COMMENT ON COLUMN status_history.objects.expires_at IS
    'When the current report''s lease runs out: its key''s last report or repeat of it, plus the lease; NULL without a lease.';
COMMENT ON COLUMN status_history.objects.lapse_error IS
    'The error readers show once the lease has run out: lapse_error(replica, expires_at - lease), written with expires_at (so that statuses need not format it per row).';

-- The clock's persisted high-water mark, in microseconds since 2000-01-01 UTC.
-- Stamps are never handed out above it, so after a crash the clock restarts
-- above everything it handed out, even if the system clock stepped back.
CREATE SEQUENCE status_history.clock_bound AS bigint MINVALUE 0 START 0;
COMMENT ON SEQUENCE status_history.clock_bound IS
    'Persisted upper bound of every stamp handed out (microseconds since 2000-01-01 UTC); maintained by the clock.';

-- Generation floors: a reconnect() without an object list fences every
-- object (replica_id NULL) or every object of one replica, including objects
-- whose first report has not committed yet.
CREATE TABLE status_history.floors (
    replica_id text,
    generation bigint NOT NULL DEFAULT 0,
    retired_at timestamptz,
    CONSTRAINT floors_replica_key UNIQUE NULLS NOT DISTINCT (replica_id)
);
INSERT INTO status_history.floors (replica_id, generation) VALUES (NULL, 0);

COMMENT ON TABLE status_history.floors IS
    'Generation floors raised by reconnect() without an object list; a report below its floor is stale. Maintained by the extension only.';
COMMENT ON COLUMN status_history.floors.replica_id IS
    'The replica the floor applies to; NULL for the database-wide floor.';
COMMENT ON COLUMN status_history.floors.generation IS
    'Reports (of that replica, or any report for the NULL row) below this generation are stale.';
COMMENT ON COLUMN status_history.floors.retired_at IS
    'When retire_replica() retired the replica: every later report of it is stale, and it never comes back. NULL: live.';

-- pg_dump keeps the data of extension-owned tables only when asked to.
-- The state and the fences are dumped too: a restore keeps them (fences are
-- not derivable from the history), merging with what the history's restore
-- rebuilds (the merge triggers below).  The clock's bound is not: restored
-- rows are imports, and the clock continues above them.
SELECT pg_catalog.pg_extension_config_dump('status_history.history', '');
SELECT pg_catalog.pg_extension_config_dump('status_history.objects', '');
SELECT pg_catalog.pg_extension_config_dump('status_history.floors', '');

-- ---------------------------------------------------------------------------
-- Versions: the library serves the SQL objects of its own version only.
-- Every upgrade script replaces this function (its definition may stay the
-- same): that change to pg_proc makes every session check the version again.
-- ---------------------------------------------------------------------------
CREATE FUNCTION status_history.versions(OUT library text, OUT extension text)
RETURNS record
AS 'MODULE_PATHNAME', 'status_history_versions'
LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.versions() IS
    'The version of the loaded status_history library, and of the extension installed in this database; they must be equal.';

-- ---------------------------------------------------------------------------
-- The clock.
-- ---------------------------------------------------------------------------
CREATE FUNCTION status_history.monotonic_now()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'status_history_monotonic_now'
LANGUAGE C VOLATILE PARALLEL UNSAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.monotonic_now() IS
    'greatest(clock_timestamp(), last stamp + 1 microsecond): unique and increasing across sessions, restarts, crashes and clock steps.';

-- ---------------------------------------------------------------------------
-- Triggers: stamping and fencing on insert; refusing every other change.
-- ---------------------------------------------------------------------------
-- The C trigger functions pin no search_path: they resolve no name through
-- it (their SQL runs as the extension owner with search_path pinned), and a
-- SET clause would save and restore settings for every row.
CREATE FUNCTION status_history.history_insert_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_insert_trigger'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_insert_trigger() IS
    'Validates a report, serializes it per object, stamps it, and decides from stored reports whether it is stale (fenced) or a repeat.';

CREATE FUNCTION status_history.history_fold_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_fold_trigger'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_fold_trigger() IS
    'Never fires: the WHENs of its triggers, history_stored() and history_written(), fold each row as it is stored and write the objects back at the statement''s end, and are false.';

-- The WHEN of history_fold: PostgreSQL evaluates it as it stores each row,
-- with the stored tuple, and queues no event when it is false -- so the
-- state is folded from each row as stored, and a COPY of millions of rows
-- queues nothing in memory.  Run as the inserting role: executable by all
-- (it folds only rows the caller's own transaction stored).
CREATE FUNCTION status_history.history_stored(tid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'status_history_history_stored'
LANGUAGE C STRICT;

-- The WHEN of history_written, evaluated as a statement's last row is
-- stored (before AFTER triggers fire): writes back the objects the statement
-- folded.  Run as the inserting role too.
CREATE FUNCTION status_history.history_written()
RETURNS boolean
AS 'MODULE_PATHNAME', 'status_history_history_written'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_written() IS
    'The WHEN of the history_written trigger: writes back the objects the statement folded, before its AFTER triggers fire; false (no event is queued).';

COMMENT ON FUNCTION status_history.history_stored(tid) IS
    'The WHEN of the history_fold trigger: folds the row just stored at the TID into its object''s state (written back at the end of the statement), hands report()''s rows back to it, and is false (no event is queued).';

CREATE FUNCTION status_history.objects_guard()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_objects_guard'
LANGUAGE C;

COMMENT ON FUNCTION status_history.objects_guard() IS
    'Before any statement on status_history.objects, floors or replica_state not issued by the extension itself, writes back and forgets the cached per-object state and floors.';

CREATE FUNCTION status_history.history_refuse_change()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_refuse_change'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_refuse_change() IS
    'Refuses UPDATE, DELETE and TRUNCATE on the append-only history (per statement, and per row for logical replication).';

CREATE TRIGGER history_insert
    BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION status_history.history_insert_trigger();
CREATE TRIGGER history_fold
    AFTER INSERT ON status_history.history
    FOR EACH ROW WHEN (status_history.history_stored(NEW.ctid))
    EXECUTE FUNCTION status_history.history_fold_trigger();
CREATE TRIGGER history_written
    AFTER INSERT ON status_history.history
    FOR EACH STATEMENT WHEN (status_history.history_written())
    EXECUTE FUNCTION status_history.history_fold_trigger();
CREATE TRIGGER history_refuse_change
    BEFORE UPDATE OR DELETE OR TRUNCATE ON status_history.history
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.history_refuse_change();

-- Row by row too: logical replication's apply worker fires row triggers only.
CREATE TRIGGER history_refuse_row
    BEFORE UPDATE OR DELETE ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION status_history.history_refuse_change();

-- Fire even under session_replication_role = replica.
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_insert;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_fold;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_written;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_refuse_change;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_refuse_row;

CREATE TRIGGER objects_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON status_history.objects
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.objects_guard();
ALTER TABLE status_history.objects ENABLE ALWAYS TRIGGER objects_guard;

CREATE FUNCTION status_history.restore_merge()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_restore_merge'
LANGUAGE C;

COMMENT ON FUNCTION status_history.restore_merge() IS
    'Rows inserted into objects, floors or replica_state by anyone but the extension (a restore) are merged with what exists: fences and floors keep the higher generation, a key keeps the restored last_seen_at.';

CREATE TRIGGER objects_restore_merge
    BEFORE INSERT ON status_history.objects
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.objects ENABLE ALWAYS TRIGGER objects_restore_merge;
ALTER TABLE status_history.floors REPLICA IDENTITY FULL;   -- (as replica_state's)
CREATE TRIGGER floors_restore_merge
    BEFORE INSERT ON status_history.floors
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_restore_merge;
CREATE TRIGGER floors_guard
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON status_history.floors
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.objects_guard();
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_guard;
-- Reporters keep the floors across transactions until a write changes them.
CREATE FUNCTION status_history.floors_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_floors_changed'
LANGUAGE C;

COMMENT ON FUNCTION status_history.floors_changed() IS
    'After every write of status_history.floors, whoever writes: backends read the floors again instead of using the ones they kept.';
CREATE TRIGGER floors_changed
    AFTER INSERT OR UPDATE OR DELETE ON status_history.floors
    FOR EACH ROW EXECUTE FUNCTION status_history.floors_changed();
CREATE TRIGGER floors_truncated
    AFTER TRUNCATE ON status_history.floors
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.floors_changed();
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_changed;
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_truncated;

-- ---------------------------------------------------------------------------
-- Writing.
-- ---------------------------------------------------------------------------
CREATE FUNCTION status_history.report(
    object_id   text,
    status      text,
    error       text        DEFAULT NULL,
    details     jsonb       DEFAULT NULL,
    replica_id  text        DEFAULT NULL,
    generation  bigint      DEFAULT 0,
    reported_at timestamptz DEFAULT NULL,
    lease       interval    DEFAULT NULL)
RETURNS status_history.history
AS 'MODULE_PATHNAME', 'status_history_report'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz, interval) IS
    'Appends one report stamped by the database clock and returns the stored row (stale when fenced); with a lease, the status holds that long unless the key reports again.';

CREATE FUNCTION status_history.report_many(
    object_ids  text[],
    statuses    text[],
    errors      text[]        DEFAULT NULL,
    details     jsonb[]       DEFAULT NULL,
    replica_ids text[]        DEFAULT NULL,
    generations bigint[]      DEFAULT NULL,
    reported_at timestamptz[] DEFAULT NULL,
    leases      interval[]    DEFAULT NULL)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_report_many'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[], interval[]) IS
    'Appends a batch of reports (element i of each array is report i) after locking their objects in one fixed order, so that batches never deadlock; returns the stored rows.';

-- ---------------------------------------------------------------------------
-- Reading.
-- ---------------------------------------------------------------------------
CREATE FUNCTION status_history.latest(
    object_ids      text[]  DEFAULT NULL,
    include_dropped boolean DEFAULT false)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_latest'
LANGUAGE C STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.latest(text[], boolean) IS
    'For each object (or each listed one), its newest non-stale report; dropped objects only when include_dropped.';

-- @@ leases: a lapse as readers show it
-- The error of a lapse, as readers show it and expire() records it: the
-- same text in every session (UTC, whatever the session's TimeZone).  The
-- one function without a pinned search_path: a SET clause would keep it
-- from being inlined into the views (a call per lapsed row cost 7x a scan
-- of statuses, docs/BENCHMARKS.md); every name and operator in it is
-- qualified instead, so a caller's search_path cannot change it.
CREATE FUNCTION status_history.lapse_error(replica_id text, seen_at timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT 'lease expired: no report'
           OPERATOR(pg_catalog.||) COALESCE(' from replica ' OPERATOR(pg_catalog.||) replica_id, '')
           OPERATOR(pg_catalog.||) ' since '
           OPERATOR(pg_catalog.||) pg_catalog.to_char(seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')
           OPERATOR(pg_catalog.||) '+00'
           OPERATOR(pg_catalog.||) CASE WHEN seen_at OPERATOR(pg_catalog.<) '0001-01-01 00:00:00+00'::pg_catalog.timestamptz
                                        THEN ' BC' ELSE '' END
$$;

COMMENT ON FUNCTION status_history.lapse_error(text, timestamptz) IS
    'The error of a lapsed lease, as readers show it and expire() records it: lease expired: no report from replica R since T (T in UTC).';

CREATE VIEW status_history.statuses AS
    SELECT o.object_id,
           CASE WHEN l.lapsed THEN 'stalled' ELSE o.status END AS status,
           CASE WHEN l.lapsed
                THEN o.lapse_error
                ELSE o.error END AS error,
           CASE WHEN l.lapsed THEN NULL ELSE o.details END AS details,
           o.replica_id,
           o.generation,
           o.occurred_at,
           CASE WHEN l.lapsed AND o.status OPERATOR(pg_catalog.<>) 'stalled'
                THEN o.expires_at ELSE o.status_since END AS status_since,
           CASE WHEN l.lapsed THEN o.expires_at ELSE o.reported_at END AS reported_at,
           o.fence,
           o.expires_at
      FROM status_history.objects AS o
     CROSS JOIN LATERAL (SELECT o.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed) AS l
     WHERE o.occurred_at IS NOT NULL
       AND o.status OPERATOR(pg_catalog.<>) 'dropped';

COMMENT ON VIEW status_history.statuses IS
    'Current status of every object that is not dropped (stalled, with the lapse as error, once the current report''s lease ran out); WHERE object_id = ... is a primary-key lookup.';
COMMENT ON COLUMN status_history.statuses.object_id IS 'The object.';
COMMENT ON COLUMN status_history.statuses.status IS 'Current status.';
COMMENT ON COLUMN status_history.statuses.error IS 'Error of the current report.';
COMMENT ON COLUMN status_history.statuses.details IS 'Details of the current report.';
COMMENT ON COLUMN status_history.statuses.replica_id IS 'Replica of the current report.';
COMMENT ON COLUMN status_history.statuses.generation IS 'Generation of the current report.';
COMMENT ON COLUMN status_history.statuses.occurred_at IS 'Stamp of the current report.';
COMMENT ON COLUMN status_history.statuses.status_since IS
    'When the object entered its current status (first report of the current unbroken run).';
COMMENT ON COLUMN status_history.statuses.reported_at IS 'Reporter clock of the current report.';
COMMENT ON COLUMN status_history.statuses.fence IS 'The object''s fence generation.';
COMMENT ON COLUMN status_history.statuses.expires_at IS
    'When the current report''s lease runs out (or ran out: the status shows stalled since then); NULL without a lease.';

-- ---------------------------------------------------------------------------
-- Fencing.
-- ---------------------------------------------------------------------------
CREATE FUNCTION status_history.reconnect(
    generation bigint,
    replica_id text   DEFAULT NULL,
    object_ids text[] DEFAULT NULL)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_reconnect'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.reconnect(bigint, text, text[]) IS
    'Raises the fence of every object in scope to generation (and, without an object list, the database-wide or the replica''s floor) and re-stamps their current status so it sorts last; returns the appended rows.';

-- ---------------------------------------------------------------------------
-- Per-key state (object_id, replica_id): heartbeats and replicas.
-- ---------------------------------------------------------------------------
-- @@ per-key state (keys)
CREATE TABLE status_history.replica_state (
    object_id    text        NOT NULL,
    replica_id   text,
    last_at      timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    occurred_at  timestamptz,
    status       text,
    status_since timestamptz,
    expires_at   timestamptz,
    CONSTRAINT replica_state_key UNIQUE NULLS NOT DISTINCT (object_id, replica_id)
) WITH (fillfactor = 50);   -- heartbeats update it in place (HOT)
-- The objects a replica reported on (reconnect(generation, replica_id),
-- retire_replica()); its columns never change, so updates stay HOT.
CREATE INDEX replica_state_replica_idx
    ON status_history.replica_state (replica_id, object_id) WHERE replica_id IS NOT NULL;

-- Updated in place by every report: a publication of all tables needs to
-- know which row an update changed (no unique index on NOT NULL columns).
ALTER TABLE status_history.replica_state REPLICA IDENTITY FULL;

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
COMMENT ON COLUMN status_history.replica_state.expires_at IS
    'When the lease of the key''s newest non-stale report runs out: when the key last reported it or repeated it, plus its lease; NULL without a lease.';

SELECT pg_catalog.pg_extension_config_dump('status_history.replica_state', '');

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
           CASE WHEN l.lapsed THEN 'stalled' ELSE h.status END AS status,
           CASE WHEN l.lapsed
                THEN status_history.lapse_error(k.replica_id, k.expires_at OPERATOR(pg_catalog.-) h.lease)
                ELSE h.error END AS error,
           CASE WHEN l.lapsed THEN NULL ELSE h.details END AS details,
           h.generation,
           k.occurred_at,
           CASE WHEN l.lapsed AND h.status OPERATOR(pg_catalog.<>) 'stalled'
                THEN k.expires_at ELSE k.status_since END AS status_since,
           CASE WHEN l.lapsed THEN k.expires_at ELSE h.reported_at END AS reported_at,
           k.last_at,
           k.last_seen_at,
           f.retired_at IS NOT NULL AS retired,
           k.expires_at
      FROM status_history.replica_state AS k
     CROSS JOIN LATERAL (SELECT k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed) AS l
      LEFT JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
      LEFT JOIN status_history.floors AS f
        ON f.replica_id OPERATOR(pg_catalog.=) k.replica_id;

COMMENT ON VIEW status_history.replica_statuses IS
    'One row per key (object_id, replica_id): its newest non-stale report, and when it last reported; WHERE object_id = ... is an index lookup.';
COMMENT ON COLUMN status_history.replica_statuses.object_id IS 'The object.';
COMMENT ON COLUMN status_history.replica_statuses.replica_id IS 'The replica (NULL: reports without one).';
COMMENT ON COLUMN status_history.replica_statuses.status IS
    'Status of the key''s newest non-stale report (stalled once its lease ran out); NULL when it has only stale ones.';
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
COMMENT ON COLUMN status_history.replica_statuses.expires_at IS
    'When the lease of that report runs out (or ran out: the key shows stalled since then); NULL without a lease.';

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
           k.status,
           CASE WHEN k.lapsed
                THEN status_history.lapse_error(h.replica_id, k.expires_at OPERATOR(pg_catalog.-) h.lease)
                ELSE h.error END AS error,
           CASE WHEN k.lapsed THEN NULL ELSE h.details END AS details,
           h.replica_id,
           h.generation,
           h.occurred_at,
           CASE WHEN k.lapsed AND h.status OPERATOR(pg_catalog.<>) 'stalled'
                THEN k.expires_at ELSE k.status_since END AS status_since,
           CASE WHEN k.lapsed THEN k.expires_at ELSE h.reported_at END AS reported_at,
           o.fence,
           k.expires_at
      FROM status_history.objects AS o
     CROSS JOIN LATERAL (
           SELECT s.occurred_at, s.status_since, s.expires_at, d.status, d.lapsed
             FROM status_history.replica_state AS s
            CROSS JOIN LATERAL (
                  SELECT s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed,
                         CASE WHEN s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                              THEN 'stalled' ELSE s.status END AS status) AS d
            WHERE s.object_id OPERATOR(pg_catalog.=) o.object_id
              AND s.occurred_at IS NOT NULL
              AND (d.status OPERATOR(pg_catalog.=) 'paused'
                   OR NOT EXISTS (SELECT FROM status_history.floors AS f
                                   WHERE f.replica_id OPERATOR(pg_catalog.=) s.replica_id
                                     AND f.retired_at IS NOT NULL))
            ORDER BY pg_catalog.array_position('{ceased,paused,starting,stalled,running,dropped}'::text[],
                                               d.status) DESC NULLS LAST,
                     s.occurred_at DESC
            LIMIT 1) AS k
      JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
     WHERE h.status OPERATOR(pg_catalog.<>) 'dropped';

COMMENT ON VIEW status_history.statuses_by_precedence IS
    'One status per object by precedence (Materialize''s rule, opt-in): of each live key''s newest non-stale report (stalled once its lease ran out; a retired replica''s key only when paused), the highest of dropped > running > stalled > starting > paused > ceased, the newest among equals; dropped objects hidden. WHERE object_id = ... is an index lookup.';
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
COMMENT ON COLUMN status_history.statuses_by_precedence.expires_at IS
    'When the chosen report''s lease runs out (or ran out: it shows stalled since then); NULL without a lease.';

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
    SELECT h.occurred_at, h.object_id, k.status,
           CASE WHEN k.lapsed
                THEN status_history.lapse_error(h.replica_id, k.expires_at OPERATOR(pg_catalog.-) h.lease)
                ELSE h.error END,
           CASE WHEN k.lapsed THEN NULL ELSE h.details END,
           h.replica_id, h.generation,
           CASE WHEN k.lapsed THEN k.expires_at ELSE h.reported_at END,
           h.stale,
           CASE WHEN k.lapsed THEN NULL ELSE h.lease END
      FROM scope AS o
     CROSS JOIN LATERAL (
           SELECT s.occurred_at, s.expires_at, d.status, d.lapsed
             FROM status_history.replica_state AS s
            CROSS JOIN LATERAL (
                  SELECT s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed,
                         CASE WHEN s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                              THEN 'stalled' ELSE s.status END AS status) AS d
            WHERE s.object_id OPERATOR(pg_catalog.=) o.object_id
              AND s.occurred_at IS NOT NULL
              AND (d.status OPERATOR(pg_catalog.=) 'paused'
                   OR NOT EXISTS (SELECT FROM status_history.floors AS f
                                   WHERE f.replica_id OPERATOR(pg_catalog.=) s.replica_id
                                     AND f.retired_at IS NOT NULL))
            ORDER BY pg_catalog.array_position('{ceased,paused,starting,stalled,running,dropped}'::text[],
                                               d.status) DESC NULLS LAST,
                     s.occurred_at DESC
            LIMIT 1) AS k
      JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
     WHERE include_dropped IS TRUE OR h.status OPERATOR(pg_catalog.<>) 'dropped'
$$;

COMMENT ON FUNCTION status_history.latest_by_precedence(text[], boolean) IS
    'For each object (or each listed one), its report chosen by precedence as in statuses_by_precedence; dropped objects only when include_dropped.';

CREATE FUNCTION status_history.retire_replica(
    replica_id text,
    generation bigint DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'status_history_retire_replica'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.retire_replica(text, bigint) IS
    'Retires a replica for good: its later reports are stale, and every object whose current report it made shows another live replica''s newest report (re-stamped) or paused; returns the number of objects whose status changed.';

-- ---------------------------------------------------------------------------
-- Retention.
-- ---------------------------------------------------------------------------
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

-- Not for PUBLIC: the admin role's (apply_privileges() below).

-- ---------------------------------------------------------------------------
-- Leases: recording the lapses readers already show.
-- ---------------------------------------------------------------------------
-- @@ leases: expire()
CREATE FUNCTION status_history.expire(max_objects integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'status_history_expire'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.expire(integer) IS
    'Appends, for every object whose current report''s lease ran out (at most max_objects of them; NULL: all), the lapse readers already show (stalled, the lapse as error, the report''s replica and generation), each re-checked under its object''s lock; returns the number of rows appended. The background worker calls it every status_history.expire_interval, in batches.';

-- Not for PUBLIC: the controller's and the admin's (apply_privileges() below).

-- ---------------------------------------------------------------------------
-- The change feed: following the history in stamp order, missing nothing.
-- ---------------------------------------------------------------------------
-- @@ change feed
CREATE TABLE status_history.feed (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pruned_through timestamptz
);
INSERT INTO status_history.feed DEFAULT VALUES;

COMMENT ON TABLE status_history.feed IS
    'The change feed''s one row: how far prune() has removed rows. Maintained by the extension only.';
COMMENT ON COLUMN status_history.feed.singleton IS 'Always true: the table has one row.';
COMMENT ON COLUMN status_history.feed.pruned_through IS
    'The newest stamp prune() removed: a consumer of changes() behind it may have lost rows. NULL: nothing pruned.';

-- The horizon as the primary last gave it out, WAL-logged (not
-- transactional): a standby's horizon, and the floor of imports after a
-- restart.  Microseconds since 2000-01-01 UTC; not called yet: none.
CREATE SEQUENCE status_history.feed_horizon AS bigint
    MINVALUE -9223372036854775807 START -9223372036854775807;
COMMENT ON SEQUENCE status_history.feed_horizon IS
    'The stable horizon the primary last gave out (microseconds since 2000-01-01 UTC), as a standby reads it. Maintained by the extension.';

CREATE FUNCTION status_history.stable_horizon()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'status_history_stable_horizon'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.stable_horizon() IS
    'A stamp below which every row of the history is committed or will never exist: the oldest stamp a running or prepared transaction holds, else the next stamp. Never goes back.';

CREATE FUNCTION status_history.changes(
    after       timestamptz DEFAULT NULL,
    max_rows    integer     DEFAULT 1000,
    skip_pruned boolean     DEFAULT false)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_changes'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.changes(timestamptz, integer, boolean) IS
    'The history rows stamped after after and below stable_horizon(), oldest first, at most max_rows: loop changes(the last stamp returned) to see every committed row once, in stamp order. Fails (55000) when prune() removed rows after after, unless skip_pruned.';

-- ---------------------------------------------------------------------------
-- History questions.
-- ---------------------------------------------------------------------------
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

-- ---------------------------------------------------------------------------
-- Privileges: one matrix, in apply_privileges().  The install script applies
-- it, grant_roles() records the operator's roles and applies it to them
-- (docs/OPERATIONS.md: Roles), a restore of roles applies it again.  An upgrade script
-- grants what it creates as the matrix does, and nothing on what exists (a
-- GRANT there would be recorded in pg_init_privs as the extension's own).
-- ---------------------------------------------------------------------------
-- @@ privileges (roles)
CREATE TABLE status_history.roles (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reporter     regrole,
    controller   regrole,
    reader       regrole,
    admin        regrole,
    public_reads boolean NOT NULL DEFAULT true
);
INSERT INTO status_history.roles DEFAULT VALUES;
SELECT pg_catalog.pg_extension_config_dump('status_history.roles', '');

COMMENT ON TABLE status_history.roles IS
    'The roles status_history.grant_roles() grants to (one row); admin may also import (supply occurred_at). Maintained by grant_roles().';
COMMENT ON COLUMN status_history.roles.singleton IS 'Always true: the table has one row.';
COMMENT ON COLUMN status_history.roles.reporter IS 'May report: INSERT on the history.';
COMMENT ON COLUMN status_history.roles.controller IS 'May report, reconnect(), retire_replica() and expire().';
COMMENT ON COLUMN status_history.roles.reader IS 'May read the history, the state, the views and the history questions.';
COMMENT ON COLUMN status_history.roles.admin IS 'May read, import (supply occurred_at), prune() and expire().';
COMMENT ON COLUMN status_history.roles.public_reads IS 'PUBLIC may read as a reader does (the default of a fresh install).';

CREATE TRIGGER roles_restore_merge
    BEFORE INSERT ON status_history.roles
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.roles ENABLE ALWAYS TRIGGER roles_restore_merge;

CREATE FUNCTION status_history.apply_privileges()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r      status_history.roles;
    who    text;
    -- Everything that reads; everything everyone may call; the rest by role.
    reads  CONSTANT text := 'status_history.history, status_history.objects, status_history.floors,'
        ' status_history.statuses, status_history.replica_state, status_history.replica_statuses,'
        ' status_history.statuses_by_precedence';
    read_functions CONSTANT text := 'status_history.latest(text[], boolean),'
        ' status_history.latest_by_precedence(text[], boolean),'
        ' status_history.history_of(text, timestamptz, timestamptz),'
        ' status_history.intervals(text, timestamptz, timestamptz),'
        ' status_history.time_in_status(timestamptz, timestamptz, text[])';
    everyone_functions CONSTANT text := 'status_history.monotonic_now(), status_history.versions(),'
        ' status_history.report(text, text, text, jsonb, text, bigint, timestamptz, interval),'
        ' status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[], interval[]),'
        ' status_history.lapse_error(text, timestamptz),'
        ' status_history.stable_horizon(), status_history.changes(timestamptz, integer, boolean),'
        ' status_history.history_stored(tid), status_history.history_written()';
    controller_functions CONSTANT text := 'status_history.reconnect(bigint, text, text[]),'
        ' status_history.retire_replica(text, bigint), status_history.expire(integer)';
    admin_functions CONSTANT text := 'status_history.prune(integer, interval), status_history.expire(integer)';
BEGIN
    SELECT * INTO r FROM status_history.roles;
    -- Nothing for anyone first: what an earlier version, a recipe, an owner
    -- or an operator granted goes too, to whomever it was granted (a role
    -- holding TRIGGER could make the extension's owner run its code).
    FOR who IN SELECT 'PUBLIC'
               UNION
               SELECT x::text   -- (a regrole's text is a quoted identifier)
                 FROM pg_catalog.unnest(ARRAY[r.reporter, r.controller, r.reader, r.admin]) AS x
                WHERE x IS NOT NULL
               UNION
               SELECT g.grantee::pg_catalog.regrole::text
                 FROM (SELECT (pg_catalog.aclexplode(c.relacl)).grantee, c.relowner AS owner
                         FROM pg_catalog.pg_class AS c
                        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                       UNION ALL
                       SELECT (pg_catalog.aclexplode(a.attacl)).grantee, c.relowner
                         FROM pg_catalog.pg_attribute AS a
                         JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
                        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                       UNION ALL
                       SELECT (pg_catalog.aclexplode(p.proacl)).grantee, p.proowner
                         FROM pg_catalog.pg_proc AS p
                        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                       UNION ALL
                       SELECT (pg_catalog.aclexplode(n.nspacl)).grantee, n.nspowner
                         FROM pg_catalog.pg_namespace AS n
                        WHERE n.oid OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace) AS g
                WHERE g.grantee OPERATOR(pg_catalog.<>) g.owner AND g.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA status_history FROM %s', who);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA status_history FROM %s', who);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA status_history FROM %s', who);
        EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA status_history FROM %s', who);
    END LOOP;
    EXECUTE 'GRANT USAGE ON SCHEMA status_history TO PUBLIC';
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', everyone_functions);
    IF r.public_reads THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON %s TO PUBLIC', reads);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', read_functions);
    END IF;
    IF r.reporter IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT INSERT ON status_history.history TO %s', r.reporter::text);
    END IF;
    IF r.controller IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT INSERT ON status_history.history TO %s', r.controller::text);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', controller_functions, r.controller::text);
    END IF;
    FOR who IN SELECT DISTINCT x::text
                 FROM pg_catalog.unnest(ARRAY[r.reader, r.admin]) AS x WHERE x IS NOT NULL
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON %s, status_history.roles TO %s', reads, who);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', read_functions, who);
    END LOOP;
    IF r.admin IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT INSERT ON status_history.history TO %s', r.admin::text);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', admin_functions, r.admin::text);
    END IF;
END
$$;

COMMENT ON FUNCTION status_history.apply_privileges() IS
    'Grants exactly the privileges of the recorded roles (status_history.roles) and of PUBLIC, revoking everything else from every role but the owners; run by the install script, grant_roles() and a restore of roles.';

CREATE FUNCTION status_history.grant_roles(
    reporter     regrole DEFAULT NULL,
    controller   regrole DEFAULT NULL,
    reader       regrole DEFAULT NULL,
    admin        regrole DEFAULT NULL,
    public_reads boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    old status_history.roles;
    who regrole;
BEGIN
    IF public_reads IS NULL THEN
        RAISE EXCEPTION 'public_reads must not be null'
            USING ERRCODE = '22004', HINT = 'Pass false for least privilege (only the reader and admin roles read), true to let everyone read.';
    END IF;
    SELECT * INTO old FROM status_history.roles;
    -- Roles that no longer play a part keep nothing of it.
    FOREACH who IN ARRAY ARRAY[old.reporter, old.controller, old.reader, old.admin] LOOP
        IF who IS NOT NULL THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA status_history FROM %s', who::text);
            EXECUTE pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA status_history FROM %s', who::text);
            EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA status_history FROM %s', who::text);
        END IF;
    END LOOP;
    UPDATE status_history.roles AS r
       SET reporter = grant_roles.reporter, controller = grant_roles.controller,
           reader = grant_roles.reader, admin = grant_roles.admin,
           public_reads = grant_roles.public_reads;
    PERFORM status_history.apply_privileges();
END
$$;

COMMENT ON FUNCTION status_history.grant_roles(regrole, regrole, regrole, regrole, boolean) IS
    'Records the roles that report, control, read and administer (imports, prune()), and grants each exactly its part (docs/OPERATIONS.md: Roles); public_reads => false: PUBLIC no longer reads.';

SELECT status_history.apply_privileges();
-- Writing needs INSERT on status_history.history (reporter, controller,
-- admin); fencing EXECUTE on reconnect(); trigger functions need no grant.
