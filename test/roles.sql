-- pgTAP: the four roles of the "Roles" section of docs/OPERATIONS.md, set up exactly as
-- documented there, each checked for what it may do and what it may not
-- (with the SQLSTATE).  Run by pg_prove as a superuser; SET ROLE acts as each.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
CREATE EXTENSION status_history;
SELECT plan(57);

-- The recipe (docs/OPERATIONS.md, "Roles"): the roles, then the shipped function that
-- grants each its part (PUBLIC no longer reads).
CREATE ROLE sh_reporter NOLOGIN;
CREATE ROLE sh_controller NOLOGIN;
CREATE ROLE sh_reader NOLOGIN;
CREATE ROLE sh_admin NOLOGIN;
SELECT status_history.grant_roles(reporter => 'sh_reporter', controller => 'sh_controller',
                                  reader => 'sh_reader', admin => 'sh_admin', public_reads => false);

CREATE SCHEMA adm AUTHORIZATION sh_admin;   -- the admin's own code lives here
CREATE TABLE unrelated (x int);
INSERT INTO unrelated VALUES (1);

-- The reporter: reports, and nothing else.
SET ROLE sh_reporter;
SELECT lives_ok($$SELECT status_history.report('r1', 'running', generation => 1)$$, 'reporter: report()');
SELECT lives_ok($$INSERT INTO status_history.history (object_id, status) VALUES ('r2', 'starting')$$,
                'reporter: INSERT');
SELECT lives_ok($$SELECT status_history.report_many(ARRAY['r3', 'r1'], ARRAY['running', 'stalled'])$$,
                'reporter: report_many()');
SELECT throws_ok($$SELECT * FROM status_history.reconnect(5)$$, '42501', NULL, 'reporter: no reconnect()');
SELECT throws_ok($$SELECT status_history.retire_replica('gone')$$, '42501', NULL, 'reporter: no retire_replica()');
SELECT throws_ok($$SELECT * FROM status_history.statuses$$, '42501', NULL, 'reporter: does not read statuses');
SELECT throws_ok($$SELECT * FROM status_history.replica_statuses$$, '42501', NULL, 'reporter: does not read replica_statuses');
SELECT throws_ok($$SELECT * FROM status_history.statuses_by_precedence$$, '42501', NULL,
                 'reporter: does not read statuses_by_precedence');
SELECT throws_ok($$SELECT * FROM status_history.history$$, '42501', NULL, 'reporter: does not read the history');
SELECT throws_ok($$SELECT * FROM status_history.time_in_status('-infinity', 'infinity')$$, '42501', NULL,
                 'reporter: does not ask the history');
SELECT throws_ok($$SELECT * FROM unrelated$$, '42501', NULL, 'reporter: does not read other tables');
SELECT throws_ok($$UPDATE status_history.objects SET fence = 99$$, '42501', NULL, 'reporter: does not move fences');
SELECT throws_ok($$INSERT INTO status_history.floors VALUES (NULL, 99)$$, '42501', NULL, 'reporter: does not move floors');
SELECT throws_ok($$SELECT pg_catalog.setval('status_history.clock_bound', 1)$$, '42501', NULL,
                 'reporter: does not move the clock bound');
SELECT throws_ok($$INSERT INTO status_history.history (occurred_at, object_id, status) VALUES (now(), 'r1', 'running')$$,
                 '42501', 'only superusers and members of the admin role of status_history may supply occurred_at', 'reporter: no imports');
SELECT throws_ok($$DELETE FROM status_history.history$$, '42501', NULL, 'reporter: no DELETE');
SELECT throws_ok($$SELECT status_history.prune(1)$$, '42501', NULL, 'reporter: no prune()');
SELECT throws_ok($$SELECT status_history.expire()$$, '42501', NULL, 'reporter: no expire()');
-- A hostile search_path: the reporter's own text, timestamptz and int4 in
-- pg_temp, with checks that note who runs them, and a function that runs a
-- query in the middle of the INSERT (where the extension writes back).
CREATE TABLE pg_temp.seen (who text);
CREATE FUNCTION pg_temp.note() RETURNS boolean LANGUAGE plpgsql AS
    $$ BEGIN INSERT INTO pg_temp.seen VALUES (current_user); RETURN true; END $$;
CREATE DOMAIN pg_temp.text AS pg_catalog.text CHECK (pg_temp.note());
CREATE DOMAIN pg_temp.timestamptz AS pg_catalog.timestamptz CHECK (pg_temp.note());
CREATE DOMAIN pg_temp.int4 AS pg_catalog.int4 CHECK (pg_temp.note());
CREATE FUNCTION pg_temp.f(i int) RETURNS pg_catalog.text LANGUAGE sql
    AS $$ SELECT 'running'::pg_catalog.text FROM pg_catalog.generate_series(1, 1) $$;
