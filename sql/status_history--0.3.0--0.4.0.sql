-- status_history upgrade script, 0.3.0 to 0.4.0.
--
-- Brings a 0.3.0 installation to exactly what sql/status_history.sql installs
-- as 0.4.0 (test/t/005_upgrade.pl compares the two catalogs and checks that the
-- data and per-object state survive).  Same rules as the install script:
-- schema-qualify every name and operator, pin search_path on every function,
-- and back-fill any new per-object state from the history.

\echo Use "ALTER EXTENSION status_history UPDATE TO '0.4.0'" to load this file. \quit

-- @@ schema guard (as the install script's): the schema is the extension's
-- alone.  Before 0.4.0 the README's recipe made a role the history's owner;
-- what an owner could attach, or grant, runs or lets others run code as the
-- extension's owner once the tables are given back to it (below).
DO $$
DECLARE
    owner_is_superuser boolean;
    creators text;
    foreign_objects text[];
BEGIN
    SELECT r.rolsuper,
           (SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                             ELSE a.grantee::pg_catalog.regrole::text END, ', ')
              FROM pg_catalog.aclexplode(n.nspacl) AS a
             WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
               AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner)
      INTO owner_is_superuser, creators
      FROM pg_catalog.pg_namespace AS n JOIN pg_catalog.pg_roles AS r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
     WHERE n.nspname OPERATOR(pg_catalog.=) 'status_history';
    IF NOT owner_is_superuser OR creators IS NOT NULL THEN
        RAISE EXCEPTION 'schema status_history is not the extension''s alone'
            USING ERRCODE = '42501',
                  DETAIL = CASE WHEN NOT owner_is_superuser THEN 'Its owner is not a superuser.'
                           ELSE pg_catalog.format('CREATE on it is granted to %s.', creators) END,
                  HINT = 'Let CREATE EXTENSION create the schema: drop the one that exists (after checking what is in it), or give it to a superuser and revoke CREATE from everyone else.';
    END IF;
    WITH nsp AS (SELECT n.oid FROM pg_catalog.pg_namespace AS n WHERE n.nspname OPERATOR(pg_catalog.=) 'status_history'),
        ext AS (SELECT e.oid FROM pg_catalog.pg_extension AS e WHERE e.extname OPERATOR(pg_catalog.=) 'status_history'),
        member AS (SELECT d.classid, d.objid FROM pg_catalog.pg_depend AS d, ext
                    WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                      AND d.refobjid OPERATOR(pg_catalog.=) ext.oid AND d.deptype OPERATOR(pg_catalog.=) 'e'),
        objs AS (
          SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass AS classid, p.oid AS objid FROM pg_catalog.pg_proc AS p, nsp WHERE p.pronamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid FROM pg_catalog.pg_operator AS o, nsp WHERE o.oprnamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_class AS c, nsp WHERE c.relnamespace OPERATOR(pg_catalog.=) nsp.oid AND c.relkind OPERATOR(pg_catalog.<>) ALL (ARRAY['i', 'I', 't', 'c']::pg_catalog."char"[])
          UNION ALL SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid FROM pg_catalog.pg_type AS t, nsp WHERE t.typnamespace OPERATOR(pg_catalog.=) nsp.oid AND t.typrelid OPERATOR(pg_catalog.=) 0
                AND NOT EXISTS (SELECT FROM pg_catalog.pg_type AS e WHERE e.oid OPERATOR(pg_catalog.=) t.typelem AND e.typrelid OPERATOR(pg_catalog.<>) 0)
          UNION ALL SELECT 'pg_catalog.pg_collation'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_collation AS c, nsp WHERE c.collnamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_conversion'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_conversion AS c, nsp WHERE c.connamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, f.oid FROM pg_catalog.pg_opfamily AS f, nsp WHERE f.opfnamespace OPERATOR(pg_catalog.=) nsp.oid
          UNION ALL SELECT 'pg_catalog.pg_extension'::pg_catalog.regclass, e.oid FROM pg_catalog.pg_extension AS e, nsp WHERE e.extnamespace OPERATOR(pg_catalog.=) nsp.oid AND e.extname OPERATOR(pg_catalog.<>) 'status_history'
        )
        SELECT pg_catalog.array_agg(pg_catalog.pg_describe_object(o.classid, o.objid, 0)) FROM objs AS o
         WHERE NOT EXISTS (SELECT FROM member AS m WHERE m.classid OPERATOR(pg_catalog.=) o.classid AND m.objid OPERATOR(pg_catalog.=) o.objid) INTO foreign_objects;
    IF foreign_objects IS NOT NULL THEN
        RAISE EXCEPTION 'schema status_history holds objects that are not the extension''s'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Not the extension''s: %s.', pg_catalog.array_to_string(foreign_objects, ', ')),
                  HINT = 'They could shadow the extension''s functions for its callers: drop them (after checking what they do), then try again.';
    END IF;
    -- Code attached to the extension's tables, or the right to attach it:
    -- nothing of it is in a fresh install.
    WITH rels AS (SELECT c.oid FROM pg_catalog.pg_class AS c
                   WHERE c.relnamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace),
    ours AS (SELECT d.objid FROM pg_catalog.pg_depend AS d JOIN pg_catalog.pg_extension AS e
                 ON d.refobjid OPERATOR(pg_catalog.=) e.oid
              WHERE e.extname OPERATOR(pg_catalog.=) 'status_history'
                AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
                AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.deptype OPERATOR(pg_catalog.=) 'e'),
    found AS (
        SELECT pg_catalog.format('trigger %I on %s', t.tgname, t.tgrelid::pg_catalog.regclass) AS what
          FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels) AND NOT t.tgisinternal
           AND t.tgfoid OPERATOR(pg_catalog.<>) ALL (SELECT objid FROM ours)
        UNION ALL
        SELECT pg_catalog.format('trigger %I on %s not ENABLE ALWAYS', t.tgname, t.tgrelid::pg_catalog.regclass)
          FROM pg_catalog.pg_trigger AS t
         WHERE t.tgrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels) AND NOT t.tgisinternal
           AND t.tgfoid OPERATOR(pg_catalog.=) ANY (SELECT objid FROM ours)
           AND t.tgenabled OPERATOR(pg_catalog.<>) 'A'
        UNION ALL
        SELECT pg_catalog.format('column %I of %s of type %s', a.attname, a.attrelid::pg_catalog.regclass,
                                 a.atttypid::pg_catalog.regtype)
          FROM pg_catalog.pg_attribute AS a JOIN pg_catalog.pg_type AS y ON y.oid OPERATOR(pg_catalog.=) a.atttypid
         WHERE a.attrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
           AND a.attnum OPERATOR(pg_catalog.>) 0 AND NOT a.attisdropped
           AND (y.typnamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace
                OR y.typtype OPERATOR(pg_catalog.=) 'd')
        UNION ALL
        SELECT pg_catalog.format('constraint %I on %s', k.conname, k.conrelid::pg_catalog.regclass)
          FROM pg_catalog.pg_constraint AS k
         WHERE (k.conrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
                OR k.confrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels))
           AND k.conname OPERATOR(pg_catalog.<>) ALL (ARRAY['history_pkey', 'objects_pkey', 'floors_replica_key',
                                                          'replica_state_key', 'roles_pkey', 'roles_singleton_check'])
        UNION ALL
        SELECT pg_catalog.format('index %s', i.indexrelid::pg_catalog.regclass)
          FROM pg_catalog.pg_index AS i JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid
         WHERE i.indrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
           AND (c.relname OPERATOR(pg_catalog.<>) ALL (ARRAY['history_pkey', 'history_object_idx', 'objects_pkey',
                                                            'floors_replica_key', 'replica_state_key',
                                                            'replica_state_replica_idx', 'roles_pkey'])
                OR i.indexprs IS NOT NULL
                OR EXISTS (SELECT FROM pg_catalog.pg_opclass AS o
                            WHERE o.oid OPERATOR(pg_catalog.=) ANY (i.indclass::pg_catalog.oid[])
                              AND o.opcnamespace OPERATOR(pg_catalog.<>) 'pg_catalog'::pg_catalog.regnamespace))
        UNION ALL
        SELECT pg_catalog.format('statistics %I', x.stxname)
          FROM pg_catalog.pg_statistic_ext AS x WHERE x.stxrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
        UNION ALL
        SELECT pg_catalog.format('inheritance between %s and %s', h.inhrelid::pg_catalog.regclass, h.inhparent::pg_catalog.regclass)
          FROM pg_catalog.pg_inherits AS h
         WHERE h.inhrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
            OR h.inhparent OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
        UNION ALL
        SELECT pg_catalog.format('policy %I on %s', p.polname, p.polrelid::pg_catalog.regclass)
          FROM pg_catalog.pg_policy AS p WHERE p.polrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
        UNION ALL
        SELECT pg_catalog.format('row level security on %s', c.oid::pg_catalog.regclass)
          FROM pg_catalog.pg_class AS c
         WHERE c.oid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels) AND (c.relrowsecurity OR c.relforcerowsecurity)
        UNION ALL
        SELECT pg_catalog.format('rule %I on %s', w.rulename, w.ev_class::pg_catalog.regclass)
          FROM pg_catalog.pg_rewrite AS w
         WHERE w.ev_class OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
           AND w.rulename OPERATOR(pg_catalog.<>) '_RETURN'
        UNION ALL
        SELECT pg_catalog.format('default of %s.%I', a.attrelid::pg_catalog.regclass, a.attname)
          FROM pg_catalog.pg_attrdef AS d
          JOIN pg_catalog.pg_attribute AS a ON a.attrelid OPERATOR(pg_catalog.=) d.adrelid
                                           AND a.attnum OPERATOR(pg_catalog.=) d.adnum
         WHERE d.adrelid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
           AND (a.attname OPERATOR(pg_catalog.<>) ALL (ARRAY['generation', 'fence', 'public_reads', 'singleton'])
                OR pg_catalog.pg_get_expr(d.adbin, d.adrelid) OPERATOR(pg_catalog.<>) ALL (ARRAY['0', 'true']))
        UNION ALL
        SELECT pg_catalog.format('%s on %s to %s', a.privilege_type, c.oid::pg_catalog.regclass,
                                 CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE a.grantee::pg_catalog.regrole::text END)
          FROM pg_catalog.pg_class AS c, pg_catalog.aclexplode(c.relacl) AS a
         WHERE c.oid OPERATOR(pg_catalog.=) ANY (SELECT oid FROM rels)
           AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
           AND a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['TRIGGER', 'TRUNCATE', 'REFERENCES']))
    SELECT pg_catalog.array_agg(what) FROM found INTO foreign_objects;
    IF foreign_objects IS NOT NULL THEN
        RAISE EXCEPTION 'the extension''s tables carry what a fresh install does not have'
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Found: %s.', pg_catalog.array_to_string(foreign_objects, ', ')),
                  HINT = 'Code on them (or the right to attach it) would run as the extension''s owner once 0.4.0 gives the tables back to it: drop what was added, enable the triggers, revoke those privileges (after checking what they do), then run ALTER EXTENSION status_history UPDATE again.';
    END IF;
