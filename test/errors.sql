-- pgTAP: every refusal carries the documented SQLSTATE and message, and none
-- of them changes anything already recorded.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
CREATE EXTENSION status_history;
SELECT plan(49);

SELECT lives_ok($$SELECT status_history.report('e1', 'running', generation => 2)$$, 'a valid report');
SELECT lives_ok($$SELECT status_history.reconnect(3, object_ids => ARRAY['e1'])$$, 'a valid reconnect');
-- Huge values: a 1 MB error text is stored intact.
SELECT lives_ok($$SELECT status_history.report('big', 'stalled', error => (SELECT string_agg(md5(i::text), '') FROM generate_series(1, 32768) AS i))$$,
                'a 1 MB error text is accepted');
SELECT is((SELECT length(error) FROM status_history.statuses WHERE object_id = 'big'), 1048576,
          'and stored intact');
CREATE TEMP TABLE before_errors AS SELECT * FROM status_history.history;
CREATE TEMP TABLE objects_before AS SELECT * FROM status_history.objects;

-- Validation of reports (plain INSERT and report() alike).
SELECT throws_ok($$INSERT INTO status_history.history (object_id, status) VALUES (NULL, 'running')$$,
                 '23502', 'object_id must not be null');
SELECT throws_ok($$SELECT status_history.report(NULL, 'running')$$,
                 '23502', 'object_id must not be null');
SELECT throws_ok($$SELECT status_history.report('', 'running')$$,
                 '22023', 'object_id must not be empty');
SELECT throws_ok($$SELECT status_history.report('e1', NULL)$$,
                 '23502', 'status must not be null');
SELECT throws_ok($$SELECT status_history.report('e1', 'RUNNING')$$,
                 '22023', 'invalid status "RUNNING"');
SELECT throws_ok($$SELECT status_history.report('e1', 'created')$$,
                 '22023', 'invalid status "created"');
SELECT throws_ok($$SELECT status_history.report('e1', repeat('x', 1048576))$$,
                 '22023', 'invalid status "' || repeat('x', 64) || '"');
SELECT throws_ok($$SELECT status_history.report('e1', 'running', generation => -1)$$,
                 '22023', 'generation must not be negative, got -1');
SELECT throws_ok($$SELECT status_history.report('e1', 'running', generation => NULL)$$,
                 '23502', 'generation must not be null');
SELECT throws_ok($$SELECT status_history.report('e1', 'running', details => '{"a":')$$,
                 '22P02', NULL, 'invalid JSON is refused by the type');
SELECT throws_ok($$INSERT INTO status_history.history (object_id, status, generation) VALUES ('e1', 'running', 1.5e30)$$,
                 '22003', NULL, 'an out-of-range generation is refused by the type');
SELECT throws_ok($$INSERT INTO status_history.history (object_id, status, details) VALUES ('e1', 'running', 'x')$$,
                 '22P02', NULL, 'wrong types through plain INSERT are refused');
SELECT throws_ok($$INSERT INTO status_history.history (occurred_at, object_id, status) VALUES ('-infinity', 'e1', 'running')$$,
                 '22008', 'occurred_at must be finite');

-- An object id too large to index is refused.
SELECT throws_ok($$SELECT status_history.report((SELECT string_agg(md5(i::text), '') FROM generate_series(1, 32768) AS i), 'running')$$,
                 '54000', NULL, 'an object id too large to index is refused');

-- Append-only.
SELECT throws_ok($$UPDATE status_history.history SET error = 'x'$$,
                 '0A000', 'status_history.history is append-only');
SELECT throws_ok($$DELETE FROM status_history.history$$,
                 '0A000', 'status_history.history is append-only');
SELECT throws_ok($$TRUNCATE status_history.history$$,
                 '0A000', 'status_history.history is append-only');
SELECT throws_ok($$SELECT status_history.history_refuse_change()$$,
                 '39P01', 'history_refuse_change: not called by trigger manager');

-- Fencing.
SELECT throws_ok($$SELECT status_history.reconnect(2, object_ids => ARRAY['e1'])$$,
                 '55000', 'generation 2 is below the fence 3 of object "e1"');
SELECT throws_ok($$SELECT status_history.reconnect(4)$$,
                 '25001', 'reconnect() without object_ids must run before any report, reconnect() or retire_replica() in its transaction');
