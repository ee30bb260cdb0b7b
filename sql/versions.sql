-- The library serves the SQL objects of its own version only: with another
-- version installed (a session that loaded an older library, or the new
-- library before ALTER EXTENSION UPDATE) every entry point refuses, with a
-- hint, instead of maintaining state the other version does not know.
CREATE EXTENSION status_history;
SELECT library = extension AS same, library = (SELECT extversion FROM pg_extension
                                              WHERE extname = 'status_history') AS installed
  FROM status_history.versions();
SELECT status FROM status_history.report('v1', 'running');
-- Pretend the database holds another version; replacing versions() (as
-- every upgrade script does) makes the session check again.
BEGIN;
UPDATE pg_extension SET extversion = '0.0.1' WHERE extname = 'status_history';
CREATE OR REPLACE FUNCTION status_history.versions(OUT library text, OUT extension text)
RETURNS record AS 'status_history', 'status_history_versions' LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;
SELECT extension FROM status_history.versions();
SAVEPOINT s;
SELECT status FROM status_history.report('v1', 'stalled');
ROLLBACK TO SAVEPOINT s;
INSERT INTO status_history.history (object_id, status) VALUES ('v1', 'stalled');
ROLLBACK TO SAVEPOINT s;
SELECT count(*) FROM status_history.latest();
ROLLBACK TO SAVEPOINT s;
SELECT count(*) FROM status_history.statuses;   -- a view: plain SQL, still readable
ROLLBACK;
SELECT status FROM status_history.report('v1', 'stalled');
DROP EXTENSION status_history;