END
$$;


-- @@ stored rows decide (the write path)
-- The per-object state is folded from each row as stored (the WHEN of an
-- AFTER ROW trigger) instead of being written back after each statement from
-- what the insert trigger saw.  The state itself is unchanged.
DROP TRIGGER history_statement_end ON status_history.history;
DROP FUNCTION status_history.history_statement_trigger();
CREATE FUNCTION status_history.history_fold_trigger()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_fold_trigger'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_fold_trigger() IS
    'Never fires: the WHENs of its triggers, history_stored() and history_written(), fold each row as it is stored and write the objects back at the statement''s end, and are false.';

-- The WHEN of history_fold: PostgreSQL evaluates it as it stores each row,
-- with the stored tuple, and queues no event when it is false -- so the
-- state is folded from each row as stored, and a COPY of millions of rows
-- queues nothing in memory.  Run as the inserting role: executable by all
-- (it folds only rows the caller's own transaction stored).
CREATE FUNCTION status_history.history_stored(tid)
RETURNS boolean
AS 'MODULE_PATHNAME', 'status_history_history_stored'
LANGUAGE C STRICT;

-- The WHEN of history_written, evaluated as a statement's last row is
-- stored (before AFTER triggers fire): writes back the objects the statement
-- folded.  Run as the inserting role too.
CREATE FUNCTION status_history.history_written()
RETURNS boolean
AS 'MODULE_PATHNAME', 'status_history_history_written'
LANGUAGE C;

COMMENT ON FUNCTION status_history.history_written() IS
    'The WHEN of the history_written trigger: writes back the objects the statement folded, before its AFTER triggers fire; false (no event is queued).';

COMMENT ON FUNCTION status_history.history_stored(tid) IS
    'The WHEN of the history_fold trigger: folds the row just stored at the TID into its object''s state (written back at the end of the statement), hands report()''s rows back to it, and is false (no event is queued).';
CREATE TRIGGER history_fold
    AFTER INSERT ON status_history.history
    FOR EACH ROW WHEN (status_history.history_stored(NEW.ctid))
    EXECUTE FUNCTION status_history.history_fold_trigger();
CREATE TRIGGER history_written
    AFTER INSERT ON status_history.history
    FOR EACH STATEMENT WHEN (status_history.history_written())
    EXECUTE FUNCTION status_history.history_fold_trigger();
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_fold;
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_written;
COMMENT ON FUNCTION status_history.history_insert_trigger() IS
    'Validates a report, serializes it per object, stamps it, and decides from stored reports whether it is stale (fenced) or a repeat.';
-- Not for PUBLIC, as every function of a fresh install but the granted ones;
-- history_stored() is one of those (the inserting role runs it).
REVOKE ALL ON FUNCTION status_history.history_fold_trigger() FROM PUBLIC;
REVOKE ALL ON FUNCTION status_history.history_stored(tid), status_history.history_written() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.history_stored(tid), status_history.history_written() TO PUBLIC;

-- @@ rows refused one by one too (logical replication applies rows with row triggers only)
CREATE TRIGGER history_refuse_row
    BEFORE UPDATE OR DELETE ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION status_history.history_refuse_change();
ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_refuse_row;
COMMENT ON FUNCTION status_history.history_refuse_change() IS
    'Refuses UPDATE, DELETE and TRUNCATE on the append-only history (per statement, and per row for logical replication).';

-- @@ privileges (roles)
CREATE TABLE status_history.roles (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reporter     regrole,
    controller   regrole,
    reader       regrole,
    admin        regrole,
    public_reads boolean NOT NULL DEFAULT true
);
INSERT INTO status_history.roles DEFAULT VALUES;
SELECT pg_catalog.pg_extension_config_dump('status_history.roles', '');

COMMENT ON TABLE status_history.roles IS
    'The roles status_history.grant_roles() grants to (one row); admin may also import (supply occurred_at). Maintained by grant_roles().';
COMMENT ON COLUMN status_history.roles.singleton IS 'Always true: the table has one row.';
COMMENT ON COLUMN status_history.roles.reporter IS 'May report: INSERT on the history.';
COMMENT ON COLUMN status_history.roles.controller IS 'May report, reconnect(), retire_replica() and expire().';
COMMENT ON COLUMN status_history.roles.reader IS 'May read the history, the state, the views and the history questions.';
COMMENT ON COLUMN status_history.roles.admin IS 'May read, import (supply occurred_at), prune() and expire().';
COMMENT ON COLUMN status_history.roles.public_reads IS 'PUBLIC may read as a reader does (the default of a fresh install).';

CREATE TRIGGER roles_restore_merge
    BEFORE INSERT ON status_history.roles
    FOR EACH ROW EXECUTE FUNCTION status_history.restore_merge();
ALTER TABLE status_history.roles ENABLE ALWAYS TRIGGER roles_restore_merge;

CREATE FUNCTION status_history.apply_privileges()
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    r      status_history.roles;
    who    text;
    -- Everything that reads; everything everyone may call; the rest by role.
    reads  CONSTANT text := 'status_history.history, status_history.objects, status_history.floors,'
        ' status_history.statuses, status_history.replica_state, status_history.replica_statuses,'
        ' status_history.statuses_by_precedence';
    read_functions CONSTANT text := 'status_history.latest(text[], boolean),'
        ' status_history.latest_by_precedence(text[], boolean),'
        ' status_history.history_of(text, timestamptz, timestamptz),'
        ' status_history.intervals(text, timestamptz, timestamptz),'
        ' status_history.time_in_status(timestamptz, timestamptz, text[])';
    everyone_functions CONSTANT text := 'status_history.monotonic_now(), status_history.versions(),'
        ' status_history.report(text, text, text, jsonb, text, bigint, timestamptz, interval),'
        ' status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[], interval[]),'
        ' status_history.lapse_error(text, timestamptz),'
        ' status_history.stable_horizon(), status_history.changes(timestamptz, integer, boolean),'
        ' status_history.history_stored(tid), status_history.history_written()';
    controller_functions CONSTANT text := 'status_history.reconnect(bigint, text, text[]),'
        ' status_history.retire_replica(text, bigint), status_history.expire(integer)';
    admin_functions CONSTANT text := 'status_history.prune(integer, interval), status_history.expire(integer)';
BEGIN
    SELECT * INTO r FROM status_history.roles;
    -- Nothing for anyone first: what an earlier version, a recipe, an owner
    -- or an operator granted goes too, to whomever it was granted (a role
    -- holding TRIGGER could make the extension's owner run its code).
    FOR who IN SELECT 'PUBLIC'
               UNION
               SELECT x::text   -- (a regrole's text is a quoted identifier)
                 FROM pg_catalog.unnest(ARRAY[r.reporter, r.controller, r.reader, r.admin]) AS x
                WHERE x IS NOT NULL
               UNION
               SELECT g.grantee::pg_catalog.regrole::text
                 FROM (SELECT (pg_catalog.aclexplode(c.relacl)).grantee, c.relowner AS owner
                         FROM pg_catalog.pg_class AS c
                        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                       UNION ALL
                       SELECT (pg_catalog.aclexplode(a.attacl)).grantee, c.relowner
                         FROM pg_catalog.pg_attribute AS a
                         JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) a.attrelid
                        WHERE c.relnamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                       UNION ALL
                       SELECT (pg_catalog.aclexplode(p.proacl)).grantee, p.proowner
                         FROM pg_catalog.pg_proc AS p
                        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                       UNION ALL
                       SELECT (pg_catalog.aclexplode(n.nspacl)).grantee, n.nspowner
                         FROM pg_catalog.pg_namespace AS n
                        WHERE n.oid OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace) AS g
                WHERE g.grantee OPERATOR(pg_catalog.<>) g.owner AND g.grantee OPERATOR(pg_catalog.<>) 0
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA status_history FROM %s', who);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA status_history FROM %s', who);
        EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA status_history FROM %s', who);
        EXECUTE pg_catalog.format('REVOKE ALL ON SCHEMA status_history FROM %s', who);
    END LOOP;
    EXECUTE 'GRANT USAGE ON SCHEMA status_history TO PUBLIC';
    EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', everyone_functions);
    IF r.public_reads THEN
        EXECUTE pg_catalog.format('GRANT SELECT ON %s TO PUBLIC', reads);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', read_functions);
    END IF;
    IF r.reporter IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT INSERT ON status_history.history TO %s', r.reporter::text);
    END IF;
    IF r.controller IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT INSERT ON status_history.history TO %s', r.controller::text);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', controller_functions, r.controller::text);
    END IF;
    FOR who IN SELECT DISTINCT x::text
                 FROM pg_catalog.unnest(ARRAY[r.reader, r.admin]) AS x WHERE x IS NOT NULL
    LOOP
        EXECUTE pg_catalog.format('GRANT SELECT ON %s, status_history.roles TO %s', reads, who);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', read_functions, who);
    END LOOP;
    IF r.admin IS NOT NULL THEN
        EXECUTE pg_catalog.format('GRANT INSERT ON status_history.history TO %s', r.admin::text);
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO %s', admin_functions, r.admin::text);
    END IF;
