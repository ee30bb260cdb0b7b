-- Fencing: stale reports, dropped objects, and reconnect() scopes and errors.
CREATE EXTENSION status_history;

-- A report below the fence is recorded as stale and never becomes current.
SELECT object_id, status, generation, stale FROM status_history.report('a', 'running', generation => 3);
SELECT object_id, status, generation FROM status_history.reconnect(5, object_ids => ARRAY['a']);
SELECT object_id, status, generation, stale FROM status_history.report('a', 'stalled', generation => 4);
SELECT object_id, status, generation, stale FROM status_history.report('a', 'paused', generation => 5);
SELECT object_id, status, generation, stale FROM status_history.report('a', 'running', generation => 9);
SELECT object_id, status, generation, fence FROM status_history.statuses;

-- A report after the object's dropped report is stale; the object leaves the view.
SELECT object_id, status, stale FROM status_history.report('d', 'running');
SELECT object_id, status, stale FROM status_history.report('d', 'dropped');
SELECT object_id, status, stale FROM status_history.report('d', 'running', generation => 100);
SELECT object_id FROM status_history.statuses WHERE object_id = 'd';
SELECT object_id, status FROM status_history.latest(ARRAY['d']);
SELECT object_id, status FROM status_history.latest(ARRAY['d'], include_dropped => true);
-- A stale dropped report does not drop the object.
SELECT object_id, status, stale FROM status_history.report('a', 'dropped', generation => 1);
SELECT object_id, status FROM status_history.statuses WHERE object_id = 'a';

-- reconnect() scopes: listed objects; objects a replica reported on; all.
SELECT stale FROM status_history.report('r1', 'running', replica_id => 'x');
SELECT stale FROM status_history.report('r1', 'stalled', replica_id => 'y');
SELECT stale FROM status_history.report('r2', 'paused', replica_id => 'x');
SELECT stale FROM status_history.report('r3', 'starting', replica_id => 'y');
SELECT stale FROM status_history.report('r4', 'ceased');
-- By replica x: r1 and r2, each re-stamped from x's newest report on it.
SELECT object_id, status, replica_id, generation, stale
  FROM status_history.reconnect(10, 'x') ORDER BY object_id;
SELECT object_id, status, replica_id, fence FROM status_history.statuses
 WHERE object_id LIKE 'r%' ORDER BY object_id;
-- Listed with a replica: only what that replica reported on is re-stamped,
-- but every listed object is fenced, even one never reported on.
SELECT object_id, status, replica_id FROM status_history.reconnect(11, 'y', ARRAY['r1', 'r2', 'never']);
SELECT object_id, fence FROM status_history.objects
 WHERE object_id IN ('r1', 'r2', 'never') ORDER BY object_id;
SELECT count(*) AS never_in_view FROM status_history.statuses WHERE object_id = 'never';
-- Duplicates in the list are reconnected once.
SELECT object_id, status FROM status_history.reconnect(11, object_ids => ARRAY['r3', 'r3', 'r3']);
-- Everything: every live object re-stamped, dropped ones not.
SELECT object_id, status, generation FROM status_history.reconnect(12) ORDER BY object_id;
SELECT count(*) FILTER (WHERE fence = 12) AS fenced, count(*) AS objects FROM status_history.objects;
-- The re-stamped rows sort after every other row in the table.
SELECT bool_and(occurred_at >= ALL (SELECT occurred_at FROM status_history.history WHERE generation < 12))
       AS restamps_last
  FROM status_history.history WHERE generation = 12;
-- Reconnecting twice with the same generation is fine.
SELECT count(*) FROM status_history.reconnect(12);
-- An empty list reconnects nothing.
SELECT count(*) FROM status_history.reconnect(13, object_ids => '{}');

-- A stale controller cannot reconnect; nothing changes.
\set SHOW_CONTEXT never
SELECT * FROM status_history.reconnect(11);
SELECT * FROM status_history.reconnect(11, 'x');
SELECT * FROM status_history.reconnect(-1);
SELECT * FROM status_history.reconnect(NULL);
SELECT * FROM status_history.reconnect(20, object_ids => ARRAY['r1', NULL]);
SELECT * FROM status_history.reconnect(20, object_ids => ARRAY['r1', '']);
SELECT * FROM status_history.reconnect(20, '');
\set SHOW_CONTEXT errors
SELECT max(fence) AS max_fence FROM status_history.objects;

-- Maximal generation (the largest bigint stands for a retired replica's floor).
SELECT object_id, generation FROM status_history.reconnect(9223372036854775806, object_ids => ARRAY['r4']);
SELECT stale FROM status_history.report('r4', 'running', generation => 9223372036854775805);
SELECT stale FROM status_history.report('r4', 'running', generation => 9223372036854775806);
SELECT stale FROM status_history.report('r4', 'running', generation => 9223372036854775807);

-- status_history.notice_stale: a report recorded stale says why (off by default).
SELECT count(*) FROM status_history.reconnect(30, object_ids => ARRAY['ns']);
SET status_history.notice_stale = on;
SELECT stale FROM status_history.report('ns', 'running', replica_id => 'old', generation => 20);
SELECT stale FROM status_history.report('ns', 'running', replica_id => 'new', generation => 30);
SELECT stale FROM status_history.report('ns', 'dropped', replica_id => 'new', generation => 30);
SELECT stale FROM status_history.report('ns', 'running', replica_id => 'new', generation => 30);
RESET status_history.notice_stale;
SELECT stale FROM status_history.report('ns', 'running', replica_id => 'old', generation => 20);

-- reconnect() is for controllers: not executable by PUBLIC.
CREATE ROLE sh_test_nobody;
SET ROLE sh_test_nobody;
SELECT * FROM status_history.reconnect(99);
RESET ROLE;
DROP ROLE sh_test_nobody;

DROP EXTENSION status_history;
