-- pgTAP: the objects CREATE EXTENSION makes, their comments, privileges and
-- pinned search_path, and immunity to a hostile search_path.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
-- Install under a hostile search_path: the script must not care.
CREATE SCHEMA evil;
SET search_path = evil, public;
CREATE EXTENSION status_history;
RESET search_path;
SELECT plan(88);

SELECT has_schema('status_history');
SELECT has_table('status_history', 'history', 'history table exists');
SELECT has_table('status_history', 'objects', 'objects table exists');
SELECT has_view('status_history', 'statuses', 'statuses view exists');
SELECT has_sequence('status_history', 'clock_bound', 'clock bound sequence exists');
SELECT has_table('status_history', 'floors', 'floors table exists');
SELECT has_table('status_history', 'replica_state', 'per-key state table exists');
SELECT has_view('status_history', 'replica_statuses', 'replica_statuses view exists');
SELECT columns_are('status_history', 'replica_statuses',
    ARRAY['object_id', 'replica_id', 'status', 'error', 'details', 'generation', 'occurred_at',
          'status_since', 'reported_at', 'last_at', 'last_seen_at', 'retired', 'expires_at'],
    'replica_statuses has the documented columns');

-- The columns of the history, in this order, with these types.
SELECT is(
    (SELECT string_agg(format('%s %s%s', attname, format_type(atttypid, atttypmod),
                              CASE WHEN attnotnull THEN ' not null' ELSE '' END), ', ' ORDER BY attnum)
       FROM pg_attribute
      WHERE attrelid = 'status_history.history'::regclass AND attnum > 0 AND NOT attisdropped),
    'occurred_at timestamp with time zone not null, object_id text not null, status text not null, '
    'error text, details jsonb, replica_id text, generation bigint not null, '
    'reported_at timestamp with time zone, stale boolean not null, lease interval',
    'history columns in order, with types and NOT NULL');
SELECT col_default_is('status_history', 'history', 'generation', '0', 'generation defaults to 0');
SELECT col_hasnt_default('status_history', 'history', 'stale', 'stale has no default: the insert trigger sets it');
SELECT col_is_pk('status_history', 'history', 'occurred_at', 'stamps are unique');
SELECT has_index('status_history', 'history', 'history_object_idx', ARRAY['object_id', 'occurred_at'],
                 'per-object index on the history');
SELECT col_is_pk('status_history', 'objects', 'object_id', 'one state row per object');

SELECT columns_are('status_history', 'statuses',
    ARRAY['object_id', 'status', 'error', 'details', 'replica_id', 'generation',
          'occurred_at', 'status_since', 'reported_at', 'fence', 'expires_at'],
    'statuses has the documented columns');

SELECT has_function('status_history', 'monotonic_now', '{}'::name[]);
SELECT function_returns('status_history', 'monotonic_now', '{}'::name[], 'timestamp with time zone');
SELECT function_lang_is('status_history', 'monotonic_now', '{}'::name[], 'c', 'the clock is C');
SELECT has_function('status_history', 'report',
    ARRAY['text', 'text', 'text', 'jsonb', 'text', 'bigint', 'timestamp with time zone', 'interval']);
SELECT function_returns('status_history', 'report',
    ARRAY['text', 'text', 'text', 'jsonb', 'text', 'bigint', 'timestamp with time zone', 'interval'],
    'status_history.history');
SELECT has_function('status_history', 'latest', ARRAY['text[]', 'boolean']);
SELECT function_returns('status_history', 'latest', ARRAY['text[]', 'boolean'], 'setof status_history.history');
SELECT function_lang_is('status_history', 'latest', ARRAY['text[]', 'boolean'], 'c', 'latest() is C');
SELECT has_function('status_history', 'reconnect', ARRAY['bigint', 'text', 'text[]']);
SELECT function_returns('status_history', 'reconnect', ARRAY['bigint', 'text', 'text[]'], 'setof status_history.history');
SELECT is_definer('status_history', 'reconnect', ARRAY['bigint', 'text', 'text[]'],
                  'reconnect() runs as the owner, for controllers granted EXECUTE');