SET search_path = pg_temp, pg_catalog;
INSERT INTO status_history.history (object_id, status)
SELECT 'r1', pg_temp.f(i) FROM pg_catalog.generate_series(1, 2) AS i;
SELECT status_history.report('r9', 'running') IS NOT NULL;
RESET search_path;
-- (pg_temp comes first for types on any path: gone before pgTAP runs again.)
DROP DOMAIN pg_temp.text, pg_temp.timestamptz, pg_temp.int4 CASCADE;
SELECT is((SELECT count(*) FROM pg_temp.seen WHERE who <> 'sh_reporter'), 0::bigint,
          'reporter: with a hostile search_path, none of its code runs as anyone else');
RESET ROLE;
SELECT is((SELECT rolsuper FROM pg_roles WHERE rolname = 'sh_reporter'), false, 'reporter: still no superuser');

-- The controller: reports and reconnects.
SET ROLE sh_controller;
SELECT lives_ok($$SELECT * FROM status_history.reconnect(2, object_ids => ARRAY['r1', 'r2'])$$,
                'controller: reconnect() with a list');
SELECT lives_ok($$SELECT status_history.report('r1', 'paused', generation => 2)$$, 'controller: report()');
SELECT throws_ok($$INSERT INTO status_history.history (occurred_at, object_id, status) VALUES (now(), 'r1', 'running')$$,
                 '42501', 'only superusers and members of the admin role of status_history may supply occurred_at', 'controller: no imports');
SELECT throws_ok($$UPDATE status_history.objects SET fence = 0$$, '42501', NULL, 'controller: fences only through reconnect()');
SELECT throws_ok($$SELECT * FROM status_history.statuses$$, '42501', NULL, 'controller: does not read statuses');
SELECT throws_ok($$SELECT status_history.prune(1)$$, '42501', NULL, 'controller: no prune()');
SELECT lives_ok($$SELECT status_history.expire()$$, 'controller: expire()');
-- (Past the privilege check: refused only because this transaction has reported.)
SELECT throws_ok($$SELECT status_history.retire_replica('gone')$$, '25001', NULL,
                 'controller: may call retire_replica()');
RESET ROLE;
-- (reconnect() without a list waits for running reporters; its own transaction here has reported.)
SELECT is((SELECT fence FROM status_history.objects WHERE object_id = 'r1'), 2::bigint,
          'the controller''s reconnect raised the fence');

-- The reader: the views and history functions only.
SET ROLE sh_reader;
SELECT is((SELECT status FROM status_history.statuses WHERE object_id = 'r1'), 'paused', 'reader: statuses');
SELECT is((SELECT count(*) FROM status_history.latest()), 4::bigint, 'reader: latest() (r1, r2, r3 and r9)');
SELECT is((SELECT count(*) FROM status_history.statuses_by_precedence
            WHERE (object_id, status) IN (SELECT l.object_id, l.status FROM status_history.latest_by_precedence() AS l)),
          4::bigint, 'reader: statuses_by_precedence and latest_by_precedence()');
SELECT cmp_ok((SELECT count(*) FROM status_history.history), '>', 0::bigint, 'reader: the history');
SELECT lives_ok($$SELECT * FROM status_history.history_of('r1')$$ || $$; SELECT * FROM status_history.intervals('r1', '-infinity', 'infinity')$$
                || $$; SELECT * FROM status_history.time_in_status('-infinity', 'infinity')$$,
                'reader: history_of(), intervals(), time_in_status()');
SELECT throws_ok($$SELECT status_history.report('r1', 'running')$$, '42501', NULL, 'reader: no reports');
SELECT throws_ok($$INSERT INTO status_history.history (object_id, status) VALUES ('r1', 'running')$$,
                 '42501', NULL, 'reader: no INSERT');
SELECT throws_ok($$SELECT * FROM status_history.reconnect(9)$$, '42501', NULL, 'reader: no reconnect()');
SELECT throws_ok($$SELECT * FROM unrelated$$, '42501', NULL, 'reader: does not read other tables');
SELECT throws_ok($$SELECT * FROM status_history.report_many(ARRAY['r1'], ARRAY['running'])$$, '42501', NULL,
                 'reader: report_many() refused before it locks anything');
RESET ROLE;

-- The admin: imports (a member of the admin role, not the owner), reads, prunes.
SET ROLE sh_admin;
SELECT lives_ok($$INSERT INTO status_history.history (occurred_at, object_id, status)
                  VALUES ('2020-01-01 00:00:00+00', 'imported', 'running')$$, 'admin: imports a stamp');
