-- status_history install script.
--
-- `make` copies this file to status_history--<version>.sql, the version being
-- the one in status_history.control.  Every name is schema-qualified and every
-- function pins search_path, so a hostile search_path at CREATE EXTENSION time
-- or at call time cannot redirect anything.

\echo Use "CREATE EXTENSION status_history" to load this file. \quit

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
    stale       boolean     NOT NULL DEFAULT false,
    CONSTRAINT history_pkey PRIMARY KEY (occurred_at)
);
CREATE INDEX history_object_idx
    ON status_history.history (object_id, occurred_at DESC);
CREATE INDEX history_replica_idx
    ON status_history.history (replica_id, object_id, occurred_at DESC)
    WHERE replica_id IS NOT NULL;

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
COMMENT ON COLUMN status_history.history.stale IS
    'True when the report arrived below the object''s fence or after it was dropped; a stale report never becomes current.';

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
    status_since timestamptz
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

-- The clock's persisted high-water mark, in microseconds since 2000-01-01 UTC.
-- Stamps are never handed out above it, so after a crash the clock restarts
-- above everything it handed out, even if the system clock stepped back.
CREATE SEQUENCE status_history.clock_bound AS bigint MINVALUE 0 START 0;
COMMENT ON SEQUENCE status_history.clock_bound IS
    'Persisted upper bound of every stamp handed out (microseconds since 2000-01-01 UTC); maintained by the clock.';

-- pg_dump keeps the data of extension-owned tables only when asked to.
SELECT pg_catalog.pg_extension_config_dump('status_history.history', '');

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
CREATE FUNCTION status_history.history_insert_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_insert_trigger'
LANGUAGE C
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.history_insert_trigger() IS
    'Validates a report, serializes it per object, stamps it, marks it stale when fenced, and keeps the object''s current report.';

CREATE FUNCTION status_history.history_statement_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_statement_trigger'
LANGUAGE C
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.history_statement_trigger() IS
    'Brackets each INSERT statement, so per-object state is written back once per object rather than once per report.';

CREATE FUNCTION status_history.history_prefetch(object_ids text[])
RETURNS void
AS 'MODULE_PATHNAME', 'status_history_prefetch'
LANGUAGE C VOLATILE STRICT
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.history_prefetch(text[]) IS
    'Internal to reconnect(): locks the listed objects and reads their state for the INSERT that follows, in one query.';

CREATE FUNCTION status_history.history_refuse_change()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_refuse_change'
LANGUAGE C
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.history_refuse_change() IS
    'Refuses UPDATE, DELETE and TRUNCATE on the append-only history.';

CREATE TRIGGER history_insert
    BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION status_history.history_insert_trigger();
CREATE TRIGGER history_statement_begin
    BEFORE INSERT ON status_history.history
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.history_statement_trigger();
CREATE TRIGGER history_statement_end
    AFTER INSERT ON status_history.history
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.history_statement_trigger();
CREATE TRIGGER history_refuse_change
    BEFORE UPDATE OR DELETE OR TRUNCATE ON status_history.history
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.history_refuse_change();

-- Fire even under session_replication_role = replica.
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_insert;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_statement_begin;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_statement_end;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_refuse_change;

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
    reported_at timestamptz DEFAULT NULL)
RETURNS status_history.history
AS 'MODULE_PATHNAME', 'status_history_report'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz) IS
    'Appends one report stamped by the database clock and returns the stored row (stale when fenced).';

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

CREATE VIEW status_history.statuses AS
    SELECT o.object_id,
           o.status,
           o.error,
           o.details,
           o.replica_id,
           o.generation,
           o.occurred_at,
           o.status_since,
           o.reported_at,
           o.fence
      FROM status_history.objects AS o
     WHERE o.occurred_at IS NOT NULL
       AND o.status OPERATOR(pg_catalog.<>) 'dropped';

COMMENT ON VIEW status_history.statuses IS
    'Current status of every object that is not dropped; WHERE object_id = ... is a primary-key lookup.';
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

-- ---------------------------------------------------------------------------
-- Fencing.
-- ---------------------------------------------------------------------------
CREATE FUNCTION status_history.reconnect(
    generation bigint,
    replica_id text   DEFAULT NULL,
    object_ids text[] DEFAULT NULL)
RETURNS SETOF status_history.history
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    new_generation CONSTANT bigint := $1;
    by_replica     CONSTANT text   := $2;
    listed         CONSTANT text[] := $3;
    candidates     text[];     -- NULL: every object
    scope          text[];     -- the locked objects in scope
    blocker        record;