SELECT trigger_is('status_history', 'history', 'history_insert', 'status_history', 'history_insert_trigger');
SELECT trigger_is('status_history', 'history', 'history_refuse_change', 'status_history', 'history_refuse_change');
SELECT function_lang_is('status_history', 'history_insert_trigger', '{}'::name[], 'c', 'insert trigger is C');
SELECT function_lang_is('status_history', 'history_refuse_change', '{}'::name[], 'c', 'refusing trigger is C');
SELECT function_lang_is('status_history', 'history_fold_trigger', '{}'::name[], 'c', 'fold trigger is C');
SELECT is(
    (SELECT string_agg(format('%s=%s', tgname, tgenabled), ', ' ORDER BY tgname)
       FROM pg_trigger WHERE tgrelid = 'status_history.history'::regclass),
    'history_fold=A, history_insert=A, history_refuse_change=A, history_refuse_row=A, history_written=A',
    'triggers fire ALWAYS, also under session_replication_role = replica');
SELECT is(
    (SELECT string_agg(format('%s=%s', tgname, tgenabled), ', ' ORDER BY tgname)
       FROM pg_trigger WHERE tgrelid = 'status_history.objects'::regclass),
    'objects_guard=A, objects_restore_merge=A',
    'the guard and the restore merge on objects fire ALWAYS');
SELECT has_function('status_history', 'report_many',
    ARRAY['text[]', 'text[]', 'text[]', 'jsonb[]', 'text[]', 'bigint[]', 'timestamp with time zone[]', 'interval[]']);
SELECT function_lang_is('status_history', 'reconnect', ARRAY['bigint', 'text', 'text[]'], 'c', 'reconnect() is C');
SELECT has_function('status_history', 'retire_replica', ARRAY['text', 'bigint']);
SELECT is_definer('status_history', 'retire_replica', ARRAY['text', 'bigint'],
                  'retire_replica() runs as the owner, for controllers granted EXECUTE');
SELECT hasnt_index('status_history', 'history', 'history_replica_idx',
                   'no replica index on the history: replica_state finds a replica''s reports');
SELECT has_function('status_history', 'prune', ARRAY['integer', 'interval']);
SELECT function_returns('status_history', 'prune', ARRAY['integer', 'interval'], 'bigint');
SELECT is_definer('status_history', 'prune', ARRAY['integer', 'interval'],
                  'prune() runs as the owner, for admins granted EXECUTE');
SELECT function_lang_is('status_history', 'prune', ARRAY['integer', 'interval'], 'c', 'prune() is C');
SELECT has_function('status_history', 'expire', ARRAY['integer']);
SELECT function_returns('status_history', 'expire', ARRAY['integer'], 'bigint');
SELECT is_definer('status_history', 'expire', ARRAY['integer'],
                  'expire() runs as the owner, for controllers, admins and the background worker');
SELECT function_lang_is('status_history', 'expire', ARRAY['integer'], 'c', 'expire() is C');
SELECT function_privs_are('status_history', 'expire', ARRAY['integer'],
                          'public', '{}', 'expire() is not executable by PUBLIC');
SELECT col_type_is('status_history', 'replica_state', 'expires_at', 'timestamp with time zone',
                   'a key keeps when its lease runs out');
SELECT has_function('status_history', 'stable_horizon', '{}'::name[]);
SELECT function_lang_is('status_history', 'stable_horizon', '{}'::name[], 'c', 'the horizon is C');
SELECT function_returns('status_history', 'changes', ARRAY['timestamp with time zone', 'integer', 'boolean'],
                        'setof status_history.history');
SELECT has_table('status_history', 'feed', 'the change feed''s table exists');

