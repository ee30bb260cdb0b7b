-- The per-object state must equal brute force over the history after every
-- statement, whatever the statement's shape.  Each block below is a defect
-- found in review (issue "Correctness"), reproduced in its shortest form.
CREATE EXTENSION status_history;
CREATE EXTENSION plperl;

\i sql/oracle.psql

CREATE ROLE sh_reporter;
GRANT INSERT ON status_history.history TO sh_reporter;
GRANT EXECUTE ON FUNCTION state_mismatches() TO sh_reporter;

-- 1. A subtransaction that aborts during an INSERT (a function with an
--    EXCEPTION block) must not take the statement's earlier rows' state with it.
CREATE FUNCTION try_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN RETURN t::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$;
SET ROLE sh_reporter;
INSERT INTO status_history.history (object_id, status, details)
SELECT o, 'running', try_jsonb(d) FROM (VALUES ('d1a','{"ok":1}'), ('d1b','not json')) v(o, d);
SELECT object_id, status, details FROM status_history.statuses WHERE object_id LIKE 'd1%' ORDER BY 1;
-- The lost report being "dropped": a later report must still be stale.
INSERT INTO status_history.history (object_id, status, details)
SELECT o, s, try_jsonb(d) FROM (VALUES ('d1c','dropped','{}'), ('d1b','running','nope')) v(o, s, d);
SELECT stale FROM status_history.report('d1c', 'running');
RESET ROLE;
SELECT state_mismatches() AS after_aborted_subxact;

