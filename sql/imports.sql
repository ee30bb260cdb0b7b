-- Importing history: stamps supplied by the owner.  A stamp far ahead of the
-- server clock is refused (it would hold every later stamp back), a stamp
-- that another report already has is refused with a clear message, and rows
-- exported from Materialize's mz_source_status_history import with the
-- recipe of the README.
CREATE EXTENSION status_history;
\i sql/oracle.psql

-- Ahead of the clock by more than status_history.max_import_lead (10 s).
\set VERBOSITY default
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (now() + interval '50 years', 'ahead', 'running');
-- Within it, or with the limit lifted for one import.
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (clock_timestamp() + interval '5 s', 'ahead', 'running');
SET status_history.max_import_lead = -1;
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES (clock_timestamp() + interval '20 s', 'ahead', 'stalled');
RESET status_history.max_import_lead;
SET status_history.max_import_lead = '-2';
-- Only a superuser may change it: an importer could move every later stamp
-- to the end of time.
CREATE ROLE sh_lead_setter;
SET ROLE sh_lead_setter;
SET status_history.max_import_lead = -1;
RESET ROLE;
DROP ROLE sh_lead_setter;
SELECT count(*) FROM status_history.history WHERE object_id = 'ahead';

-- Materialize's export: millisecond stamps, not unique.
CREATE TABLE mz_source_status_history (
    occurred_at timestamptz, source_id text, status text, error text, details jsonb, replica_id text);
INSERT INTO mz_source_status_history VALUES
    ('2024-05-01 10:00:00.001+00', 'u1', 'starting', NULL, NULL, 'r1'),
    ('2024-05-01 10:00:00.002+00', 'u1', 'running',  NULL, NULL, 'r1'),
    ('2024-05-01 10:00:00.002+00', 'u2', 'starting', NULL, NULL, 'r1'),
    ('2024-05-01 10:00:03.500+00', 'u1', 'stalled', 'kafka: broker down',
     '{"hints": ["check the broker"], "namespaced": {"kafka": "broker down"}}', 'r1'),
    ('2024-05-01 10:00:03.500+00', 'u1', 'running',  NULL, NULL, 'r2'),
    ('2024-05-01 10:00:04.000+00', 'u2', 'dropped',  NULL, NULL, NULL),
    ('2024-05-01 10:00:05.000+00', 'u2', 'running',  NULL, NULL, 'r1');

-- As it is: two reports share a stamp, and the import is refused as a whole.
INSERT INTO status_history.history (occurred_at, object_id, status, error, details, replica_id)
SELECT occurred_at, source_id, status, error, details, replica_id
  FROM mz_source_status_history ORDER BY occurred_at;
SELECT count(*) FROM status_history.history WHERE object_id IN ('u1', 'u2');

-- The recipe: spread equal stamps a microsecond apart, in a chosen order.
INSERT INTO status_history.history (occurred_at, object_id, status, error, details, replica_id)
SELECT occurred_at + (row_number() OVER (PARTITION BY occurred_at ORDER BY source_id, replica_id NULLS FIRST) - 1)
                     * interval '1 microsecond',
       source_id, status, error, details, replica_id
  FROM mz_source_status_history ORDER BY 1;
SELECT object_id, to_char(occurred_at AT TIME ZONE 'UTC', 'HH24:MI:SS.US') AS occurred_at, status, replica_id, stale
  FROM status_history.history WHERE object_id IN ('u1', 'u2') ORDER BY occurred_at;
-- u2's report after its drop is recorded stale; u1's newest is current.
SELECT object_id, status, replica_id FROM status_history.latest(ARRAY['u1', 'u2'], include_dropped => true) ORDER BY 1;
-- Importing the same rows again is a duplicate of the same reports: ON
-- CONFLICT DO NOTHING skips them (an idempotent re-run of the import) ...
INSERT INTO status_history.history (occurred_at, object_id, status, error, details, replica_id)
SELECT occurred_at + (row_number() OVER (PARTITION BY occurred_at ORDER BY source_id, replica_id NULLS FIRST) - 1)
                     * interval '1 microsecond',
       source_id, status, error, details, replica_id
  FROM mz_source_status_history ORDER BY 1
    ON CONFLICT DO NOTHING;
-- ... while another report at a taken stamp is refused, ON CONFLICT or not.
INSERT INTO status_history.history (occurred_at, object_id, status)
VALUES ('2024-05-01 10:00:00.001+00', 'u9', 'running') ON CONFLICT DO NOTHING;
-- New reports come after everything imported.
SELECT occurred_at > '2024-05-01 10:00:05+00' AS after_import FROM status_history.report('u1', 'running');
SELECT state_mismatches() AS after_imports;

DROP TABLE mz_source_status_history;
DROP EXTENSION status_history;