SELECT throws_ok($$SELECT status_history.reconnect(4, object_ids => ARRAY[['a', 'b'], ['c', 'd']])$$,
                 '22023', 'object_ids must be a one-dimensional array');
SELECT throws_ok($$SELECT status_history.report_many(NULL, ARRAY['running'])$$,
                 '22004', 'object_ids and statuses must not be null');
SELECT throws_ok($$SELECT status_history.report_many(ARRAY['e1'], ARRAY['running', 'paused'])$$,
                 '2202E', 'statuses must be a one-dimensional array as long as object_ids');
SELECT throws_ok($$SELECT status_history.report_many(ARRAY['e1', NULL], ARRAY['running', 'paused'])$$,
                 '23502', 'object_id must not be null');
SELECT throws_ok($$SELECT status_history.reconnect(NULL)$$,
                 '22004', 'generation must not be null');
SELECT throws_ok($$SELECT status_history.reconnect(-5)$$,
                 '22023', 'generation must not be negative, got -5');
SELECT throws_ok($$SELECT status_history.reconnect(4, object_ids => ARRAY[NULL]::text[])$$,
                 '22004', 'object_ids must not contain NULL');
SELECT throws_ok($$SELECT status_history.reconnect(4, object_ids => ARRAY['e1', ''])$$,
                 '22023', 'object_ids must not contain an empty object id');
SELECT throws_ok($$SELECT status_history.reconnect(4, '')$$,
                 '22023', 'replica_id must not be empty');

-- Retention.
SELECT throws_ok($$SELECT status_history.prune(0)$$,
                 '22023', 'keep_last must be at least 1');
SELECT throws_ok($$SELECT status_history.prune(NULL)$$,
                 '22023', 'keep_last must be at least 1');
SELECT throws_ok($$SELECT status_history.prune(5, interval '-1 hour')$$,
                 '22023', 'older_than must not be negative');
SELECT throws_ok($$SELECT status_history.prune(1) FROM (SELECT set_config('transaction_read_only', 'on', true)) AS x$$,
                 '25006', 'cannot execute status_history.prune() in a read-only transaction');

-- Reading.
SELECT throws_ok($$SELECT * FROM status_history.latest(NULL, NULL)$$,
                 '22004', 'include_dropped must not be null');

-- Read-only transactions and roles.
SELECT throws_ok($$SELECT status_history.monotonic_now() FROM (SELECT set_config('transaction_read_only', 'on', true)) AS x$$,
                 '25006', 'cannot take a status_history stamp in a read-only transaction');
CREATE ROLE sh_tap_reporter;
GRANT INSERT ON status_history.history TO sh_tap_reporter;
SET ROLE sh_tap_reporter;
SELECT throws_ok($$INSERT INTO status_history.history (occurred_at, object_id, status) VALUES (now(), 'e1', 'running')$$,
                 '42501', 'only superusers and members of the admin role of status_history may supply occurred_at');
SELECT throws_ok($$SELECT status_history.reconnect(9)$$,
                 '42501', 'permission denied for function reconnect');
SELECT throws_ok($$SELECT status_history.prune(1)$$,
                 '42501', 'permission denied for function prune');
SELECT throws_ok($$UPDATE status_history.objects SET fence = 0$$,
                 '42501', 'permission denied for table objects');
SELECT throws_ok($$ALTER TABLE status_history.history DISABLE TRIGGER history_refuse_change$$,
                 '42501', 'must be owner of table history');
SELECT throws_ok($$ALTER TABLE status_history.history ADD COLUMN sneaky text$$,
                 '42501', 'must be owner of table history');
SELECT throws_ok($$SET session_replication_role = replica$$,
                 '42501', NULL, 'a reporter cannot switch triggers off with session_replication_role');
SELECT throws_ok($$SELECT setval('status_history.clock_bound', 0)$$,
                 '42501', 'permission denied for sequence clock_bound');
RESET ROLE;

-- Nothing already recorded changed.
SELECT results_eq('SELECT * FROM status_history.history ORDER BY occurred_at',
                  'SELECT * FROM before_errors ORDER BY occurred_at',
                  'the history is unchanged after every refusal');
SELECT results_eq('SELECT * FROM status_history.objects ORDER BY object_id',
                  'SELECT * FROM objects_before ORDER BY object_id',
                  'the per-object state is unchanged after every refusal');

SELECT * FROM finish();
ROLLBACK;