-- One status per object by precedence (opt-in): a view with the columns of
-- statuses and a read-only SQL function returning history rows like latest().
SELECT has_view('status_history', 'statuses_by_precedence', 'statuses_by_precedence view exists');
SELECT columns_are('status_history', 'statuses_by_precedence',
    ARRAY['object_id', 'status', 'error', 'details', 'replica_id', 'generation',
          'occurred_at', 'status_since', 'reported_at', 'fence', 'expires_at'],
    'statuses_by_precedence has the columns of statuses');
SELECT has_function('status_history', 'latest_by_precedence', ARRAY['text[]', 'boolean']);
SELECT function_returns('status_history', 'latest_by_precedence', ARRAY['text[]', 'boolean'],
                        'setof status_history.history');
SELECT function_lang_is('status_history', 'latest_by_precedence', ARRAY['text[]', 'boolean'], 'sql',
                        'latest_by_precedence() is SQL');
SELECT volatility_is('status_history', 'latest_by_precedence', ARRAY['text[]', 'boolean'],
                     'stable', 'latest_by_precedence() is STABLE');
SELECT is((SELECT proconfig FROM pg_proc
            WHERE oid = 'status_history.latest_by_precedence(text[], boolean)'::regprocedure),
          ARRAY['search_path=pg_catalog, pg_temp'], 'latest_by_precedence() pins search_path');

-- The history questions: read-only (STABLE), executable by PUBLIC.
SELECT has_function('status_history', 'history_of', ARRAY['text', 'timestamp with time zone', 'timestamp with time zone']);
SELECT has_function('status_history', 'intervals', ARRAY['text', 'timestamp with time zone', 'timestamp with time zone']);
SELECT has_function('status_history', 'time_in_status',
    ARRAY['timestamp with time zone', 'timestamp with time zone', 'text[]']);
SELECT volatility_is('status_history', 'history_of', ARRAY['text', 'timestamp with time zone', 'timestamp with time zone'],
                     'stable', 'history_of() is STABLE');
SELECT volatility_is('status_history', 'intervals', ARRAY['text', 'timestamp with time zone', 'timestamp with time zone'],
                     'stable', 'intervals() is STABLE');
SELECT volatility_is('status_history', 'time_in_status',
    ARRAY['timestamp with time zone', 'timestamp with time zone', 'text[]'], 'stable', 'time_in_status() is STABLE');

-- Every object and every column carries a comment.
SELECT is_empty(
    $$SELECT pg_describe_object(d.classid, d.objid, 0)
        FROM pg_depend d
       WHERE d.refclassid = 'pg_extension'::regclass
         AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'status_history')
         AND d.deptype = 'e'
         AND obj_description(d.objid, (SELECT relname FROM pg_class WHERE oid = d.classid)) IS NULL$$,
    'every extension object has a comment');
SELECT is_empty(
    $$SELECT c.relname || '.' || a.attname
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
       WHERE c.relnamespace = 'status_history'::regnamespace AND c.relkind IN ('r', 'v')
         AND a.attnum > 0 AND NOT a.attisdropped
         AND col_description(c.oid, a.attnum) IS NULL$$,
    'every column has a comment');

-- Every function pins search_path, but the C trigger functions and
-- history_stored() and history_written(), the WHENs of triggers, which
-- resolve no name through it
-- (a SET clause would cost a settings save and restore per row), and
-- lapse_error(), which the views inline (it qualifies every name); the
-- hostile search_path test below covers them.
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc p
       WHERE p.pronamespace = 'status_history'::regnamespace
         AND p.prorettype <> 'trigger'::regtype
         AND p.proname NOT IN ('lapse_error', 'history_stored', 'history_written')
         AND NOT coalesce('search_path=pg_catalog, pg_temp' = ANY (p.proconfig), false)$$,
    'every function but the C triggers, history_stored(), history_written() and lapse_error() pins search_path');