END
$$;

COMMENT ON FUNCTION status_history.apply_privileges() IS
    'Grants exactly the privileges of the recorded roles (status_history.roles) and of PUBLIC, revoking everything else from every role but the owners; run by the install script, grant_roles() and a restore of roles.';

CREATE FUNCTION status_history.grant_roles(
    reporter     regrole DEFAULT NULL,
    controller   regrole DEFAULT NULL,
    reader       regrole DEFAULT NULL,
    admin        regrole DEFAULT NULL,
    public_reads boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    old status_history.roles;
    who regrole;
BEGIN
    IF public_reads IS NULL THEN
        RAISE EXCEPTION 'public_reads must not be null'
            USING ERRCODE = '22004', HINT = 'Pass false for least privilege (only the reader and admin roles read), true to let everyone read.';
    END IF;
    SELECT * INTO old FROM status_history.roles;
    -- Roles that no longer play a part keep nothing of it.
    FOREACH who IN ARRAY ARRAY[old.reporter, old.controller, old.reader, old.admin] LOOP
        IF who IS NOT NULL THEN
            EXECUTE pg_catalog.format('REVOKE ALL ON ALL TABLES IN SCHEMA status_history FROM %s', who::text);
            EXECUTE pg_catalog.format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA status_history FROM %s', who::text);
            EXECUTE pg_catalog.format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA status_history FROM %s', who::text);
        END IF;
    END LOOP;
    UPDATE status_history.roles AS r
       SET reporter = grant_roles.reporter, controller = grant_roles.controller,
           reader = grant_roles.reader, admin = grant_roles.admin,
           public_reads = grant_roles.public_reads;
    PERFORM status_history.apply_privileges();
END
$$;

COMMENT ON FUNCTION status_history.grant_roles(regrole, regrole, regrole, regrole, boolean) IS
    'Records the roles that report, control, read and administer (imports, prune()), and grants each exactly its part (docs/OPERATIONS.md: Roles); public_reads => false: PUBLIC no longer reads.';

-- What a database upgraded from before 0.4.0 had: the README's recipe made a
-- role the history's owner (for imports) and revoked reading from PUBLIC.
-- The tables go back to the extension's owner (a table's owner can run code
-- of its own in the extension's SECURITY DEFINER functions); that role is
-- recorded as the admin role; PUBLIC keeps reading or not.  This script
-- grants no role anything on anything (a GRANT in an extension script
-- records the object's whole ACL in pg_init_privs as the extension's own, and
-- pg_dump would then write REVOKEs from roles a restore may not have): the
-- operator runs status_history.grant_roles() once with all four roles
-- afterwards, which applies apply_privileges() outside the script.  A
-- WARNING says so (ALTER EXTENSION runs a script with client_min_messages
-- and log_min_messages at least WARNING: a NOTICE would reach no one).
-- Until then the old owner neither reads nor imports (it owned the history,
-- and the privileges it had as its owner went with it), the other roles keep
-- what they were granted, and PUBLIC keeps what earlier versions and
-- upgrades granted it.
DO $$
DECLARE
    owner   regrole := (SELECT e.extowner::regrole FROM pg_catalog.pg_extension AS e
                         WHERE e.extname OPERATOR(pg_catalog.=) 'status_history');
    old     regrole := (SELECT c.relowner::regrole FROM pg_catalog.pg_class AS c
                         WHERE c.oid OPERATOR(pg_catalog.=) 'status_history.history'::pg_catalog.regclass);
    rel     record;
    recorded_admin regrole;
    reads   boolean;
BEGIN
    IF old OPERATOR(pg_catalog.<>) owner THEN
        UPDATE status_history.roles SET admin = old;
    END IF;
    UPDATE status_history.roles
       SET public_reads = pg_catalog.has_table_privilege('public', 'status_history.statuses', 'SELECT');
    FOR rel IN SELECT c.oid::pg_catalog.regclass AS name, c.relkind FROM pg_catalog.pg_class AS c
                WHERE c.relnamespace OPERATOR(pg_catalog.=) 'status_history'::pg_catalog.regnamespace
                  AND c.relowner OPERATOR(pg_catalog.<>) owner AND c.relkind IN ('r', 'S', 'v')
    LOOP
        EXECUTE pg_catalog.format('ALTER %s %s OWNER TO %s',
                                  CASE rel.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW' ELSE 'TABLE' END,
                                  rel.name, owner);
    END LOOP;
    SELECT r.admin, r.public_reads INTO recorded_admin, reads FROM status_history.roles AS r;
    IF recorded_admin IS NULL THEN
        RAISE WARNING 'run status_history.grant_roles() now, with all four roles'
            USING DETAIL = 'From 0.4.0 on, the privileges of the roles that report, control, read and administer '
                           'are granted by grant_roles() (docs/OPERATIONS.md: Roles). Until it runs, roles keep what they were '
                           'granted before this upgrade, and PUBLIC keeps what earlier versions granted it.',
                  HINT = pg_catalog.format('Run, with your roles: SELECT status_history.grant_roles('
                                           'reporter => ..., controller => ..., reader => ..., admin => ..., '
                                           'public_reads => %s);',
                                           CASE WHEN reads THEN 'true' ELSE 'false' END);
    ELSE
        RAISE WARNING '%', pg_catalog.format('run status_history.grant_roles() now, with all four roles and admin => %L',
                                            recorded_admin::text)
            USING DETAIL = pg_catalog.format('%s owned the history before this upgrade and is recorded as the admin '
                                             'role; the history belongs to the extension''s owner again, so %s '
                                             'neither reads the history nor imports until grant_roles() grants the '
                                             'admin''s part. The other roles keep what they were granted, and PUBLIC '
                                             'keeps what earlier versions granted it.', recorded_admin, recorded_admin),
                  HINT = pg_catalog.format('Run, with your roles: SELECT status_history.grant_roles('
                                           'reporter => ..., controller => ..., reader => ..., admin => %L, '
                                           'public_reads => %s);',
                                           recorded_admin::text, CASE WHEN reads THEN 'true' ELSE 'false' END);
    END IF;
END
$$;
-- What this script creates is not for PUBLIC, as in a fresh install; the
-- roles get their part of it from grant_roles().  (Only what it creates: a
-- GRANT or REVOKE in an extension script records the object's whole ACL as
-- the extension's own, operators' grants on older objects included, and
-- pg_dump would then no longer dump those.)
REVOKE ALL ON TABLE status_history.roles FROM PUBLIC;
REVOKE ALL ON FUNCTION status_history.apply_privileges() FROM PUBLIC;
REVOKE ALL ON FUNCTION status_history.grant_roles(regrole, regrole, regrole, regrole, boolean) FROM PUBLIC;

-- @@ leases: a report may hold for a lease only (readers show the lapse,
-- expire() records it).  New columns at the end, as a fresh install has
-- them; report() and report_many() take a lease; the readers show lapses.
ALTER TABLE status_history.history ADD COLUMN lease interval;
COMMENT ON COLUMN status_history.history.lease IS
    'How long the status holds unless its key reports again (a repeat renews it); past it, readers show the key stalled and expire() records that. Positive, in days, hours, minutes and seconds (a day is 24 hours; stored as hours). NULL: no lease.';
ALTER TABLE status_history.objects ADD COLUMN lease interval, ADD COLUMN expires_at timestamptz,
    ADD COLUMN lapse_error text;
COMMENT ON COLUMN status_history.objects.lease IS 'Lease of the current report.';
COMMENT ON COLUMN status_history.objects.expires_at IS
    'When the current report''s lease runs out: its key''s last report or repeat of it, plus the lease; NULL without a lease.';
COMMENT ON COLUMN status_history.objects.lapse_error IS
    'The error readers show once the lease has run out: lapse_error(replica, expires_at - lease), written with expires_at (so that statuses need not format it per row).';
ALTER TABLE status_history.replica_state ADD COLUMN expires_at timestamptz;
COMMENT ON COLUMN status_history.replica_state.expires_at IS
    'When the lease of the key''s newest non-stale report runs out: when the key last reported it or repeated it, plus its lease; NULL without a lease.';

DROP FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz);
DROP FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[]);
CREATE FUNCTION status_history.report(
    object_id   text,
    status      text,
    error       text        DEFAULT NULL,
    details     jsonb       DEFAULT NULL,
    replica_id  text        DEFAULT NULL,
    generation  bigint      DEFAULT 0,
    reported_at timestamptz DEFAULT NULL,
    lease       interval    DEFAULT NULL)