SELECT is((SELECT status FROM status_history.statuses WHERE object_id = 'imported'), 'running',
          'admin: the import is current');
SELECT throws_ok($$DELETE FROM status_history.history$$, '42501', NULL,
                 'admin: no DELETE');
-- The admin owns nothing of the extension: no trigger, constraint or index
-- of its own can run in the extension's SECURITY DEFINER functions (as the
-- 0.3.0 recipe's owner's could, and become superuser), and the triggers
-- that keep the history append-only stay.
CREATE FUNCTION adm.grab() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN EXECUTE 'ALTER ROLE sh_admin SUPERUSER'; RETURN NULL; END $$;
SELECT throws_ok($$CREATE TRIGGER a_grab BEFORE DELETE ON status_history.history
                   FOR EACH STATEMENT EXECUTE FUNCTION adm.grab()$$, '42501', NULL,
                 'admin: no trigger of its own on the history');
SELECT throws_ok($$ALTER TABLE status_history.history ADD CONSTRAINT c CHECK (adm.grab() IS NULL) NOT VALID$$,
                 '42501', NULL, 'admin: no constraint of its own on the history');
SELECT throws_ok($$CREATE INDEX ON status_history.history ((object_id || 'x'))$$, '42501', NULL,
                 'admin: no index of its own on the history');
SELECT throws_ok($$ALTER TABLE status_history.history DISABLE TRIGGER history_refuse_change$$, '42501', NULL,
                 'admin: cannot disable the append-only triggers');
SELECT throws_ok($$DROP TRIGGER history_refuse_change ON status_history.history$$, '42501', NULL,
                 'admin: cannot drop them');
SELECT throws_ok($$CREATE TRIGGER a_grab BEFORE UPDATE ON status_history.objects
                   FOR EACH ROW EXECUTE FUNCTION adm.grab()$$, '42501', NULL,
                 'admin: no trigger of its own on the state');
SELECT throws_ok($$SELECT * FROM status_history.reconnect(9)$$, '42501', NULL, 'admin: no reconnect() unless granted');
SELECT cmp_ok((SELECT status_history.prune(1)), '>', 0::bigint, 'admin: prune() (r1 has three reports)');
SELECT lives_ok($$SELECT status_history.expire()$$, 'admin: expire()');
SELECT is((SELECT count(*) FROM status_history.history WHERE object_id = 'r1'), 1::bigint,
          'admin: prune(1) left r1 its newest report');
SELECT throws_ok($$SELECT status_history.grant_roles(admin => 'sh_admin', public_reads => true)$$, '42501', NULL,
                 'admin: does not change the roles');
RESET ROLE;
SELECT is((SELECT rolsuper FROM pg_roles WHERE rolname = 'sh_admin'), false, 'admin: still no superuser');
SELECT is((SELECT string_agg(DISTINCT c.relowner::regrole::text, ', ') FROM pg_class c
            WHERE c.relnamespace = 'status_history'::regnamespace),
          (SELECT e.extowner::regrole::text FROM pg_extension e WHERE e.extname = 'status_history'),
          'every relation belongs to the extension''s owner');
-- grant_roles() again with other roles: the old ones keep nothing.
CREATE ROLE sh_reader2 NOLOGIN;
SELECT status_history.grant_roles(reporter => 'sh_reporter', controller => 'sh_controller',
                                  reader => 'sh_reader2', admin => 'sh_admin', public_reads => false);
SELECT is((SELECT has_table_privilege('sh_reader', 'status_history.statuses', 'SELECT')
               OR has_function_privilege('sh_reader', 'status_history.latest(text[], boolean)', 'EXECUTE')),
          false, 'a role no longer named keeps nothing of its part');

-- No function the extension ships is executable by PUBLIC unless meant to be.
SELECT is(
    (SELECT string_agg(p.proname, ', ' ORDER BY p.proname) FROM pg_proc p
      WHERE p.pronamespace = 'status_history'::regnamespace
        AND has_function_privilege('public', p.oid, 'EXECUTE')),
    'changes, history_stored, history_written, lapse_error, monotonic_now, report, report_many, stable_horizon, versions',
    'PUBLIC executes only changes() (it needs SELECT on the history), history_stored() and history_written() (the WHENs of the fold triggers, run as the inserting role; they fold only rows the caller stored, and write back only what the caller folded), lapse_error() (the views call it), monotonic_now(), report() and report_many() (the last two need INSERT), stable_horizon() and versions()');

SELECT * FROM finish();
ROLLBACK;