SELECT is_empty(
    $$SELECT p.oid::regprocedure::text FROM pg_proc p
       WHERE p.pronamespace = 'status_history'::regnamespace
         AND p.prorettype = 'trigger'::regtype
         AND (p.prolang <> (SELECT oid FROM pg_language WHERE lanname = 'c') OR p.prosecdef)$$,
    'the trigger functions are C and not security definers');

-- Privileges: readers may read; only granted roles write or fence.
SELECT function_privs_are('status_history', 'reconnect', ARRAY['bigint', 'text', 'text[]'],
                          'public', '{}', 'reconnect() is not executable by PUBLIC');
SELECT function_privs_are('status_history', 'retire_replica', ARRAY['text', 'bigint'],
                          'public', '{}', 'retire_replica() is not executable by PUBLIC');
SELECT has_index('status_history', 'replica_state', 'replica_state_replica_idx', ARRAY['replica_id', 'object_id'],
                 'the objects of a replica, by index');
SELECT function_privs_are('status_history', 'prune', ARRAY['integer', 'interval'],
                          'public', '{}', 'prune() is not executable by PUBLIC');
SELECT function_privs_are('status_history', 'report_many',
    ARRAY['text[]', 'text[]', 'text[]', 'jsonb[]', 'text[]', 'bigint[]', 'timestamp with time zone[]', 'interval[]'],
    'public', ARRAY['EXECUTE'], 'report_many() is executable by PUBLIC (it needs INSERT on the history)');
SELECT table_privs_are('status_history', 'floors', 'public', ARRAY['SELECT'],
                       'PUBLIC may read the floors but not change them');
SELECT function_privs_are('status_history', 'latest', ARRAY['text[]', 'boolean'],
                          'public', ARRAY['EXECUTE'], 'latest() is executable by PUBLIC');
SELECT function_privs_are('status_history', 'history_of', ARRAY['text', 'timestamp with time zone', 'timestamp with time zone'],
                          'public', ARRAY['EXECUTE'], 'history_of() is executable by PUBLIC');
SELECT function_privs_are('status_history', 'intervals', ARRAY['text', 'timestamp with time zone', 'timestamp with time zone'],
                          'public', ARRAY['EXECUTE'], 'intervals() is executable by PUBLIC');
SELECT function_privs_are('status_history', 'time_in_status',
    ARRAY['timestamp with time zone', 'timestamp with time zone', 'text[]'],
    'public', ARRAY['EXECUTE'], 'time_in_status() is executable by PUBLIC');
SELECT table_privs_are('status_history', 'history', 'public', ARRAY['SELECT'],
                       'PUBLIC may read the history but not write it');
SELECT table_privs_are('status_history', 'statuses', 'public', ARRAY['SELECT'],
                       'PUBLIC may read statuses');
SELECT table_privs_are('status_history', 'replica_statuses', 'public', ARRAY['SELECT'],
                       'PUBLIC may read replica_statuses');
SELECT table_privs_are('status_history', 'statuses_by_precedence', 'public', ARRAY['SELECT'],
                       'PUBLIC may read statuses_by_precedence');
SELECT function_privs_are('status_history', 'latest_by_precedence', ARRAY['text[]', 'boolean'],
                          'public', ARRAY['EXECUTE'], 'latest_by_precedence() is executable by PUBLIC');
SELECT table_privs_are('status_history', 'replica_state', 'public', ARRAY['SELECT'],
                       'PUBLIC may read the per-key state but not change it');
SELECT sequence_privs_are('status_history', 'clock_bound', 'public', '{}',
                          'PUBLIC cannot move the clock bound');

-- A hostile search_path with look-alike objects changes nothing.
CREATE FUNCTION evil.hijack(text, text) RETURNS boolean LANGUAGE plpgsql AS
    $$BEGIN RAISE EXCEPTION 'hijacked'; END$$;
CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.hijack);
CREATE OPERATOR evil.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.hijack);
CREATE FUNCTION evil.unnest(anyarray) RETURNS SETOF text LANGUAGE plpgsql AS
    $$BEGIN RAISE EXCEPTION 'hijacked'; END$$;