BEGIN
    IF new_generation IS NULL THEN
        RAISE EXCEPTION 'generation must not be null'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Pass the generation of the controller or deployment that is reconnecting.';
    END IF;
    IF new_generation < 0 THEN
        RAISE EXCEPTION 'generation must not be negative, got %', new_generation
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Generations start at 0 and only grow.';
    END IF;
    IF listed IS NOT NULL AND pg_catalog.array_position(listed, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'object_ids must not contain NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'List object ids only, or pass NULL to reconnect every object in scope.';
    END IF;
    IF listed IS NOT NULL AND pg_catalog.array_position(listed, '') IS NOT NULL THEN
        RAISE EXCEPTION 'object_ids must not contain an empty object id'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Object ids are non-empty strings.';
    END IF;
    IF by_replica = '' THEN
        RAISE EXCEPTION 'replica_id must not be empty'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass NULL to reconnect without naming a replica.';
    END IF;

    -- One reconnect at a time; reports go on meanwhile (they take weaker locks).
    LOCK TABLE status_history.objects IN SHARE UPDATE EXCLUSIVE MODE;

    -- Candidates: listed objects, else those the replica reported on, else all.
    IF listed IS NOT NULL THEN
        SELECT pg_catalog.array_agg(DISTINCT l.id)
          INTO candidates
          FROM pg_catalog.unnest(listed) AS l(id);
        -- A listed object that never reported still gets a fence.
        INSERT INTO status_history.objects (object_id)
        SELECT c.id FROM pg_catalog.unnest(candidates) AS c(id) ORDER BY c.id
            ON CONFLICT (object_id) DO NOTHING;
        candidates := COALESCE(candidates, '{}');
    ELSIF by_replica IS NOT NULL THEN
        SELECT COALESCE(pg_catalog.array_agg(DISTINCT h.object_id), '{}')
          INTO candidates
          FROM status_history.history AS h
         WHERE h.replica_id OPERATOR(pg_catalog.=) by_replica;
    END IF;

    -- Lock the scope in a fixed order (concurrent reports and reconnects cannot
    -- deadlock) and fix it: an object created after this is not in scope, so
    -- every object re-stamped below is also one whose fence is raised.
    -- (Arrays are joined through unnest(): "= ANY (variable)" is not hashed.)
    IF candidates IS NULL THEN
        SELECT COALESCE(pg_catalog.array_agg(l.object_id), '{}')
          INTO scope
          FROM (SELECT o.object_id
                  FROM status_history.objects AS o
                 ORDER BY o.object_id
                   FOR UPDATE) AS l;
    ELSE
        SELECT COALESCE(pg_catalog.array_agg(l.object_id), '{}')
          INTO scope
          FROM (SELECT o.object_id
                  FROM status_history.objects AS o
                  JOIN pg_catalog.unnest(candidates) AS c(id)
                    ON o.object_id OPERATOR(pg_catalog.=) c.id
                 ORDER BY o.object_id
                   FOR UPDATE OF o) AS l;
    END IF;

    SELECT o.object_id, o.fence INTO blocker
      FROM status_history.objects AS o
      JOIN pg_catalog.unnest(scope) AS s(id) ON o.object_id OPERATOR(pg_catalog.=) s.id
     WHERE o.fence OPERATOR(pg_catalog.>) new_generation
     ORDER BY o.fence DESC, o.object_id
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'generation % is below the fence % of object "%"',
                        new_generation, blocker.fence, blocker.object_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = 'A controller with a newer generation has already reconnected.',
                  HINT = 'This controller is superseded: stop it, or reconnect with a generation at least as high as the fence.';
    END IF;

    UPDATE status_history.objects AS o
       SET fence = new_generation
      FROM pg_catalog.unnest(scope) AS s(id)
     WHERE o.object_id OPERATOR(pg_catalog.=) s.id
       AND o.fence OPERATOR(pg_catalog.<) new_generation;

    -- The INSERT below must follow at once: it consumes what this reads.
    PERFORM status_history.history_prefetch(scope);

    -- Re-stamp the current status of every live object in scope.  The insert
    -- trigger stamps each copy later than every row in the table.
    RETURN QUERY
    WITH appended AS (
        INSERT INTO status_history.history AS h
            (object_id, status, error, details, replica_id, generation, reported_at)
        SELECT c.object_id, c.status, c.error, c.details, c.replica_id,
               new_generation, c.reported_at
          FROM (
                SELECT o.object_id, o.status, o.error, o.details, o.replica_id, o.reported_at
                  FROM status_history.objects AS o
                  JOIN pg_catalog.unnest(scope) AS s(id) ON o.object_id OPERATOR(pg_catalog.=) s.id
                 WHERE by_replica IS NULL
                   AND o.occurred_at IS NOT NULL
                   AND o.status OPERATOR(pg_catalog.<>) 'dropped'
                UNION ALL
                SELECT o.object_id, r.status, r.error, r.details, r.replica_id, r.reported_at
                  FROM status_history.objects AS o
                  JOIN pg_catalog.unnest(scope) AS s(id) ON o.object_id OPERATOR(pg_catalog.=) s.id
                 CROSS JOIN LATERAL (
                        SELECT h2.status, h2.error, h2.details, h2.replica_id, h2.reported_at
                          FROM status_history.history AS h2
                         WHERE h2.replica_id OPERATOR(pg_catalog.=) by_replica
                           AND h2.object_id OPERATOR(pg_catalog.=) o.object_id
                         ORDER BY h2.occurred_at DESC
                         LIMIT 1) AS r
                 WHERE by_replica IS NOT NULL
                   AND o.occurred_at IS NOT NULL
                   AND o.status OPERATOR(pg_catalog.<>) 'dropped'
               ) AS c
         ORDER BY c.object_id
        RETURNING h.*
    )
    SELECT * FROM appended;
END
$$;

COMMENT ON FUNCTION status_history.reconnect(bigint, text, text[]) IS
    'Raises the fence of every object in scope to generation and re-stamps their current status so it sorts last; returns the appended rows.';

-- ---------------------------------------------------------------------------
-- Privileges: everyone may read; writing and fencing are granted explicitly.
-- ---------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA status_history FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA status_history FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA status_history FROM PUBLIC;
GRANT USAGE ON SCHEMA status_history TO PUBLIC;
GRANT SELECT ON status_history.history, status_history.objects, status_history.statuses TO PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.latest(text[], boolean) TO PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.monotonic_now() TO PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz) TO PUBLIC;
-- Writing needs INSERT on status_history.history (granted per role); fencing
-- needs EXECUTE on reconnect().  Trigger functions need no grant to fire.
