-- The history table: validation, append-only, plain INSERT = report(),
-- and who may supply occurred_at.
CREATE EXTENSION status_history;

-- Plain INSERT behaves like report(): stamped, fenced, made current.
INSERT INTO status_history.history (object_id, status, error, details, replica_id, generation, reported_at)
VALUES ('job-1', 'starting', NULL, '{"hints": ["warming up"]}', 'r1', 0, '2001-01-01 00:00:00+00')
RETURNING object_id, status, details, replica_id, generation, reported_at, stale,
          occurred_at IS NOT NULL AS stamped;
SELECT object_id, status, details, reported_at FROM status_history.statuses;
-- reported_at is informational: a reporter clock far in the past or future
-- does not change the order.
SELECT status, reported_at FROM status_history.report('job-1', 'running', reported_at => '2100-01-01');
SELECT status, reported_at FROM status_history.report('job-1', 'stalled', reported_at => '1999-01-01');
SELECT status FROM status_history.statuses WHERE object_id = 'job-1';
-- Multi-row INSERT ... SELECT: each row stamped in order, all unique.
INSERT INTO status_history.history (object_id, status)
SELECT 'bulk-' || (i % 7), (ARRAY['starting','running','stalled'])[1 + i % 3]
  FROM generate_series(1, 300) AS i;
SELECT count(*) AS rows, count(DISTINCT occurred_at) AS distinct_stamps
  FROM status_history.history;
SELECT count(*) AS bulk_objects FROM status_history.statuses WHERE object_id LIKE 'bulk-%';

-- Every bad input gets a clear error with a SQLSTATE.
INSERT INTO status_history.history (object_id, status) VALUES (NULL, 'running');
INSERT INTO status_history.history (object_id, status) VALUES ('', 'running');
INSERT INTO status_history.history (object_id, status) VALUES ('x', NULL);
INSERT INTO status_history.history (object_id, status) VALUES ('x', 'Running');
INSERT INTO status_history.history (object_id, status) VALUES ('x', 'created');
INSERT INTO status_history.history (object_id, status) VALUES ('x', repeat('é', 100000));
INSERT INTO status_history.history (object_id, status, generation) VALUES ('x', 'running', -1);
INSERT INTO status_history.history (object_id, status, generation) VALUES ('x', 'running', NULL);
SELECT status_history.report(NULL, 'running');
SELECT status_history.report('x', 'running', generation => NULL);
SELECT status_history.report('x', 'running', details => '{not json');
INSERT INTO status_history.history (object_id, status, generation) VALUES ('x', 'running', 'many');
INSERT INTO status_history.history (occurred_at, object_id, status) VALUES ('infinity', 'x', 'running');

-- Append-only: UPDATE, DELETE and TRUNCATE are refused, even when no row
-- would be touched and even under session_replication_role = replica.
UPDATE status_history.history SET status = 'running' WHERE object_id = 'job-1';
DELETE FROM status_history.history WHERE false;
TRUNCATE status_history.history;
SET session_replication_role = replica;
DELETE FROM status_history.history;
INSERT INTO status_history.history (object_id, status) VALUES ('', 'running');
RESET session_replication_role;
SELECT count(*) AS rows_still_there FROM status_history.history;

-- Only the owner may supply occurred_at; an ordinary role is pointed to reported_at.
CREATE ROLE sh_test_reporter;
GRANT INSERT ON status_history.history TO sh_test_reporter;
SET ROLE sh_test_reporter;
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (now(), 'job-2', 'running');
INSERT INTO status_history.history (object_id, status, reported_at)
VALUES ('job-2', 'running', now());
SELECT object_id, status, stale FROM status_history.report('job-2', 'stalled');
-- The reporter cannot touch the per-object state or the clock's bound.
UPDATE status_history.objects SET fence = 0;
SELECT pg_catalog.setval('status_history.clock_bound', 1);
-- Nor disable the triggers.
ALTER TABLE status_history.history DISABLE TRIGGER history_refuse_change;
RESET ROLE;
SELECT object_id, status FROM status_history.statuses WHERE object_id = 'job-2';

-- The owner imports a report with its own stamp, far in the future (past
-- status_history.max_import_lead, lifted for it); the clock continues above it.
SET status_history.max_import_lead = -1;
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (now() + interval '10 hours', 'job-3', 'running')
RETURNING occurred_at AS imported \gset
RESET status_history.max_import_lead;
SELECT :'imported'::timestamptz > now() + interval '9 hours' AS kept_future_stamp;
SELECT status_history.monotonic_now() > :'imported' AS clock_above_import;
SELECT occurred_at > :'imported' AS report_above_import
  FROM status_history.report('job-4', 'running');
-- An imported stamp that already exists is refused by the unique stamp.
\set VERBOSITY terse
INSERT INTO status_history.history (occurred_at, object_id, status)
SELECT occurred_at, 'job-5', 'running' FROM status_history.history LIMIT 1;
\set VERBOSITY default

DROP EXTENSION status_history;
DROP ROLE sh_test_reporter;
