-- The schema must be the extension's alone (docs/OPERATIONS.md: Roles).  PostgreSQL
-- installs into a status_history schema that exists already; one owned by
-- another role, or one others may create in, or holding objects of its own,
-- could shadow the extension's functions for every caller (a grant_roles()
-- taking text, picked by a superuser's call with string literals).
\set SHOW_CONTEXT never
-- (An earlier test's CREATE EXTENSION created the schema; DROP EXTENSION left it.)
SET client_min_messages = warning;
DROP SCHEMA IF EXISTS status_history;
RESET client_min_messages;
CREATE ROLE sh_squatter;
CREATE SCHEMA status_history AUTHORIZATION sh_squatter;
CREATE EXTENSION status_history;
ALTER SCHEMA status_history OWNER TO CURRENT_USER;
GRANT CREATE ON SCHEMA status_history TO sh_squatter;
CREATE EXTENSION status_history;
REVOKE CREATE ON SCHEMA status_history FROM sh_squatter;
CREATE FUNCTION status_history.grant_roles(text, text, text, text, boolean)
RETURNS void LANGUAGE sql AS 'SELECT NULL';
CREATE EXTENSION status_history;
SELECT count(*) AS extensions FROM pg_extension WHERE extname = 'status_history';
DROP FUNCTION status_history.grant_roles(text, text, text, text, boolean);
-- An empty schema owned by a superuser, with CREATE for its owner only, will do.
CREATE EXTENSION status_history;
SELECT status FROM status_history.report('guarded', 'running');
DROP EXTENSION status_history;
DROP SCHEMA status_history;

-- No GRANT gives a role what would let it attach code to the extension's
-- tables (TRIGGER), hold prune() up (REFERENCES) or empty the history
-- (TRUNCATE), and no object changes owner -- not even a superuser's: a dump
-- of a version before 0.4.0 carries GRANT ALL to the history's then owner.
CREATE EXTENSION status_history;
GRANT TRIGGER ON status_history.history TO sh_squatter;
GRANT ALL ON status_history.objects TO sh_squatter;
GRANT REFERENCES (object_id) ON status_history.history TO sh_squatter;
GRANT TRUNCATE ON ALL TABLES IN SCHEMA status_history TO sh_squatter;
ALTER TABLE status_history.history OWNER TO sh_squatter;
ALTER FUNCTION status_history.prune(integer, interval) OWNER TO sh_squatter;
ALTER SCHEMA status_history OWNER TO sh_squatter;
SELECT has_table_privilege('sh_squatter', 'status_history.history', 'TRIGGER') AS may_trigger,
       (SELECT relowner::regrole FROM pg_class WHERE oid = 'status_history.history'::regclass) = current_user::regrole AS owner_kept;

-- grant_roles() leaves no role anything but its part: privileges granted to
-- other roles (here CREATE on the schema, a column, a function) go too.
GRANT SELECT (object_id) ON status_history.objects TO sh_squatter;
GRANT CREATE ON SCHEMA status_history TO sh_squatter;
GRANT EXECUTE ON FUNCTION status_history.prune(integer, interval) TO sh_squatter;
SELECT status_history.grant_roles();
SELECT has_column_privilege('sh_squatter', 'status_history.objects', 'object_id', 'SELECT') AS may_read_column,
       has_schema_privilege('sh_squatter', 'status_history', 'CREATE') AS may_create,
       has_function_privilege('sh_squatter', 'status_history.prune(integer, interval)', 'EXECUTE') AS may_prune,
       has_schema_privilege('sh_squatter', 'status_history', 'USAGE') AS may_use_schema;
DROP EXTENSION status_history;
DROP ROLE sh_squatter;