CREATE FUNCTION evil.max(timestamptz) RETURNS timestamptz LANGUAGE plpgsql AS
    $$BEGIN RAISE EXCEPTION 'hijacked'; END$$;
CREATE TABLE evil.objects (object_id text, fence bigint);
-- A report from before this transaction began, for the history questions
-- (they clip at now(), the transaction's start).
INSERT INTO status_history.history (occurred_at, object_id, status) VALUES ('2020-01-01', 'h0', 'running');
-- Run under the hostile path (pgTAP itself would be hijacked there), then check.
SET search_path = evil, pg_catalog;
CREATE TEMP TABLE hostile AS
SELECT 1 AS step, (SELECT r.status FROM status_history.report('h1', 'running', replica_id => 'r') AS r) AS result
UNION ALL
SELECT 2, (SELECT r.status || ' ' || r.generation FROM status_history.reconnect(1, 'r', ARRAY['h1']) AS r);
INSERT INTO hostile
SELECT 3, l.status || ' ' || l.generation FROM status_history.latest(ARRAY['h1']) AS l;
INSERT INTO hostile
SELECT 4, s.status FROM status_history.statuses AS s;
INSERT INTO hostile
SELECT 5, (SELECT count(*) FROM status_history.history_of('h0')) || ' '
          || (SELECT count(*) FROM status_history.intervals('h0', '-infinity', 'infinity')) || ' '
          || (SELECT count(*) FROM status_history.time_in_status('-infinity', 'infinity', ARRAY['h0']));
INSERT INTO hostile
SELECT 6, (SELECT p.status FROM status_history.statuses_by_precedence AS p
            WHERE p.object_id OPERATOR(pg_catalog.=) 'h1') || ' '
          || (SELECT l.generation FROM status_history.latest_by_precedence(ARRAY['h1']) AS l);
-- Plain INSERTs: the C triggers run under the hostile path (they pin none).
INSERT INTO status_history.history (object_id, status, replica_id) VALUES ('h2', 'starting', 'r');
INSERT INTO status_history.history (object_id, status, replica_id)
VALUES ('h2', 'stalled', 'r'), ('h3', 'running', 'r'), ('h3', 'running', 'r');
INSERT INTO hostile
SELECT 7, (SELECT string_agg(s.object_id || ' ' || s.status, ', ' ORDER BY s.object_id)
             FROM status_history.statuses AS s
            WHERE s.object_id OPERATOR(pg_catalog.=) ANY (ARRAY['h2', 'h3']));
-- lapse_error() pins no search_path (the views inline it): it qualifies all
-- (these look-alikes come last: the steps above use || themselves).
CREATE FUNCTION evil.hijack_text(text, text) RETURNS text LANGUAGE plpgsql AS
    $$BEGIN RAISE EXCEPTION 'hijacked'; END$$;
CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, FUNCTION = evil.hijack_text);
CREATE FUNCTION evil.to_char(timestamp, text) RETURNS text LANGUAGE plpgsql AS
    $$BEGIN RAISE EXCEPTION 'hijacked'; END$$;
INSERT INTO hostile
SELECT 8, status_history.lapse_error('r', '2026-01-02 03:04:05.5+00');
RESET search_path;
SELECT results_eq('SELECT step, result FROM hostile ORDER BY step',
                  $$VALUES (1, 'running'), (2, 'running 1'), (3, 'running 1'), (4, 'running'), (4, 'running'), (5, '1 1 1'), (6, 'running 1'), (7, 'h2 stalled, h3 running'),
                           (8, 'lease expired: no report from replica r since 2026-01-02 03:04:05.500000+00')$$,
                  'report, reconnect, latest, statuses, plain INSERTs, the history questions, precedence and lapse_error() ignore a hostile search_path');

SELECT * FROM finish();
ROLLBACK;