RETURNS status_history.history
AS 'MODULE_PATHNAME', 'status_history_report'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz, interval) IS
    'Appends one report stamped by the database clock and returns the stored row (stale when fenced); with a lease, the status holds that long unless the key reports again.';

CREATE FUNCTION status_history.report_many(
    object_ids  text[],
    statuses    text[],
    errors      text[]        DEFAULT NULL,
    details     jsonb[]       DEFAULT NULL,
    replica_ids text[]        DEFAULT NULL,
    generations bigint[]      DEFAULT NULL,
    reported_at timestamptz[] DEFAULT NULL,
    leases      interval[]    DEFAULT NULL)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_report_many'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[], interval[]) IS
    'Appends a batch of reports (element i of each array is report i) after locking their objects in one fixed order, so that batches never deadlock; returns the stored rows.';

-- The error of a lapse, as readers show it and expire() records it: the
-- same text in every session (UTC, whatever the session's TimeZone).  The
-- one function without a pinned search_path: a SET clause would keep it
-- from being inlined into the views (a call per lapsed row cost 7x a scan
-- of statuses, docs/BENCHMARKS.md); every name and operator in it is
-- qualified instead, so a caller's search_path cannot change it.
CREATE FUNCTION status_history.lapse_error(replica_id text, seen_at timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT 'lease expired: no report'
           OPERATOR(pg_catalog.||) COALESCE(' from replica ' OPERATOR(pg_catalog.||) replica_id, '')
           OPERATOR(pg_catalog.||) ' since '
           OPERATOR(pg_catalog.||) pg_catalog.to_char(seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')
           OPERATOR(pg_catalog.||) '+00'
           OPERATOR(pg_catalog.||) CASE WHEN seen_at OPERATOR(pg_catalog.<) '0001-01-01 00:00:00+00'::pg_catalog.timestamptz
                                        THEN ' BC' ELSE '' END
$$;

COMMENT ON FUNCTION status_history.lapse_error(text, timestamptz) IS
    'The error of a lapsed lease, as readers show it and expire() records it: lease expired: no report from replica R since T (T in UTC).';

CREATE OR REPLACE VIEW status_history.statuses AS
    SELECT o.object_id,
           CASE WHEN l.lapsed THEN 'stalled' ELSE o.status END AS status,
           CASE WHEN l.lapsed
                THEN o.lapse_error
                ELSE o.error END AS error,
           CASE WHEN l.lapsed THEN NULL ELSE o.details END AS details,
           o.replica_id,
           o.generation,
           o.occurred_at,
           CASE WHEN l.lapsed AND o.status OPERATOR(pg_catalog.<>) 'stalled'
                THEN o.expires_at ELSE o.status_since END AS status_since,
           CASE WHEN l.lapsed THEN o.expires_at ELSE o.reported_at END AS reported_at,
           o.fence,
           o.expires_at
      FROM status_history.objects AS o
     CROSS JOIN LATERAL (SELECT o.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed) AS l
     WHERE o.occurred_at IS NOT NULL
       AND o.status OPERATOR(pg_catalog.<>) 'dropped';

COMMENT ON VIEW status_history.statuses IS
    'Current status of every object that is not dropped (stalled, with the lapse as error, once the current report''s lease ran out); WHERE object_id = ... is a primary-key lookup.';
COMMENT ON COLUMN status_history.statuses.object_id IS 'The object.';
COMMENT ON COLUMN status_history.statuses.status IS 'Current status.';
COMMENT ON COLUMN status_history.statuses.error IS 'Error of the current report.';
COMMENT ON COLUMN status_history.statuses.details IS 'Details of the current report.';
COMMENT ON COLUMN status_history.statuses.replica_id IS 'Replica of the current report.';
COMMENT ON COLUMN status_history.statuses.generation IS 'Generation of the current report.';
COMMENT ON COLUMN status_history.statuses.occurred_at IS 'Stamp of the current report.';
COMMENT ON COLUMN status_history.statuses.status_since IS
    'When the object entered its current status (first report of the current unbroken run).';
COMMENT ON COLUMN status_history.statuses.reported_at IS 'Reporter clock of the current report.';
COMMENT ON COLUMN status_history.statuses.fence IS 'The object''s fence generation.';
COMMENT ON COLUMN status_history.statuses.expires_at IS
    'When the current report''s lease runs out (or ran out: the status shows stalled since then); NULL without a lease.';

CREATE OR REPLACE VIEW status_history.replica_statuses AS
    SELECT k.object_id,
           k.replica_id,
           CASE WHEN l.lapsed THEN 'stalled' ELSE h.status END AS status,
           CASE WHEN l.lapsed
                THEN status_history.lapse_error(k.replica_id, k.expires_at OPERATOR(pg_catalog.-) h.lease)
                ELSE h.error END AS error,
           CASE WHEN l.lapsed THEN NULL ELSE h.details END AS details,
           h.generation,
           k.occurred_at,
           CASE WHEN l.lapsed AND h.status OPERATOR(pg_catalog.<>) 'stalled'
                THEN k.expires_at ELSE k.status_since END AS status_since,
           CASE WHEN l.lapsed THEN k.expires_at ELSE h.reported_at END AS reported_at,
           k.last_at,
           k.last_seen_at,
           f.retired_at IS NOT NULL AS retired,
           k.expires_at
      FROM status_history.replica_state AS k
     CROSS JOIN LATERAL (SELECT k.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed) AS l
      LEFT JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
      LEFT JOIN status_history.floors AS f
        ON f.replica_id OPERATOR(pg_catalog.=) k.replica_id;

COMMENT ON VIEW status_history.replica_statuses IS
    'One row per key (object_id, replica_id): its newest non-stale report, and when it last reported; WHERE object_id = ... is an index lookup.';
COMMENT ON COLUMN status_history.replica_statuses.object_id IS 'The object.';
COMMENT ON COLUMN status_history.replica_statuses.replica_id IS 'The replica (NULL: reports without one).';
COMMENT ON COLUMN status_history.replica_statuses.status IS
    'Status of the key''s newest non-stale report (stalled once its lease ran out); NULL when it has only stale ones.';
COMMENT ON COLUMN status_history.replica_statuses.error IS 'Error of that report.';
COMMENT ON COLUMN status_history.replica_statuses.details IS 'Details of that report.';
COMMENT ON COLUMN status_history.replica_statuses.generation IS 'Generation of that report.';
COMMENT ON COLUMN status_history.replica_statuses.occurred_at IS 'Stamp of that report.';
COMMENT ON COLUMN status_history.replica_statuses.status_since IS
    'When the key entered that status (first report of its current unbroken run).';
COMMENT ON COLUMN status_history.replica_statuses.reported_at IS 'Reporter clock of that report.';
COMMENT ON COLUMN status_history.replica_statuses.last_at IS
    'Stamp of the key''s newest row, stale or not.';
COMMENT ON COLUMN status_history.replica_statuses.last_seen_at IS
    'When the key last reported anything, repeats included (heartbeats).';
COMMENT ON COLUMN status_history.replica_statuses.retired IS
    'The replica was retired by retire_replica(): its reports are stale and its key no longer counts.';
COMMENT ON COLUMN status_history.replica_statuses.expires_at IS
    'When the lease of that report runs out (or ran out: the key shows stalled since then); NULL without a lease.';

CREATE OR REPLACE VIEW status_history.statuses_by_precedence AS
    SELECT o.object_id,
           k.status,
           CASE WHEN k.lapsed
                THEN status_history.lapse_error(h.replica_id, k.expires_at OPERATOR(pg_catalog.-) h.lease)
                ELSE h.error END AS error,
           CASE WHEN k.lapsed THEN NULL ELSE h.details END AS details,
           h.replica_id,
           h.generation,
           h.occurred_at,
           CASE WHEN k.lapsed AND h.status OPERATOR(pg_catalog.<>) 'stalled'
                THEN k.expires_at ELSE k.status_since END AS status_since,
           CASE WHEN k.lapsed THEN k.expires_at ELSE h.reported_at END AS reported_at,
           o.fence,
           k.expires_at
      FROM status_history.objects AS o
     CROSS JOIN LATERAL (
           SELECT s.occurred_at, s.status_since, s.expires_at, d.status, d.lapsed
             FROM status_history.replica_state AS s
            CROSS JOIN LATERAL (
                  SELECT s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed,
                         CASE WHEN s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                              THEN 'stalled' ELSE s.status END AS status) AS d
            WHERE s.object_id OPERATOR(pg_catalog.=) o.object_id
              AND s.occurred_at IS NOT NULL
              AND (d.status OPERATOR(pg_catalog.=) 'paused'
                   OR NOT EXISTS (SELECT FROM status_history.floors AS f
                                   WHERE f.replica_id OPERATOR(pg_catalog.=) s.replica_id
                                     AND f.retired_at IS NOT NULL))
            ORDER BY pg_catalog.array_position('{ceased,paused,starting,stalled,running,dropped}'::text[],
                                               d.status) DESC NULLS LAST,
                     s.occurred_at DESC
            LIMIT 1) AS k
      JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
     WHERE h.status OPERATOR(pg_catalog.<>) 'dropped';

COMMENT ON VIEW status_history.statuses_by_precedence IS
    'One status per object by precedence (Materialize''s rule, opt-in): of each live key''s newest non-stale report (stalled once its lease ran out; a retired replica''s key only when paused), the highest of dropped > running > stalled > starting > paused > ceased, the newest among equals; dropped objects hidden. WHERE object_id = ... is an index lookup.';
COMMENT ON COLUMN status_history.statuses_by_precedence.object_id IS 'The object.';
COMMENT ON COLUMN status_history.statuses_by_precedence.status IS 'Status of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.error IS 'Error of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.details IS 'Details of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.replica_id IS
    'Replica of the chosen report (NULL: a report without one).';
COMMENT ON COLUMN status_history.statuses_by_precedence.generation IS 'Generation of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.occurred_at IS 'Stamp of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.status_since IS
    'When the chosen key entered that status (first report of its current unbroken run).';
COMMENT ON COLUMN status_history.statuses_by_precedence.reported_at IS 'Reporter clock of the chosen report.';
COMMENT ON COLUMN status_history.statuses_by_precedence.fence IS 'The object''s fence generation.';
COMMENT ON COLUMN status_history.statuses_by_precedence.expires_at IS
    'When the chosen report''s lease runs out (or ran out: it shows stalled since then); NULL without a lease.';

CREATE OR REPLACE FUNCTION status_history.latest_by_precedence(
    object_ids      text[]  DEFAULT NULL,
    include_dropped boolean DEFAULT false)
RETURNS SETOF status_history.history
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    -- Every object, or (a second branch, so that a list is an index lookup
    -- also under the generic plan a SQL function gets) the listed ones.  The
    -- key is chosen as in statuses_by_precedence, verbatim (a shared view or
    -- function would cost a schema object or a call per object); the
    -- regression test precedence checks both against brute force.
    WITH scope AS (
        SELECT o.object_id FROM status_history.objects AS o
         WHERE object_ids IS NULL
        UNION ALL
        SELECT o.object_id FROM status_history.objects AS o
         WHERE o.object_id OPERATOR(pg_catalog.=) ANY (object_ids)
    )
    SELECT h.occurred_at, h.object_id, k.status,
           CASE WHEN k.lapsed
                THEN status_history.lapse_error(h.replica_id, k.expires_at OPERATOR(pg_catalog.-) h.lease)
                ELSE h.error END,
           CASE WHEN k.lapsed THEN NULL ELSE h.details END,
           h.replica_id, h.generation,
           CASE WHEN k.lapsed THEN k.expires_at ELSE h.reported_at END,
           h.stale,
           CASE WHEN k.lapsed THEN NULL ELSE h.lease END
      FROM scope AS o
     CROSS JOIN LATERAL (
           SELECT s.occurred_at, s.expires_at, d.status, d.lapsed
             FROM status_history.replica_state AS s
            CROSS JOIN LATERAL (
                  SELECT s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now() AS lapsed,
                         CASE WHEN s.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()
                              THEN 'stalled' ELSE s.status END AS status) AS d
            WHERE s.object_id OPERATOR(pg_catalog.=) o.object_id
              AND s.occurred_at IS NOT NULL
              AND (d.status OPERATOR(pg_catalog.=) 'paused'
                   OR NOT EXISTS (SELECT FROM status_history.floors AS f
                                   WHERE f.replica_id OPERATOR(pg_catalog.=) s.replica_id
                                     AND f.retired_at IS NOT NULL))
            ORDER BY pg_catalog.array_position('{ceased,paused,starting,stalled,running,dropped}'::text[],
                                               d.status) DESC NULLS LAST,
                     s.occurred_at DESC
            LIMIT 1) AS k
      JOIN status_history.history AS h
        ON h.occurred_at OPERATOR(pg_catalog.=) k.occurred_at
     WHERE include_dropped IS TRUE OR h.status OPERATOR(pg_catalog.<>) 'dropped'
$$;

COMMENT ON FUNCTION status_history.latest_by_precedence(text[], boolean) IS
    'For each object (or each listed one), its report chosen by precedence as in statuses_by_precedence; dropped objects only when include_dropped.';

CREATE FUNCTION status_history.expire(max_objects integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'status_history_expire'
LANGUAGE C VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.expire(integer) IS
    'Appends, for every object whose current report''s lease ran out (at most max_objects of them; NULL: all), the lapse readers already show (stalled, the lapse as error, the report''s replica and generation), each re-checked under its object''s lock; returns the number of rows appended. The background worker calls it every status_history.expire_interval, in batches.';

REVOKE ALL ON FUNCTION status_history.expire(integer) FROM PUBLIC;
-- Everyone's, with the explicit privileges a fresh install's apply_privileges() records.
REVOKE ALL ON FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.report(text, text, text, jsonb, text, bigint, timestamptz, interval) TO PUBLIC;
REVOKE ALL ON FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[], interval[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.report_many(text[], text[], text[], jsonb[], text[], bigint[], timestamptz[], interval[]) TO PUBLIC;
REVOKE ALL ON FUNCTION status_history.lapse_error(text, timestamptz) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.lapse_error(text, timestamptz) TO PUBLIC;

-- @@ change feed
CREATE TABLE status_history.feed (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pruned_through timestamptz
);
INSERT INTO status_history.feed DEFAULT VALUES;

COMMENT ON TABLE status_history.feed IS
    'The change feed''s one row: how far prune() has removed rows. Maintained by the extension only.';
COMMENT ON COLUMN status_history.feed.singleton IS 'Always true: the table has one row.';
COMMENT ON COLUMN status_history.feed.pruned_through IS
    'The newest stamp prune() removed: a consumer of changes() behind it may have lost rows. NULL: nothing pruned.';

-- The horizon as the primary last gave it out, WAL-logged (not
-- transactional): a standby's horizon, and the floor of imports after a
-- restart.  Microseconds since 2000-01-01 UTC; not called yet: none.
CREATE SEQUENCE status_history.feed_horizon AS bigint
    MINVALUE -9223372036854775807 START -9223372036854775807;
COMMENT ON SEQUENCE status_history.feed_horizon IS
    'The stable horizon the primary last gave out (microseconds since 2000-01-01 UTC), as a standby reads it. Maintained by the extension.';

CREATE FUNCTION status_history.stable_horizon()
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'status_history_stable_horizon'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.stable_horizon() IS
    'A stamp below which every row of the history is committed or will never exist: the oldest stamp a running or prepared transaction holds, else the next stamp. Never goes back.';

CREATE FUNCTION status_history.changes(
    after       timestamptz DEFAULT NULL,
    max_rows    integer     DEFAULT 1000,
    skip_pruned boolean     DEFAULT false)
RETURNS SETOF status_history.history
AS 'MODULE_PATHNAME', 'status_history_changes'
LANGUAGE C VOLATILE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.changes(timestamptz, integer, boolean) IS
    'The history rows stamped after after and below stable_horizon(), oldest first, at most max_rows: loop changes(the last stamp returned) to see every committed row once, in stamp order. Fails (55000) when prune() removed rows after after, unless skip_pruned.';

-- As a fresh install's apply_privileges() leaves them: the table and the
-- sequence the extension's own, the functions everyone's (changes() reads
-- the history as its caller, who needs a reader's SELECT on it).
REVOKE ALL ON TABLE status_history.feed FROM PUBLIC;
REVOKE ALL ON SEQUENCE status_history.feed_horizon FROM PUBLIC;
REVOKE ALL ON FUNCTION status_history.stable_horizon() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.stable_horizon() TO PUBLIC;
REVOKE ALL ON FUNCTION status_history.changes(timestamptz, integer, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.changes(timestamptz, integer, boolean) TO PUBLIC;

-- @@ publications: replica_state and floors are updated in place and have
-- no unique index on NOT NULL columns; a publication of all tables needs a
-- replica identity to publish their updates (else every report failed).
ALTER TABLE status_history.replica_state REPLICA IDENTITY FULL;
ALTER TABLE status_history.floors REPLICA IDENTITY FULL;

-- @@ floors kept across transactions: every write of floors tells the
-- backends that kept them to read them again.
CREATE FUNCTION status_history.floors_changed()
RETURNS trigger
AS 'MODULE_PATHNAME', 'status_history_floors_changed'
LANGUAGE C;

COMMENT ON FUNCTION status_history.floors_changed() IS
    'After every write of status_history.floors, whoever writes: backends read the floors again instead of using the ones they kept.';
CREATE TRIGGER floors_changed
    AFTER INSERT OR UPDATE OR DELETE ON status_history.floors
    FOR EACH ROW EXECUTE FUNCTION status_history.floors_changed();
CREATE TRIGGER floors_truncated
    AFTER TRUNCATE ON status_history.floors
    FOR EACH STATEMENT EXECUTE FUNCTION status_history.floors_changed();
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_changed;
ALTER TABLE status_history.floors ENABLE ALWAYS TRIGGER floors_truncated;
REVOKE ALL ON FUNCTION status_history.floors_changed() FROM PUBLIC;

-- @@ versions: the library serves the SQL objects of its own version only
-- (every upgrade script ends by replacing versions(), see the install script).
CREATE OR REPLACE FUNCTION status_history.versions(OUT library text, OUT extension text)
RETURNS record
AS 'MODULE_PATHNAME', 'status_history_versions'
LANGUAGE C STABLE
SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION status_history.versions() IS
    'The version of the loaded status_history library, and of the extension installed in this database; they must be equal.';
REVOKE ALL ON FUNCTION status_history.versions() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION status_history.versions() TO PUBLIC;
