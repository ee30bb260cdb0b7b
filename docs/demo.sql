-- The scenario status_history exists for, step by step.
\pset footer off
\echo
\echo '--- Deployment 1 (generation 1, replica r-old) reports s1 running.'
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'running', replica_id => 'r-old', generation => 1);
\echo '--- Deployment 2 (generation 2, replica r-new) starts and reports s1 running.'
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'running', replica_id => 'r-new', generation => 2);
\echo '--- Deployment 1, not yet shut down, reports s1 stalled. It is the newest report:'
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'stalled', error => 'kafka: broker unreachable',
                             replica_id => 'r-old', generation => 1);
SELECT object_id, status, error, replica_id, generation FROM status_history.statuses;
\echo '--- Deployment 2 calls reconnect(2, ''r-new''): its status is re-stamped and sorts last.'
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.reconnect(2, 'r-new');
SELECT object_id, status, error, replica_id, generation, fence FROM status_history.statuses;
\echo '--- Deployment 1 reports stalled again: recorded (nothing is lost), stale, never current.'
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
SELECT object_id, status, replica_id, generation, status_since FROM status_history.statuses;
\echo '--- The whole history, in stamp order:'
SELECT occurred_at, status, replica_id, generation, stale
  FROM status_history.history ORDER BY occurred_at;
