-- The scenario status_history exists for: an old deployment keeps writing
-- after a new one took over.  Stamps are compared, never printed.
CREATE EXTENSION status_history;

-- Deployment 1 (generation 1, replica r-old) reports s1 running.
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'running', replica_id => 'r-old', generation => 1);
-- Deployment 2 (generation 2, replica r-new) starts and reports s1 running.
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'running', replica_id => 'r-new', generation => 2);
-- Deployment 1, not yet shut down, reports s1 stalled: it is the newest report.
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'stalled', error => 'lost connection',
                             replica_id => 'r-old', generation => 1);
SELECT object_id, status, error, replica_id, generation FROM status_history.statuses;

-- Deployment 2 reconnects: its running status is re-stamped and sorts last.
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.reconnect(2, 'r-new');
SELECT object_id, status, error, replica_id, generation, fence FROM status_history.statuses;

-- Deployment 1 reports stalled again: recorded, stale, never current.
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT object_id, status, replica_id, generation FROM status_history.statuses;
SELECT status, replica_id, generation, stale
  FROM status_history.history ORDER BY occurred_at;

DROP EXTENSION status_history;

-- The same when deployment 1's rows carry stamps hours in the future
-- (imported by the owner, as from a machine whose clock runs fast; the
-- import lead limit is lifted for that).
CREATE EXTENSION status_history;
SET status_history.max_import_lead = -1;
-- Anchor on the clock: it stays above stamps left by earlier tests.
SELECT status_history.monotonic_now() AS t0 \gset
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
VALUES (:'t0'::timestamptz + interval '3 hours', 's1', 'running', 'r-old', 1);
SELECT status, replica_id, occurred_at > :'t0'::timestamptz + interval '3 hours' AS after_import
  FROM status_history.report('s1', 'running', replica_id => 'r-new', generation => 2);
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
VALUES (:'t0'::timestamptz + interval '5 hours', 's1', 'stalled', 'r-old', 1);
SELECT object_id, status, replica_id FROM status_history.statuses;
SELECT status, replica_id, generation,
       occurred_at > :'t0'::timestamptz + interval '5 hours' AS sorts_last
  FROM status_history.reconnect(2, 'r-new');
SELECT object_id, status, replica_id FROM status_history.statuses;
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
VALUES (:'t0'::timestamptz + interval '6 hours', 's1', 'stalled', 'r-old', 1);
SELECT status, replica_id, stale FROM status_history.history
 WHERE occurred_at > :'t0'::timestamptz + interval '6 hours' - interval '1 second'
   AND replica_id = 'r-old';
SELECT object_id, status, replica_id FROM status_history.statuses;
-- latest() agrees with the view.
SELECT object_id, status, replica_id, generation, stale FROM status_history.latest();
DROP EXTENSION status_history;
