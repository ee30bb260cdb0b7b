-- The write path: only rows PostgreSQL stored decide an object's state
-- (docs/WRITE_PATH.md).  Each case below made an acknowledged report vanish
-- or go stale in 0.3.0, which decided the state in the BEFORE trigger from
-- rows that might never be stored.
CREATE EXTENSION status_history;

\i sql/oracle.psql

-- 1. A row skipped by ON CONFLICT DO NOTHING, with a row of another object
--    between it and the next row of its object, decides nothing: 'stalled'
--    is not "after dropped", and becomes current.
CREATE UNIQUE INDEX report_idem ON status_history.history (object_id, reported_at);
INSERT INTO status_history.history (object_id, status, reported_at)
VALUES ('a', 'running', '2026-01-01 00:00:00+00');
INSERT INTO status_history.history (object_id, status, reported_at) VALUES
    ('a', 'dropped', '2026-01-01 00:00:00+00'),
    ('b', 'running', '2026-01-01 00:00:05+00'),
    ('a', 'stalled', '2026-01-01 00:00:10+00')
ON CONFLICT DO NOTHING;
SELECT object_id, status, stale FROM status_history.history ORDER BY occurred_at;
SELECT object_id, status FROM status_history.statuses ORDER BY object_id;
-- The same skip by a BEFORE trigger of the user's that returns NULL.
CREATE FUNCTION public.skip_dropped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.status = 'dropped' THEN RETURN NULL; END IF; RETURN NEW; END $$;
CREATE TRIGGER zz_skip BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.skip_dropped();
INSERT INTO status_history.history (object_id, status, reported_at) VALUES
    ('a', 'dropped', '2026-01-01 00:01:00+00'),
    ('b', 'stalled', '2026-01-01 00:01:05+00'),
    ('a', 'running', '2026-01-01 00:01:10+00');
SELECT object_id, status, stale FROM status_history.history
 WHERE reported_at >= '2026-01-01 00:01:00+00' ORDER BY occurred_at;
DROP TRIGGER zz_skip ON status_history.history;
DROP FUNCTION public.skip_dropped();
DROP INDEX status_history.report_idem;
SELECT state_mismatches() AS after_skips;