-- ... and a nested INSERT that fails inside an exception block must not roll
-- back the outer statement's write-back.
CREATE FUNCTION nested_fail(o text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        INSERT INTO status_history.history (object_id, status) VALUES (o || '-inner', 'running');
        INSERT INTO status_history.history (object_id, status) VALUES (o, 'bogus');
    EXCEPTION WHEN invalid_parameter_value THEN NULL;
    END;
    RETURN 'stalled';
END $$;
INSERT INTO status_history.history (object_id, status)
SELECT o, CASE WHEN o = 'd1e' THEN nested_fail(o) ELSE 'running' END
  FROM (VALUES ('d1d'), ('d1e'), ('d1f')) v(o);
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'd1%' ORDER BY 1;
SELECT state_mismatches() AS after_nested_failure;

-- Savepoints: released ones keep their state, rolled-back ones lose it, and
-- the outer level's state survives a rollback of a later savepoint.
BEGIN;
INSERT INTO status_history.history (object_id, status) VALUES ('d1g', 'starting');
SAVEPOINT a;
INSERT INTO status_history.history (object_id, status) VALUES ('d1g', 'running'), ('d1h', 'running');
RELEASE a;
SAVEPOINT b;
INSERT INTO status_history.history (object_id, status) VALUES ('d1g', 'stalled'), ('d1i', 'paused');
SELECT state_mismatches() AS inside_savepoint;
ROLLBACK TO b;
SELECT state_mismatches() AS after_rollback_to;
COMMIT;
SELECT object_id, status FROM status_history.statuses WHERE object_id IN ('d1g', 'd1h', 'd1i') ORDER BY 1;

-- 2. INSERT ... RETURNING run with a row limit (the executor stops early,
--    no AFTER STATEMENT trigger fires).
CREATE FUNCTION limited_insert() RETURNS text LANGUAGE plperl AS $$
    my $r = spi_exec_query(q{INSERT INTO status_history.history (object_id, status)
                             VALUES ('d2a', 'running'), ('d2b', 'stalled') RETURNING object_id}, 1);
    return $r->{rows}[0]{object_id};
$$;
SELECT limited_insert();
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'd2%' ORDER BY 1;
SELECT state_mismatches() AS after_limited_spi;

-- 3. Rows that ON CONFLICT DO NOTHING skips after the BEFORE ROW trigger ran:
--    an idempotency key added by the owner, and an owner re-import of a stamp.
CREATE UNIQUE INDEX history_idempotency ON status_history.history (object_id, reported_at);
INSERT INTO status_history.history (object_id, status, reported_at)
VALUES ('d3a', 'running', '2026-01-01 00:00:00+00');
INSERT INTO status_history.history (object_id, status, reported_at)
VALUES ('d3a', 'dropped', '2026-01-01 00:00:00+00') ON CONFLICT DO NOTHING;
SELECT object_id, status FROM status_history.statuses WHERE object_id = 'd3a';
SELECT stale FROM status_history.report('d3a', 'stalled');
INSERT INTO status_history.history (occurred_at, object_id, status)
SELECT occurred_at, object_id, status FROM status_history.history WHERE object_id = 'd3a'
ON CONFLICT DO NOTHING;
-- (A different report at a taken stamp is refused before ON CONFLICT can skip it.)
INSERT INTO status_history.history (occurred_at, object_id, status)
SELECT occurred_at, object_id, 'dropped' FROM status_history.history WHERE object_id = 'd3a'
ON CONFLICT DO NOTHING;
SELECT object_id, status FROM status_history.statuses WHERE object_id = 'd3a';
-- A skipped row in the middle of an unbroken run: status_since stays put.
INSERT INTO status_history.history (object_id, status, reported_at) VALUES ('d3c', 'running', '2026-01-01 00:00:02+00');
INSERT INTO status_history.history (object_id, status) VALUES ('d3c', 'starting');
CREATE TEMP TABLE d3c_since AS SELECT status_since FROM status_history.objects WHERE object_id = 'd3c';
INSERT INTO status_history.history (object_id, status, reported_at)
VALUES ('d3c', 'ceased', '2026-01-01 00:00:02+00'), ('d3c', 'starting', NULL) ON CONFLICT DO NOTHING;
SELECT o.status, o.status_since = d.status_since AS since_unchanged
  FROM status_history.objects o, d3c_since d WHERE o.object_id = 'd3c';
DROP INDEX status_history.history_idempotency;
SELECT state_mismatches() AS after_on_conflict;

-- An import into the past that breaks the current run of a status.
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES ('2020-01-01 00:00:03+00', 'd3b', 'running'), ('2020-01-01 00:00:01+00', 'd3b', 'running');
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES ('2020-01-01 00:00:02+00', 'd3b', 'stalled');
SELECT status, status_since AT TIME ZONE 'UTC' AS status_since
  FROM status_history.statuses WHERE object_id = 'd3b';
SELECT state_mismatches() AS after_import_into_the_past;

-- 4. reconnect(g, replica) copies the replica's newest non-stale report only.
SELECT status, stale FROM status_history.report('d4', 'running', replica_id => 'r1', generation => 1);
SELECT status, generation FROM status_history.reconnect(2, 'r1');
SELECT status, stale FROM status_history.report('d4', 'stalled', replica_id => 'r1', generation => 1);
SELECT status, generation FROM status_history.reconnect(3, 'r1');
SELECT object_id, status, generation FROM status_history.statuses WHERE object_id = 'd4';

-- 5. reconnect() evaluated inside an INSERT copies the state the statement
--    has written so far (here: d5x's stalled), not the state before it.
SELECT status FROM status_history.report('d5x', 'running');
INSERT INTO status_history.history (object_id, status)
SELECT 'd5x', 'stalled' UNION ALL
SELECT 'd5y', 'running' FROM status_history.reconnect(1, NULL, ARRAY['d5x']);
SELECT object_id, status, generation FROM status_history.statuses WHERE object_id LIKE 'd5%' ORDER BY 1;
-- Without an object list it waits for every reporting transaction, so it
-- is refused in one that has reported already ...
BEGIN;
SELECT status FROM status_history.report('d5x', 'stalled');
SELECT count(*) FROM status_history.reconnect(1, 'r5');
ROLLBACK;
-- ... and allowed first in its transaction, before reports.
BEGIN;
SELECT count(*) FROM status_history.reconnect(1, 'r5');
SELECT status, stale FROM status_history.report('d5x', 'paused', replica_id => 'r5', generation => 1);
COMMIT;
SELECT object_id, status FROM status_history.statuses WHERE object_id = 'd5x';
SELECT state_mismatches() AS after_reconnect_rules;

-- 10. report() and reconnect() keep working after a column was dropped from
--     the history (upgrade scripts add and drop columns).
ALTER TABLE status_history.history ADD COLUMN scratch int;
ALTER TABLE status_history.history DROP COLUMN scratch;
SELECT object_id, status FROM status_history.report('d10', 'running');
SELECT object_id, status FROM status_history.reconnect(4, NULL, ARRAY['d10']);
SELECT object_id, status FROM status_history.report_many(ARRAY['d10'], ARRAY['paused']);
-- A two-dimensional object_ids is refused with a clear error.
SELECT * FROM status_history.reconnect(5, NULL, ARRAY[['a','b'],['c','d']]);
-- latest() and history_of() return rows of the history's row type, matched
-- by column name: with the dropped column above; with a column someone added
-- (NULL in latest(), which reads the per-object rows; history_of() returns
-- it); and with columns added or dropped after the calling statement started
-- (a cursor opened before the ALTER returns the row type it started with).
SELECT object_id, status FROM status_history.latest(ARRAY['d10']);
BEGIN;
ALTER TABLE status_history.history ADD COLUMN scratch2 int DEFAULT 7;
SELECT object_id, status, scratch2 FROM status_history.latest(ARRAY['d10']);
SELECT count(*), count(scratch2), min(scratch2) FROM status_history.history_of('d10');
DECLARE before_drop CURSOR FOR SELECT object_id, status, generation FROM status_history.history_of('d10') LIMIT 1;
DECLARE latest_before_drop CURSOR FOR SELECT object_id, status, generation FROM status_history.latest(ARRAY['d10']);
ALTER TABLE status_history.history DROP COLUMN scratch2;
FETCH ALL FROM before_drop;
FETCH ALL FROM latest_before_drop;
DECLARE before_add CURSOR FOR SELECT object_id, status FROM status_history.history_of('d10') LIMIT 1;
ALTER TABLE status_history.history ADD COLUMN scratch3 text;
FETCH ALL FROM before_add;
ROLLBACK;
-- A column of the state tables that is gone (renamed here; dropped by hand,
-- or a library newer than the tables) is named in a clear error (42703).
BEGIN;
ALTER TABLE status_history.objects RENAME COLUMN status_since TO since_renamed;
SELECT status FROM status_history.report('d10-renamed', 'running');
ROLLBACK;
\set VERBOSITY sqlstate
BEGIN;
ALTER TABLE status_history.replica_state RENAME COLUMN last_seen_at TO seen_renamed;
SELECT status FROM status_history.report('d10', 'paused', replica_id => 'r-renamed', generation => 4);
ROLLBACK;
\set VERBOSITY default

-- 13. A reconnect() without a list raises a floor: an object nobody reported
--     on yet is fenced too, and so is a replica's next new object.
SELECT count(*) > 0 AS restamped FROM status_history.reconnect(7);
SELECT object_id, stale FROM status_history.report('d13-new', 'running', generation => 6);
SELECT object_id, stale FROM status_history.report('d13-new2', 'running', generation => 7);
SELECT fence FROM status_history.statuses WHERE object_id = 'd13-new2';
SELECT count(*) FROM status_history.reconnect(9, 'r9');
SELECT object_id, stale FROM status_history.report('d13-r9', 'running', replica_id => 'r9', generation => 8);
SELECT object_id, stale FROM status_history.report('d13-r8', 'running', replica_id => 'r8', generation => 8);
SELECT replica_id, generation FROM status_history.floors ORDER BY replica_id NULLS FIRST;
-- A lower floor is refused like a lower fence.
SELECT * FROM status_history.reconnect(6);
SELECT * FROM status_history.reconnect(8, 'r9');

-- report_many(): rows inserted in the order given, objects locked sorted.
SELECT object_id, status, error, replica_id, generation
  FROM status_history.report_many(ARRAY['rm-b', 'rm-a', 'rm-b'], ARRAY['starting', 'running', 'running'],
                                  errors => ARRAY[NULL, 'e', NULL], generations => ARRAY[9, 9, 9]::bigint[]);
SELECT * FROM status_history.report_many(ARRAY['x'], ARRAY['running', 'running']);
SELECT * FROM status_history.report_many(NULL, ARRAY['running']);
SELECT state_mismatches() AS at_end;

-- From the hostile review: an owner's trigger, CHECK constraint or policy
-- that runs a query after the extension's trigger, before the row is stored.
CREATE TABLE replicas (id text PRIMARY KEY);
INSERT INTO replicas VALUES ('r1');
CREATE FUNCTION validate_replica() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM 1 FROM public.replicas WHERE id = NEW.replica_id; RETURN NEW; END $$;
CREATE TRIGGER validate_replica BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION validate_replica();
SELECT status FROM status_history.report('v1', 'running', replica_id => 'r1', generation => 10);
SELECT status FROM status_history.report('v1', 'stalled', replica_id => 'r1', generation => 10);
INSERT INTO status_history.history (object_id, status, replica_id, generation) VALUES ('v2', 'running', 'r1', 10), ('v2', 'paused', 'r1', 10);
DROP TRIGGER validate_replica ON status_history.history;
CREATE FUNCTION known_replica(r text) RETURNS boolean LANGUAGE sql STABLE AS
    $$ SELECT r IS NULL OR EXISTS (SELECT 1 FROM public.replicas WHERE id = r) $$;
ALTER TABLE status_history.history ADD CONSTRAINT known_replica CHECK (known_replica(replica_id)) NOT VALID;
SELECT status FROM status_history.report('v3', 'running', replica_id => 'r1', generation => 10);
SELECT status FROM status_history.report('v3', 'stalled', replica_id => 'r1', generation => 10);
ALTER TABLE status_history.history DROP CONSTRAINT known_replica;
SELECT object_id, status FROM status_history.statuses WHERE object_id IN ('v1', 'v2', 'v3') ORDER BY 1;
SELECT state_mismatches() AS after_owner_checks;

-- A dropped report skipped by ON CONFLICT does not make the next row stale;
-- a dropped report imported before the current one is stale.
CREATE UNIQUE INDEX history_idempotency ON status_history.history (object_id, reported_at);
INSERT INTO status_history.history (object_id, status, reported_at, generation) VALUES ('c1', 'running', '2026-01-01 00:00:00+00', 10);
INSERT INTO status_history.history (object_id, status, reported_at, generation)
VALUES ('c1', 'dropped', '2026-01-01 00:00:00+00', 10), ('c1', 'stalled', '2026-01-02 00:00:00+00', 10) ON CONFLICT DO NOTHING;
INSERT INTO status_history.history (occurred_at, object_id, status, generation) VALUES ('2020-06-01 00:00:00+00', 'c1', 'dropped', 10);
SELECT status, stale FROM status_history.history WHERE object_id = 'c1' ORDER BY occurred_at;
DROP INDEX status_history.history_idempotency;
SELECT state_mismatches() AS after_skipped_drop;

-- A user's BEFORE trigger that reports on another object while the outer row
-- is still in flight (not stored yet): both objects' state stays right.
CREATE FUNCTION nest_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.object_id = 'nx' THEN
        PERFORM status_history.report('ny', NEW.status, generation => NEW.generation);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER zz_nest BEFORE INSERT ON status_history.history FOR EACH ROW EXECUTE FUNCTION nest_report();
SELECT status FROM status_history.report('nx', 'running', replica_id => 'r1', generation => 100);
SELECT state_mismatches() AS after_nested_report;
SELECT status FROM status_history.report('nx', 'stalled', replica_id => 'r1', generation => 100);
SELECT object_id, status FROM status_history.statuses WHERE object_id IN ('nx', 'ny') ORDER BY 1;
SELECT state_mismatches() AS after_second_nested_report;
DROP TRIGGER zz_nest ON status_history.history;

-- A report a user's later trigger skips (RETURN NULL) was not stored:
-- report() returns NULL for it, report_many() only the rows stored.
CREATE FUNCTION skip_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN CASE WHEN NEW.object_id LIKE 'skip%' THEN NULL ELSE NEW END;
END $$;
CREATE TRIGGER zz_skip BEFORE INSERT ON status_history.history FOR EACH ROW EXECUTE FUNCTION skip_report();
SELECT r IS NULL AS skipped FROM status_history.report('skip1', 'running', generation => 100) AS r;
SELECT object_id, status FROM status_history.report_many(ARRAY['skip2', 'kept2', 'skip3'],
       ARRAY['running', 'running', 'stalled'], generations => ARRAY[100, 100, 100]::bigint[]);
SELECT count(*) AS skipped_rows FROM status_history.history WHERE object_id LIKE 'skip%';
SELECT state_mismatches() AS after_skipped_reports;
DROP TRIGGER zz_skip ON status_history.history;

-- A row skipped by ON CONFLICT DO NOTHING on an exclusion constraint does not
-- become current.
ALTER TABLE status_history.history ADD CONSTRAINT one_error EXCLUDE USING btree (error WITH =);
SELECT status FROM status_history.report('ex', 'running', error => 'e1', replica_id => 'r1', generation => 100);
SELECT status FROM status_history.report('ex', 'running', replica_id => 'r1', generation => 100);
INSERT INTO status_history.history (object_id, status, error, replica_id, generation)
VALUES ('ex', 'stalled', 'e1', 'r1', 100) ON CONFLICT DO NOTHING;
SELECT object_id, status, error FROM status_history.statuses WHERE object_id = 'ex';
SELECT state_mismatches() AS after_exclusion_skip;
ALTER TABLE status_history.history DROP CONSTRAINT one_error;

-- DROP and CREATE EXTENSION inside one transaction: nothing cached survives.
SELECT count(*) FROM status_history.reconnect(70, NULL, ARRAY['dc']);
BEGIN;
SELECT stale FROM status_history.report('dc', 'running', generation => 70);
DROP EXTENSION status_history CASCADE;
CREATE EXTENSION status_history;
SELECT stale FROM status_history.report('dc', 'running', generation => 1);
SELECT stale FROM status_history.report('dc', 'stalled', generation => 1);
COMMIT;
SELECT object_id, status, fence FROM status_history.statuses;
SELECT state_mismatches() AS after_recreate;

DROP TABLE replicas;
DROP FUNCTION validate_replica(), known_replica(text);
DROP FUNCTION state_mismatches(), try_jsonb(text), nested_fail(text), limited_insert(), nest_report(), skip_report();
DROP EXTENSION status_history;
DROP EXTENSION plperl;
DROP ROLE sh_reporter;