-- 2. A report made while another row is in flight at the same trigger depth
--    (from a CHECK constraint) leaves both objects' states right.
CREATE FUNCTION public.audit(o text, s text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN IF o = 'ck1' THEN PERFORM status_history.report('audit-log', s); END IF; RETURN true; END $$;
ALTER TABLE status_history.history ADD CONSTRAINT audited CHECK (public.audit(object_id, status)) NOT VALID;
SELECT status FROM status_history.report('ck1', 'running');
SELECT object_id, status FROM status_history.statuses WHERE object_id IN ('ck1', 'audit-log') ORDER BY 1;
-- ... but a report from the constraint on the object in flight is stored
-- first (stamped later) and was decided without the outer report: storing
-- the outer one after it is refused, nothing is stored.
CREATE OR REPLACE FUNCTION public.audit(o text, s text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN IF o = 'ck2' AND s = 'running' THEN PERFORM status_history.report('ck2', 'stalled'); END IF; RETURN true; END $$;
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('ck2', 'running');
\set VERBOSITY default
SELECT count(*) AS ck2_rows FROM status_history.history WHERE object_id = 'ck2';
-- A dropped report in flight while the constraint reports on the same object:
-- that report was decided without the dropped one, so storing the dropped
-- report after it is refused.
CREATE OR REPLACE FUNCTION public.audit(o text, s text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN IF o = 'ck3' AND s = 'dropped' THEN PERFORM status_history.report('ck3', 'running'); END IF; RETURN true; END $$;
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('ck3', 'dropped');
\set VERBOSITY default
ALTER TABLE status_history.history DROP CONSTRAINT audited;
DROP FUNCTION public.audit(text, text);
SELECT state_mismatches() AS after_constraints;

-- A row security WITH CHECK policy and a generated column that report.
CREATE ROLE sh_wp_reporter;
GRANT INSERT ON status_history.history TO sh_wp_reporter;
CREATE FUNCTION public.policy_report(o text) RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog AS $$
BEGIN IF o = 'pol1' THEN PERFORM status_history.report('pol-audit', 'running'); END IF; RETURN true; END $$;
ALTER TABLE status_history.history ENABLE ROW LEVEL SECURITY;
CREATE POLICY wp_insert ON status_history.history FOR INSERT TO sh_wp_reporter
    WITH CHECK (public.policy_report(object_id));
SET ROLE sh_wp_reporter;
SELECT status FROM status_history.report('pol1', 'stalled');
RESET ROLE;
DROP POLICY wp_insert ON status_history.history;
ALTER TABLE status_history.history DISABLE ROW LEVEL SECURITY;
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'pol%' ORDER BY 1;
CREATE FUNCTION public.gen_report(o text) RETURNS integer LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN IF o = 'gen1' THEN PERFORM status_history.report('gen-audit', 'paused'); END IF; RETURN 1; END $$;
ALTER TABLE status_history.history ADD COLUMN audit_marker integer GENERATED ALWAYS AS (public.gen_report(object_id)) STORED;
SELECT status FROM status_history.report('gen1', 'running');
ALTER TABLE status_history.history DROP COLUMN audit_marker;
DROP FUNCTION public.gen_report(text);
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'gen%' ORDER BY 1;
SELECT state_mismatches() AS after_policy_and_generated;

-- 3. Reports nested 40 trigger levels deep: a BEFORE trigger that reports on
--    the next object, whose row reports again.
CREATE FUNCTION public.nest() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE n integer;
BEGIN
    IF NEW.object_id LIKE 'nest-%' THEN
        n := split_part(NEW.object_id, '-', 2)::integer;
        IF n < 40 THEN
            PERFORM status_history.report('nest-' || (n + 1), NEW.status);
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER zz_nest BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.nest();
SELECT status FROM status_history.report('nest-1', 'starting');
SELECT status FROM status_history.report('nest-1', 'running');
DROP TRIGGER zz_nest ON status_history.history;
DROP FUNCTION public.nest();
SELECT count(*) AS nested_objects, count(*) FILTER (WHERE status = 'running') AS running
  FROM status_history.statuses WHERE object_id LIKE 'nest-%';
SELECT state_mismatches() AS after_nesting;

-- 4. A BEFORE trigger that runs after the extension's and changes the report.
SELECT count(*) FROM status_history.reconnect(5, object_ids => ARRAY['t4']);
-- Changing the replica: the key and report() follow the stored row.
CREATE FUNCTION public.move_replica() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.replica_id := 'r-moved'; RETURN NEW; END $$;
CREATE TRIGGER zz_move BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.move_replica();
SELECT replica_id, status, generation, stale FROM status_history.report('t4', 'running', replica_id => 'r1', generation => 5);
DROP TRIGGER zz_move ON status_history.history;
SELECT replica_id, status FROM status_history.replica_statuses WHERE object_id = 't4' ORDER BY 1;
-- Lowering the generation below the fence after the report was found not
-- stale: refused, nothing stored.
CREATE FUNCTION public.lower_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.generation := 1; RETURN NEW; END $$;
CREATE TRIGGER zz_lower BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.lower_generation();
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('t4', 'stalled', generation => 5);
INSERT INTO status_history.history (object_id, status, generation) VALUES ('t4', 'stalled', 5);
\set VERBOSITY default
DROP TRIGGER zz_lower ON status_history.history;
-- Clearing the stale flag of a fenced report: refused too.
CREATE FUNCTION public.unstale() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.stale := false; RETURN NEW; END $$;
CREATE TRIGGER zz_unstale BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.unstale();
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('t4', 'paused', generation => 2);
\set VERBOSITY default
DROP TRIGGER zz_unstale ON status_history.history;
-- Raising the generation of a fenced report: stored stale (as decided), never current.
CREATE FUNCTION public.raise_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.generation := 9; RETURN NEW; END $$;
CREATE TRIGGER zz_raise BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.raise_generation();
SELECT status, generation, stale FROM status_history.report('t4', 'ceased', generation => 2);
DROP TRIGGER zz_raise ON status_history.history;
DROP FUNCTION public.move_replica(), public.lower_generation(), public.unstale(), public.raise_generation();
SELECT status, replica_id FROM status_history.statuses WHERE object_id = 't4';
SELECT count(*) AS t4_rows FROM status_history.history WHERE object_id = 't4';
SELECT state_mismatches() AS after_changed_rows;

-- MERGE ... WHEN NOT MATCHED THEN INSERT reports like an INSERT.
CREATE TABLE public.incoming (object_id text, status text);
INSERT INTO public.incoming VALUES ('m1', 'running'), ('m2', 'stalled'), ('m1', 'paused');
MERGE INTO status_history.history AS h
USING public.incoming AS i ON false
WHEN NOT MATCHED THEN INSERT (object_id, status) VALUES (i.object_id, i.status);
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'm_' ORDER BY 1;
DROP TABLE public.incoming;

-- Reports from an AFTER ROW trigger and from an AFTER STATEMENT trigger with
-- a transition table on another table.
CREATE TABLE public.events (object_id text, status text);
CREATE FUNCTION public.events_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN PERFORM status_history.report(NEW.object_id, NEW.status, 'row'); RETURN NULL; END $$;
CREATE FUNCTION public.events_stmt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO status_history.history (object_id, status, error)
    SELECT n.object_id || '-s', n.status, 'statement' FROM new_rows AS n;
    RETURN NULL;
END $$;
CREATE TRIGGER events_row AFTER INSERT ON public.events FOR EACH ROW EXECUTE FUNCTION public.events_row();
CREATE TRIGGER events_stmt AFTER INSERT ON public.events REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.events_stmt();
INSERT INTO public.events VALUES ('ev', 'starting'), ('ev', 'running'), ('ev2', 'stalled');
SELECT object_id, status, error FROM status_history.statuses WHERE object_id LIKE 'ev%' ORDER BY 1;
DROP TABLE public.events;
DROP FUNCTION public.events_row(), public.events_stmt();
SELECT state_mismatches() AS after_merge_and_after_triggers;

-- 5. A stale controller cannot reconnect a list of objects either: the
--    replica's floor and the database-wide floor count.
SELECT count(*) FROM status_history.reconnect(7, 'r5');
\set VERBOSITY sqlstate
SELECT count(*) FROM status_history.reconnect(6, 'r5', ARRAY['f1']);
\set VERBOSITY default
SELECT count(*) FROM status_history.reconnect(7, 'r5', ARRAY['f1']);
SELECT count(*) FROM status_history.reconnect(8);
\set VERBOSITY sqlstate
SELECT count(*) FROM status_history.reconnect(7, NULL, ARRAY['f2']);
SELECT count(*) FROM status_history.reconnect(7, 'r6', ARRAY['f2']);
\set VERBOSITY default
SELECT object_id, fence FROM status_history.objects WHERE object_id IN ('f1', 'f2') ORDER BY 1;

-- Imported stamps before 2000 (negative in PostgreSQL's epoch) are stamps
-- like any other: the key's last_seen_at is its newest row's, and a report
-- after an imported dropped report is stale.
INSERT INTO status_history.history (occurred_at, object_id, status, generation)
VALUES ('1999-01-01 00:00:00+00', 'old', 'running', 8), ('1999-01-02 00:00:00+00', 'old', 'dropped', 8);
SELECT replica_id, last_at, last_seen_at FROM status_history.replica_state WHERE object_id = 'old';
SELECT stale FROM status_history.report('old', 'running', generation => 8);
-- An import of old history raises the clock's persisted bound above the
-- present once, not a second above each imported row (a WAL flush each).
INSERT INTO status_history.history (occurred_at, object_id, status)
SELECT '2024-03-01'::timestamptz + i * interval '2 s', 'past', 'running' FROM generate_series(1, 50) AS i;
SELECT last_value > (extract(epoch FROM now() - '2000-01-01 00:00:00+00') * 1000000)::bigint AS bound_above_now
  FROM status_history.clock_bound;
SELECT state_mismatches() AS after_old_stamps;

-- A report made from a constraint of another report on the same key, while
-- that one is in flight: it was found to repeat the key's newest stored
-- row, although the row in flight (stamped before it) differs.  Storing the
-- row in flight would leave the later report lost: refused.
SELECT status FROM status_history.report('x', 'stalled', replica_id => 'r1', generation => 8);
CREATE FUNCTION public.chk(o text, s text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF o = 'x' AND s = 'running' THEN
        PERFORM status_history.report(o, 'stalled', replica_id => 'r1', generation => 8);
    END IF;
    RETURN true;
END $$;
ALTER TABLE status_history.history ADD CONSTRAINT c CHECK (public.chk(object_id, status)) NOT VALID;
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('x', 'running', replica_id => 'r1', generation => 8);
\set VERBOSITY default
ALTER TABLE status_history.history DROP CONSTRAINT c;
SELECT status, stale FROM status_history.history WHERE object_id = 'x' ORDER BY occurred_at;
SELECT status FROM status_history.statuses WHERE object_id = 'x';
SELECT state_mismatches() AS after_repeat_in_flight;

-- The same across keys (latest wins): r1 said stalled; while r2's running
-- is in flight, r1 says stalled again.  Found to repeat r1's row because
-- that was the object's current report; storing r2's running (stamped
-- before it) would make running current and lose r1's report: refused.
CREATE OR REPLACE FUNCTION public.chk(o text, s text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    IF o = 'xk' AND s = 'running' THEN
        PERFORM status_history.report(o, 'stalled', replica_id => 'r1', generation => 8);
    END IF;
    RETURN true;
END $$;
SELECT status FROM status_history.report('xk', 'stalled', replica_id => 'r1', generation => 8);
ALTER TABLE status_history.history ADD CONSTRAINT c CHECK (public.chk(object_id, status)) NOT VALID;
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('xk', 'running', replica_id => 'r2', generation => 8);
\set VERBOSITY default
ALTER TABLE status_history.history DROP CONSTRAINT c;
DROP FUNCTION public.chk(text, text);
SELECT status, replica_id FROM status_history.statuses WHERE object_id = 'xk';

-- reconnect() from a trigger of a report on an object in its scope would
-- re-stamp the object's report before the one in flight: refused too.
SELECT status FROM status_history.report('rc', 'running', generation => 8);
CREATE FUNCTION public.takeover() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.error = 'takeover' THEN
        PERFORM status_history.reconnect(9, NULL, ARRAY[NEW.object_id]);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER zz_takeover BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.takeover();
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('rc', 'stalled', error => 'takeover', generation => 8);
\set VERBOSITY default
DROP TRIGGER zz_takeover ON status_history.history;
DROP FUNCTION public.takeover();
SELECT status, generation FROM status_history.statuses WHERE object_id = 'rc';

-- An import into one object exempts only that object's rows from the
-- checks (an importer gives stale flags): a report on another object in the
-- same transaction whose generation a later trigger lowers is still refused.
SELECT count(*) FROM status_history.reconnect(9, object_ids => ARRAY['t9']);
CREATE FUNCTION public.lower_generation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.error = 'lower' THEN NEW.generation := 1; END IF; RETURN NEW; END $$;
CREATE TRIGGER zz_lower BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.lower_generation();
BEGIN;
INSERT INTO status_history.history (occurred_at, object_id, status, generation)
VALUES ('2025-06-01 00:00:00+00', 'archive', 'ceased', 9);
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('t9', 'stalled', error => 'lower', generation => 9);
\set VERBOSITY default
ROLLBACK;
-- Nor does an import into the object that was rolled back to a savepoint.
BEGIN;
SAVEPOINT before_import;
INSERT INTO status_history.history (occurred_at, object_id, status, generation)
VALUES ('2025-06-01 00:00:00+00', 't9', 'paused', 9);
ROLLBACK TO SAVEPOINT before_import;
\set VERBOSITY sqlstate
SELECT status FROM status_history.report('t9', 'stalled', error => 'lower', generation => 9);
\set VERBOSITY default
ROLLBACK;
DROP TRIGGER zz_lower ON status_history.history;
DROP FUNCTION public.lower_generation();

-- A key whose first row is a controller's (retire_replica()'s paused
-- report) was never seen: its last_seen_at is that row's stamp, not a
-- stamp of no row.
SELECT status FROM status_history.report('src', 'running', replica_id => 'rr1', generation => 9);
SELECT status_history.retire_replica('rr1');
SELECT replica_id, last_seen_at = last_at AS seen_at_its_row
  FROM status_history.replica_state WHERE object_id = 'src' ORDER BY replica_id NULLS LAST;

-- A report in the same statement as an import into its object's past is a
-- sighting of its key like any other.
SELECT occurred_at AS first_at FROM status_history.report('xp', 'running', replica_id => 'rp1', generation => 9) \gset
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
VALUES ('2025-01-01', 'xp', 'paused', 'rp0', 9), (NULL, 'xp', 'stalled', 'rp1', 9);
SELECT replica_id, last_seen_at >= last_at AS seen, last_at > :'first_at' AS newer
  FROM status_history.replica_state WHERE object_id = 'xp' ORDER BY replica_id;
SELECT state_mismatches() AS after_in_flight_and_imports;

-- The largest bigint stands for a retired replica's floor: no generation.
\set VERBOSITY sqlstate
SELECT count(*) FROM status_history.reconnect(9223372036854775807, 'r1');
SELECT status FROM status_history.report('x', 'running', generation => 9223372036854775807);
SELECT status_history.retire_replica('r1', 9223372036854775807);
\set VERBOSITY default

-- A subtransaction that aborts while rows of an object wait for their AFTER
-- events: the state is read again, and still knows which rows' events are
-- due and which came.  Row 2's WHERE makes an audit report on x (its event
-- comes while row 1 waits), row 3's one on x that it rolls back; x is
-- current right after the statement.  With a cache of one object (which
-- drops states), row 2 a repeat of row 1 (written while row 1 waits) and
-- row 3's rolled-back report: the state dropped would not know row 1 waits.
CREATE FUNCTION public.side_reports(n int, obj text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF n = 2 THEN
    PERFORM status_history.report(obj, 'running', error => 'audit', generation => 9);
  ELSIF n = 3 THEN
    BEGIN
      PERFORM status_history.report(obj, 'ceased', generation => 9);
      RAISE EXCEPTION 'undo' USING ERRCODE = 'P0099';
    EXCEPTION WHEN SQLSTATE 'P0099' THEN NULL;
    END;
  END IF;
  RETURN true;
END $$;
BEGIN;
INSERT INTO status_history.history (object_id, status, generation)
SELECT v.o, v.s, 9 FROM (VALUES (1, 'sx', 'starting'), (2, 'sy', 'running'), (3, 'sz', 'running')) AS v(n, o, s)
 WHERE public.side_reports(v.n, 'sx');
SELECT object_id, status, error FROM status_history.statuses WHERE object_id IN ('sx', 'sy', 'sz') ORDER BY 1;
SELECT state_mismatches() AS inside_the_transaction;
COMMIT;
BEGIN;
SET LOCAL status_history.cache_max_objects = 1;
INSERT INTO status_history.history (object_id, status, replica_id, generation)
SELECT v.o, v.s, 'rc', 9 FROM (VALUES (1, 'cx', 'starting'), (2, 'cx', 'starting'), (3, 'cy', 'running')) AS v(n, o, s)
 WHERE public.side_reports(CASE WHEN v.n = 3 THEN 3 END, 'cx');
SELECT object_id, status, error FROM status_history.statuses WHERE object_id IN ('cx', 'cy') ORDER BY 1;
SELECT state_mismatches() AS with_one_cached_object;
COMMIT;
DROP FUNCTION public.side_reports(int, text);

-- A backfill (an import without stale) stamped before the object's dropped
-- report is not "after dropped": it is not stale; one after it is.
SELECT status FROM status_history.report('bf', 'running', generation => 9);
SELECT occurred_at AS dropped_at FROM status_history.report('bf', 'dropped', generation => 9) \gset
SET status_history.max_import_lead = -1;  -- (earlier imports left the clock ahead)
INSERT INTO status_history.history (occurred_at, object_id, status, generation)
VALUES (:'dropped_at'::timestamptz - interval '30 days', 'bf', 'starting', 9),
       (:'dropped_at'::timestamptz - interval '29 days', 'bf', 'running', 9),
       (:'dropped_at'::timestamptz + interval '1 ms', 'bf', 'running', 9);
RESET status_history.max_import_lead;
SELECT status, stale, occurred_at > :'dropped_at' AS after_dropped
  FROM status_history.history WHERE object_id = 'bf' ORDER BY occurred_at;
SELECT state_mismatches() AS after_backfill;

-- Imports into the past fold only their key and the object again, walking
-- the newest rows: against brute force, for rows in descending stamp order
-- (every row below the last), supplied stale flags, several keys, long runs
-- of one status, and a backfill below a newer report.
SELECT status FROM status_history.report('pd2', 'running', replica_id => 'r1', generation => 9);
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation, stale)
SELECT '2023-07-03 00:00:00.123457'::timestamptz + i * interval '1 s' + CASE o WHEN 'pd' THEN interval '0' ELSE interval '1 us' END, o,
       (ARRAY['running', 'running', 'stalled', 'running', 'paused', 'running', 'running'])[1 + (i * 5) % 7],
       CASE WHEN i % 4 = 0 THEN NULL ELSE 'r' || (i % 3) END, 9,
       CASE WHEN i % 11 = 0 THEN true END
  FROM generate_series(1, 300) i, (VALUES ('pd'), ('pd2')) AS v(o)
 ORDER BY i DESC;
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
SELECT '2023-05-05 00:00:00.000011'::timestamptz + i * interval '1 s', 'pd2',
       CASE WHEN i < 150 THEN 'running' ELSE 'stalled' END, 'r' || (i % 2), 9
  FROM generate_series(1, 200) i ORDER BY i;
SELECT count(*) AS past_rows FROM status_history.history WHERE object_id IN ('pd', 'pd2');
SELECT state_mismatches() AS after_past_imports;

-- One statement, rows of one object: a report is decided before the rows
-- before it are folded only when they cannot change its verdict.  After a
-- dropped row: stale; the same key and status again: a repeat (no row);
-- another key's row between: latest wins, a row.
INSERT INTO status_history.history (object_id, status, replica_id, generation)
VALUES ('sp1', 'running', 'r1', 9), ('sp1', 'dropped', 'r1', 9), ('sp1', 'running', 'r2', 9),
       ('sp2', 'running', 'r1', 9), ('sp2', 'stalled', 'r1', 9), ('sp2', 'stalled', 'r1', 9),
       ('sp3', 'stalled', 'r1', 9), ('sp3', 'running', 'r2', 9), ('sp3', 'stalled', 'r1', 9);
SELECT object_id, status, replica_id, stale FROM status_history.history
 WHERE object_id LIKE 'sp_' ORDER BY occurred_at;
SELECT object_id, status, replica_id FROM status_history.statuses WHERE object_id LIKE 'sp_' ORDER BY 1;
-- A later trigger turning a row into a dropped report: the row after it is
-- decided once that row is stored and folded (as dropped), so it is stale.
CREATE FUNCTION public.drop_it() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.error = 'drop it' THEN NEW.status := 'dropped'; END IF; RETURN NEW; END $$;
CREATE TRIGGER zz_drop_it BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION public.drop_it();
\set VERBOSITY sqlstate
INSERT INTO status_history.history (object_id, status, error, generation)
VALUES ('sp4', 'running', 'drop it', 9), ('sp4', 'stalled', NULL, 9);
\set VERBOSITY default
DROP TRIGGER zz_drop_it ON status_history.history;
DROP FUNCTION public.drop_it();
SELECT status, stale FROM status_history.history WHERE object_id = 'sp4' ORDER BY occurred_at;
SELECT state_mismatches() AS after_undecided_rows;

-- Reports in one statement as separate statements would decide them: the
-- third repeats r1's running (the current report, r2's, says the same).
SELECT status FROM status_history.report('rp', 'stalled', replica_id => 'r1', generation => 9);
INSERT INTO status_history.history (object_id, status, replica_id, generation)
VALUES ('rp', 'running', 'r1', 9), ('rp', 'running', 'r2', 9), ('rp', 'running', 'r1', 9);
SELECT status, replica_id FROM status_history.history WHERE object_id = 'rp' ORDER BY occurred_at;
-- A state read again in the middle of a statement (a subtransaction that
-- touched the object rolled back) still knows a dropped report was handed
-- over: the row after it is stale, not refused.
CREATE FUNCTION public.poke(what text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    EXECUTE what;
    RAISE EXCEPTION 'undo';
  EXCEPTION WHEN raise_exception THEN NULL;
  END;
  RETURN 'stalled';
END $$;
SELECT status FROM status_history.report('pk', 'running', replica_id => 'r1', generation => 9);
INSERT INTO status_history.history (object_id, status, replica_id, generation)
VALUES ('pk', 'dropped', NULL, 9),
       ('pk', public.poke($q$SELECT status_history.report('pk', 'paused', replica_id => 'zz', generation => 9)$q$), 'r1', 9);
SELECT status, stale FROM status_history.history WHERE object_id = 'pk' ORDER BY occurred_at;
DROP FUNCTION public.poke(text);
-- A foreign key referencing the objects (its triggers fire on the
-- write-backs), and a publication of all tables (updates of the state
-- tables are published): reports go on.
CREATE TABLE public.fk_ref (o text REFERENCES status_history.objects (object_id));
SELECT status FROM status_history.report('fk', 'running', generation => 9);
INSERT INTO public.fk_ref VALUES ('fk');
SELECT status FROM status_history.report('fk', 'stalled', generation => 9);
DROP TABLE public.fk_ref;
SET client_min_messages = error;   -- (wal_level may be too low to publish: a warning)
CREATE PUBLICATION sh_wp_all FOR ALL TABLES;
RESET client_min_messages;
SELECT status FROM status_history.report('pb', 'running', replica_id => 'r1', generation => 9);
SELECT status FROM status_history.report('pb', 'stalled', replica_id => 'r1', generation => 9);
SELECT count(*) FROM status_history.reconnect(10, object_ids => ARRAY['pb']);
DROP PUBLICATION sh_wp_all;
SELECT state_mismatches() AS after_triggers_and_publications;
-- A superuser's table rewrite in the middle of a reporting transaction (a
-- new file with fewer blocks): the rows in hand are only hints, the reports
-- go on.
SELECT count(*) FROM (SELECT status_history.report('rw' || i, 'running', replica_id => 'r1', generation => 9)
                      FROM generate_series(1, 50) i) s;
BEGIN;
SELECT count(*) FROM (SELECT status_history.report('rw' || i, 'stalled', replica_id => 'r1', generation => 9)
                      FROM generate_series(1, 20) i) s;
SELECT count(*) FROM (SELECT status_history.report('rw' || i, 'paused', replica_id => 'r1', generation => 9)
                      FROM generate_series(1, 60) i) s;
ALTER TABLE status_history.objects ADD COLUMN note text DEFAULT 'x' || random();
SELECT count(*) FROM (SELECT status_history.report('rw' || i, 'starting', replica_id => 'r2', generation => 9)
                      FROM generate_series(30, 80) i) s;
SELECT state_mismatches() AS in_rewritten_objects;
ALTER TABLE status_history.history ADD COLUMN note text DEFAULT 'x' || random();
SELECT count(*) FROM (SELECT status_history.report('rw' || i, 'running', replica_id => 'r2', generation => 9)
                      FROM generate_series(30, 80) i) s;
ALTER TABLE status_history.history DROP COLUMN note;   -- (latest() has no note to compare)
SELECT state_mismatches() AS in_rewritten_history;
ROLLBACK;
SELECT state_mismatches() AS after_rewrite;

-- history_stored(), the fold trigger's WHEN, called by hand: it folds only a
-- row this transaction stored (39P01 else), and one folded already refuses
-- the statement (27000) and changes nothing.
-- A block past the history's end is no row either: the call neither reads it
-- (XX001, as if the file were corrupt) nor extends the file (block
-- 4294967295 is PostgreSQL's "new block").
SELECT pg_catalog.pg_relation_size('status_history.history') AS history_size_before \gset
\set VERBOSITY sqlstate
SELECT status_history.history_stored('(0,1)');
SELECT status_history.history_stored('(4294967295,1)');
SELECT status_history.history_stored('(4294967295,1)');
SELECT status_history.history_stored('(100000,1)');
\set VERBOSITY default
SELECT pg_catalog.pg_relation_size('status_history.history') = :history_size_before AS history_not_extended;
\set VERBOSITY sqlstate
BEGIN;
SELECT status FROM status_history.report('hs', 'running', replica_id => 'r1', generation => 9);
SELECT status_history.history_stored(ctid) FROM status_history.history WHERE object_id = 'hs';
ROLLBACK;
\set VERBOSITY default
SELECT status FROM status_history.report('hs', 'stalled', replica_id => 'r1', generation => 9);
SELECT status, stale FROM status_history.history WHERE object_id = 'hs' ORDER BY occurred_at;
SELECT state_mismatches() AS after_history_stored_by_hand;

-- From the review of folding rows as they are stored: a subtransaction that
-- aborts in the middle of a statement after it reported on an object whose
-- earlier rows were folded and not written yet, a write by another statement
-- before the statement ends (the exception handler's report), and a later
-- rollback to a savepoint that touches the object: the object's state is
-- read again and caught up from its stored rows, none of them lost.
CREATE FUNCTION public.abort_between(g int) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  IF g = 2 THEN
    BEGIN
      PERFORM status_history.report('ab', 'stalled', generation => 100);
      RAISE EXCEPTION 'boom';
    EXCEPTION WHEN others THEN PERFORM status_history.report('ab-errors', 'stalled', generation => 100);
    END;
  END IF;
  RETURN CASE g WHEN 1 THEN 'running' ELSE 'paused' END;
END $$;
BEGIN;
INSERT INTO status_history.history (object_id, status, generation)
SELECT 'ab', public.abort_between(g), 100 FROM generate_series(1, 2) AS g;
SELECT status FROM status_history.statuses WHERE object_id = 'ab';
SELECT state_mismatches() AS after_abort_between;
SAVEPOINT q;
SELECT status FROM status_history.report('ab', 'ceased', generation => 100);
ROLLBACK TO q;
COMMIT;
SELECT status FROM status_history.statuses WHERE object_id = 'ab';
SELECT state_mismatches() AS after_abort_between_committed;
DROP FUNCTION public.abort_between(int);

-- AFTER STATEMENT triggers of yours see the state their statement's rows
-- made: after an INSERT, a COPY and a data-modifying WITH nobody reads.
CREATE FUNCTION public.mismatches_now() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE NOTICE 'mismatches seen by an AFTER STATEMENT trigger: %', public.state_mismatches(); RETURN NULL; END $$;
CREATE TRIGGER aa_after_statement AFTER INSERT ON status_history.history
    FOR EACH STATEMENT EXECUTE FUNCTION public.mismatches_now();
BEGIN;
INSERT INTO status_history.history (object_id, status, generation) VALUES ('as1', 'running', 100);
COPY status_history.history (object_id, status, generation) FROM STDIN;
as1	paused	100
as2	running	100
\.
WITH x AS (INSERT INTO status_history.history (object_id, status, generation) VALUES ('as1', 'stalled', 100) RETURNING *)
SELECT 1 AS one;
COMMIT;
DROP TRIGGER aa_after_statement ON status_history.history;
DROP FUNCTION public.mismatches_now();

-- A COPY that loads the library (the first use of the extension in a
-- session): its objects are written back at its end, before the
-- transaction reads them.
\c
BEGIN;
COPY status_history.history (object_id, status, generation) FROM STDIN;
fc1	running	100
fc2	stalled	100
fc1	paused	100
\.
SELECT object_id, status FROM status_history.statuses WHERE object_id LIKE 'fc_' ORDER BY 1;
SELECT state_mismatches() AS after_first_copy;
COMMIT;

-- reconnect(g, replica) hands the ids it locked to the copies' INSERT as an
-- array; building it replaced short ids by copies in SPI's memory, which
-- were freed before the fences were written with them (a crash once the
-- states had to be read again: a trigger's aborted report on each copy).
CREATE FUNCTION public.poke() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    PERFORM status_history.report(NEW.object_id, 'paused', replica_id => 'r1', generation => 100);
    RAISE EXCEPTION 'undo';
  EXCEPTION WHEN raise_exception THEN NULL;
  END;
  RETURN NULL;
END $$;
SELECT count(*) FROM (SELECT status_history.report('uaf-' || i, 'running', replica_id => 'r1', generation => 100)
                      FROM generate_series(1, 20) i) s;
CREATE TRIGGER poke AFTER INSERT ON status_history.history FOR EACH ROW
  WHEN (NEW.generation = 150) EXECUTE FUNCTION public.poke();
SELECT count(*) AS restamped FROM status_history.reconnect(150, 'r1');
DROP TRIGGER poke ON status_history.history;
DROP FUNCTION public.poke();
SELECT count(*) AS not_ids FROM status_history.objects WHERE object_id !~ '^[a-z0-9-]+$';
SELECT state_mismatches() AS after_replica_reconnect_with_aborted_reports;

-- One statement creating many objects, or repeating many reports, keeps no
-- memory per row or per object past the states' cache: the command counter
-- advances once per statement, and again only when a row to be written is
-- one this command wrote (each
-- advance would give the next object a command id of its own, and each row
-- inserted and then updated under another command id keeps a combo command
-- id in memory to the transaction's end).
SET status_history.cache_max_objects = 100;
BEGIN;
INSERT INTO status_history.history (object_id, status, generation)
SELECT 'cc-' || i, 'running', 1000 FROM generate_series(1, 20000) i;
INSERT INTO status_history.history (object_id, status, generation)
SELECT 'cc-' || (1 + i % 2000), 'running', 1000 FROM generate_series(1, 20000) i;
SELECT count(*) AS objects, count(*) FILTER (WHERE NOT stale) AS current,
       count(*) FILTER (WHERE last_seen_at > occurred_at) AS seen_again
  FROM status_history.replica_statuses r
  JOIN status_history.history h USING (object_id, occurred_at) WHERE object_id LIKE 'cc-%';
SELECT coalesce(sum(total_bytes), 0) < 65536 AS few_combo_cids
  FROM pg_backend_memory_contexts WHERE name = 'Combo CIDs';
SELECT state_mismatches() AS after_many_new_objects;
COMMIT;
RESET status_history.cache_max_objects;

-- ... but it writes under a command id of its own, never under the one of the
-- statement it writes back for: an owner's UPDATE or DELETE of a state row,
-- by hand, in a WITH that runs after the statement's report, is refused as
-- PostgreSQL refuses a row changed by what the statement triggered (it would
-- otherwise take our version for its own and skip the row silently).
SELECT count(*) FROM status_history.report('cte-own', 'running', replica_id => 'r1', generation => 1000);
WITH u AS (UPDATE status_history.objects SET fence = fence + 7 WHERE object_id = 'cte-own' RETURNING object_id)
INSERT INTO status_history.history (object_id, status, replica_id, generation) VALUES ('cte-own', 'paused', 'r1', 1000);
WITH d AS (DELETE FROM status_history.replica_state WHERE object_id = 'cte-own' RETURNING 1)
INSERT INTO status_history.history (object_id, status, replica_id, generation) VALUES ('cte-own', 'paused', 'r1', 1000);
SELECT o.status, (SELECT count(*) FROM status_history.replica_state WHERE object_id = 'cte-own') AS key_rows
  FROM status_history.objects o WHERE o.object_id = 'cte-own';
SELECT state_mismatches() AS after_hand_writes_in_with;

REVOKE ALL ON status_history.history FROM sh_wp_reporter;
DROP FUNCTION public.policy_report(text);
DROP ROLE sh_wp_reporter;
DROP EXTENSION status_history;
