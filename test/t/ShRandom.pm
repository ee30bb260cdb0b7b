# The randomized differential test (004_random_differential.pl): the SQL
# harness it installs beside the extension (the brute-force oracle, the
# shadow of the fences, the wrapper every reconnect() goes through, and the
# functions, tables and triggers the statement shapes need), a psql session
# driven statement by statement, and the generator of random statements.
package ShRandom;

use strict;
use warnings;
use IPC::Run;

# ---------------------------------------------------------------------------
# The harness, installed into a template database once per run.
# ---------------------------------------------------------------------------
sub harness_sql
{
	return <<'SQL';
CREATE EXTENSION plperl;
CREATE EXTENSION status_history;
CREATE SCHEMA sh;

-- Reports made while a row of the history is being inserted: from a CHECK
-- constraint, a row security policy, a generated column, BEFORE triggers
-- before and after the extension's (the later one may also change the row
-- or skip it), an AFTER ROW trigger and an AFTER STATEMENT trigger with a
-- transition table.  Each acts only inside sh.nesting() or sh.as_rls() (the
-- setting sh.nest), on rows whose error says what to do:
-- '<how>:<objects>:<status>:<depth>' reports that status on the first of the
-- objects (a /-separated list), with error '<how>:<the rest, rotated>:<status>:<depth - 1>'
-- while depth > 1; 'chg:gen:<n>' and 'chg:rep:<id>' change the row's
-- generation or replica after the extension decided it; 'skip' skips it.
CREATE FUNCTION sh.nested_report(how text, err text, gen bigint) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    p text[];
    objs text[];
    depth integer;
BEGIN
    IF current_setting('sh.nest', true) IS DISTINCT FROM 'on' OR err IS NULL
       OR err NOT LIKE how || ':%' THEN
        RETURN true;
    END IF;
    p := string_to_array(err, ':');
    objs := string_to_array(p[2], '/');
    depth := coalesce(p[4]::integer, 1);
    PERFORM status_history.report(objs[1], p[3],
        CASE WHEN depth > 1
             THEN format('%s:%s:%s:%s', how,
                         array_to_string(objs[2:] || objs[1:1], '/'), p[3], depth - 1)
             ELSE 'nested ' || how END,
        generation => gen);
    RETURN true;
END $$;
CREATE FUNCTION sh.nested_report_imm(how text, err text, gen bigint) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT sh.nested_report(how, err, gen) $$;
-- Run a statement with the nested reports on.
CREATE FUNCTION sh.nesting(q text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('sh.nest', 'on', true);
    EXECUTE q;
    PERFORM set_config('sh.nest', 'off', true);
END $$;
CREATE FUNCTION sh.nest_before() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM sh.nested_report(TG_ARGV[0], NEW.error, NEW.generation);
    IF TG_ARGV[0] = 'bt' AND current_setting('sh.nest', true) = 'on' THEN
        IF NEW.error = 'skip' THEN
            RETURN NULL;
        ELSIF NEW.error LIKE 'chg:gen:%' THEN
            NEW.generation := split_part(NEW.error, ':', 3)::bigint;
        ELSIF NEW.error LIKE 'chg:rep:%' THEN
            NEW.replica_id := split_part(NEW.error, ':', 3);
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE FUNCTION sh.nest_after() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        PERFORM sh.nested_report('af', NEW.error, NEW.generation);
    ELSE
        PERFORM sh.nested_report('as', n.error, n.generation) FROM new_rows AS n;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER a_nest_before BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION sh.nest_before('ab');
CREATE TRIGGER zz_nest_before BEFORE INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION sh.nest_before('bt');
CREATE TRIGGER zz_nest_after AFTER INSERT ON status_history.history
    FOR EACH ROW EXECUTE FUNCTION sh.nest_after();
CREATE TRIGGER zz_nest_stmt AFTER INSERT ON status_history.history REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sh.nest_after();
ALTER TABLE status_history.history ADD CONSTRAINT sh_nest_check
    CHECK (sh.nested_report('ck', error, generation)) NOT VALID;
ALTER TABLE status_history.history ADD COLUMN sh_nest_gen boolean
    GENERATED ALWAYS AS (sh.nested_report_imm('gen', error, generation)) STORED;
-- Row security applies to sh_rls, not to superusers: its statements run
-- through sh.as_rls(), a function it owns.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sh_rls') THEN CREATE ROLE sh_rls; END IF;
END $$;
GRANT USAGE ON SCHEMA sh TO sh_rls;
GRANT INSERT ON status_history.history TO sh_rls;
ALTER TABLE status_history.history ENABLE ROW LEVEL SECURITY;
CREATE POLICY sh_nest_policy ON status_history.history FOR INSERT TO sh_rls
    WITH CHECK (sh.nested_report('pol', error, generation));
CREATE FUNCTION sh.as_rls(q text) RETURNS void LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM set_config('sh.nest', 'on', true);
    EXECUTE q;
    PERFORM set_config('sh.nest', 'off', true);
END $$;
ALTER FUNCTION sh.as_rls(text) OWNER TO sh_rls;


-- ===========================================================================
-- Shadow state, written by the test's own wrappers in the same
-- (sub)transaction as the statement, so a rollback undoes both alike.
-- ===========================================================================
-- What every successful sh.reconnect(g, rep, ids) did, at = a stamp taken
-- right after it (reports stamped later are under it): one row per object
-- in its scope (object_id), and, without a list, one row for the floor it
-- may raise (object_id NULL; replica_id rep: NULL is database-wide).
CREATE TABLE sh.fence_log (object_id text, replica_id text, generation bigint NOT NULL,
                           at timestamptz NOT NULL);
-- Every row a successful reconnect() returned.
CREATE TABLE sh.restamps (r status_history.history NOT NULL);
-- How this build treats a reconnect() without an object list (probed at the
-- start of the test, see 004_random_differential.pl): whether it raises
-- generation floors, and what they do.
CREATE TABLE sh.settings (
    floor_all_stale     boolean NOT NULL,  -- a report below the database-wide floor is stale
    floor_new_fence     boolean NOT NULL,  -- an object created later starts with that fence
    floor_replica_stale boolean NOT NULL,  -- a report of replica r below r's floor is stale
    floor_blocks        boolean NOT NULL   -- reconnect(g) fails (55000) below its own floor
);
INSERT INTO sh.settings VALUES (false, false, false, false);

-- ===========================================================================
-- FENCE SEMANTICS: the one place that says what fences are.
-- ===========================================================================
-- The floor (database-wide for rep NULL, else replica rep's) before stamp t.
CREATE FUNCTION sh.floor_at(rep text, t timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(max(f.generation), 0) FROM sh.fence_log AS f
     WHERE f.object_id IS NULL AND f.replica_id IS NOT DISTINCT FROM rep AND f.at < t
$$;

-- When the object came to be: its first report, or a reconnect listing it.
CREATE FUNCTION sh.created(obj text) RETURNS timestamptz
LANGUAGE sql STABLE AS $$
    SELECT least((SELECT min(h.occurred_at) FROM status_history.history AS h WHERE h.object_id = obj),
                 (SELECT min(f.at) FROM sh.fence_log AS f WHERE f.object_id = obj))
$$;

-- The object's fence (status_history.objects.fence) at stamp t: the highest
-- generation of a reconnect with the object in scope before t, and (if the
-- build does that) the database-wide floor when the object was created.
CREATE FUNCTION sh.fence_at(obj text, t timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        (SELECT coalesce(max(f.generation), 0) FROM sh.fence_log AS f
          WHERE f.object_id = obj AND f.at < t),
        CASE WHEN (SELECT s.floor_new_fence FROM sh.settings AS s)
             THEN sh.floor_at(NULL, least(t, sh.created(obj))) ELSE 0 END)
$$;

-- The generation a report of replica rep on obj stamped t must reach not
-- to be stale: the object's fence, and the floors (if the build has them).
CREATE FUNCTION sh.report_fence(obj text, rep text, t timestamptz) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT greatest(
        sh.fence_at(obj, t),
        CASE WHEN s.floor_all_stale THEN sh.floor_at(NULL, t) ELSE 0 END,
        CASE WHEN s.floor_replica_stale AND rep IS NOT NULL THEN sh.floor_at(rep, t) ELSE 0 END)
      FROM sh.settings AS s
$$;

-- Every object the extension must know: reported on, or listed in a reconnect.
CREATE FUNCTION sh.all_objects() RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT h.object_id FROM status_history.history AS h
    UNION
    SELECT f.object_id FROM sh.fence_log AS f WHERE f.object_id IS NOT NULL
$$;

-- reconnect()'s scope: the listed objects; else those the replica reported
-- on; else every object.
CREATE FUNCTION sh.scope(rep text, ids text[]) RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT DISTINCT i.id FROM unnest(ids) AS i(id) WHERE ids IS NOT NULL
    UNION
    SELECT h.object_id FROM status_history.history AS h
     WHERE ids IS NULL AND rep IS NOT NULL AND h.replica_id = rep
    UNION
    SELECT a.id FROM sh.all_objects() AS a(id) WHERE ids IS NULL AND rep IS NULL
$$;

-- reconnect(g, ...) must fail with 55000 iff an object in scope has a
-- higher fence, or (if floors block) without a list its floor is higher, or
-- with a list the database-wide floor or the replica's is.
CREATE FUNCTION sh.expect_fail(g bigint, rep text, ids text[]) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT FROM sh.scope(rep, ids) AS s(id) WHERE sh.fence_at(s.id, 'infinity') > g)
        OR ((SELECT s.floor_blocks FROM sh.settings AS s)
            AND (sh.floor_at(rep, 'infinity') > g
                 OR (ids IS NOT NULL AND sh.floor_at(NULL, 'infinity') > g)))
$$;

-- ===========================================================================
-- The current report, brute force from the history.
-- ===========================================================================
-- The newest non-stale report (all NULL when there is none).
CREATE FUNCTION sh.current(obj text) RETURNS status_history.history
LANGUAGE sql STABLE AS $$
    SELECT * FROM status_history.history AS h
     WHERE h.object_id = obj AND NOT h.stale
     ORDER BY h.occurred_at DESC LIMIT 1
$$;

-- The same for every object at once.
CREATE VIEW sh.current_rows AS
    SELECT DISTINCT ON (h.object_id) h.*
      FROM status_history.history AS h
     WHERE NOT h.stale
     ORDER BY h.object_id, h.occurred_at DESC;

-- What status_history.objects must hold.  status_since: the first stamp of
-- the final unbroken run of non-stale reports with the current status, i.e.
-- the oldest non-stale report newer than the newest non-stale report with
-- another status.
CREATE VIEW sh.expected AS
    WITH cur AS MATERIALIZED (
        SELECT * FROM sh.current_rows
    ), last_other AS (
        SELECT c.object_id, max(h.occurred_at) AS at
          FROM cur AS c
          JOIN status_history.history AS h
            ON h.object_id = c.object_id AND NOT h.stale AND h.status <> c.status
         GROUP BY c.object_id
    ), run_start AS (
        SELECT c.object_id, min(h.occurred_at) AS status_since
          FROM cur AS c
          JOIN status_history.history AS h ON h.object_id = c.object_id AND NOT h.stale
          LEFT JOIN last_other AS l ON l.object_id = c.object_id
         WHERE h.occurred_at > coalesce(l.at, '-infinity')
         GROUP BY c.object_id
    )
    SELECT a.id AS object_id, sh.fence_at(a.id, 'infinity') AS fence,
           c.occurred_at, c.status, c.error, c.details, c.replica_id, c.generation,
           c.reported_at, r.status_since
      FROM sh.all_objects() AS a(id)
      LEFT JOIN cur AS c ON c.object_id = a.id
      LEFT JOIN run_start AS r ON r.object_id = a.id;

-- ===========================================================================
-- RE-STAMP SEMANTICS: what reconnect(g, rep, ...) must append, one row per
-- live (current report, not dropped) object in scope: a copy of the current
-- report (rep NULL), or of the newest non-stale report of replica rep (none
-- when it has none), with generation g.
-- ===========================================================================
CREATE FUNCTION sh.fields_text(o text, st text, err text, det jsonb, rep text, gen bigint,
                               rat timestamptz) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format('(%s, %s, error %s, details %s, replica %s, gen %s, reported_at %s)',
                  o, st, coalesce(err, '-'), coalesce(det::text, '-'),
                  coalesce(rep, '-'), gen, coalesce(rat::text, '-'))
$$;
CREATE FUNCTION sh.row_text(h status_history.history) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT sh.fields_text(h.object_id, h.status, h.error, h.details, h.replica_id, h.generation,
                          h.reported_at)
$$;

CREATE FUNCTION sh.expected_restamps(g bigint, rep text, scope text[]) RETURNS SETOF text
LANGUAGE sql STABLE AS $$
    SELECT sh.fields_text(s.id, x.status, x.error, x.details, x.replica_id, g, x.reported_at)
      FROM unnest(scope) AS s(id)
     CROSS JOIN LATERAL sh.current(s.id) AS c
     CROSS JOIN LATERAL (
            SELECT c.status, c.error, c.details, c.replica_id, c.reported_at WHERE rep IS NULL
            UNION ALL
            (SELECT h.status, h.error, h.details, h.replica_id, h.reported_at
               FROM status_history.history AS h
              WHERE rep IS NOT NULL AND h.object_id = s.id AND h.replica_id = rep AND NOT h.stale
              ORDER BY h.occurred_at DESC LIMIT 1)) AS x
     WHERE c.occurred_at IS NOT NULL AND c.status <> 'dropped'
$$;

-- ===========================================================================
-- The only way the test calls reconnect(): the call itself is unchanged; the
-- wrapper checks it against the shadow and records into the shadow.
-- ===========================================================================
CREATE FUNCTION sh.reconnect(g bigint, rep text DEFAULT NULL, ids text[] DEFAULT NULL)
RETURNS SETOF status_history.history LANGUAGE plpgsql AS $$
DECLARE
    scope    text[] := ARRAY(SELECT s FROM sh.scope(rep, ids) AS s ORDER BY 1);
    fail     boolean := sh.expect_fail(g, rep, ids);
    expected text[] := ARRAY(SELECT e FROM sh.expected_restamps(g, rep, scope) AS e ORDER BY 1);
    got      status_history.history[];
    got_text text[];
    mark     timestamptz;
BEGIN
    RAISE NOTICE 'sh-reconnect(%, %, %) expect_fail=%', g, rep, ids, fail;
    SELECT coalesce(array_agg(r), '{}') INTO got FROM status_history.reconnect(g, rep, ids) AS r;
    mark := status_history.monotonic_now();
    IF fail THEN
        RAISE EXCEPTION 'reconnect(%, %, %) succeeded, but the shadow fences say it must fail with 55000', g, rep, ids
            USING ERRCODE = 'SHF01',
                  DETAIL = (SELECT string_agg(format('%s: fence %s', s, sh.fence_at(s, 'infinity')), ', ')
                              FROM unnest(scope) AS s)
                           || format('; floor %s', sh.floor_at(rep, 'infinity'));
    END IF;
    got_text := ARRAY(SELECT sh.row_text(r) FROM unnest(got) AS r ORDER BY 1);
    IF got_text IS DISTINCT FROM expected THEN
        RAISE EXCEPTION 'reconnect(%, %, %) re-stamped other rows than expected', g, rep, ids
            USING ERRCODE = 'SHF02',
                  DETAIL = format('returned, not expected: %s; expected, not returned: %s; returned: %s',
                                  ARRAY(SELECT unnest(got_text) EXCEPT ALL SELECT unnest(expected)),
                                  ARRAY(SELECT unnest(expected) EXCEPT ALL SELECT unnest(got_text)),
                                  got_text);
    END IF;
    INSERT INTO sh.fence_log SELECT s, NULL, g, mark FROM unnest(scope) AS s;
    IF ids IS NULL THEN
        INSERT INTO sh.fence_log VALUES (NULL, rep, g, mark);
    END IF;
    INSERT INTO sh.restamps SELECT r FROM unnest(got) AS r;
    RETURN QUERY SELECT * FROM unnest(got);
END $$;

-- A controller that gives up when superseded (the exception block is a subtransaction).
CREATE FUNCTION sh.try_reconnect(g bigint, rep text DEFAULT NULL, ids text[] DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(*) FROM sh.reconnect(g, rep, ids));
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    IF NOT sh.expect_fail(g, rep, ids) THEN
        RAISE EXCEPTION 'reconnect(%, %, %) failed with 55000, but the shadow fences (and floor) of its scope are all at or below %', g, rep, ids, g
            USING ERRCODE = 'SHF04';
    END IF;
    RETURN -1;
END $$;

-- ===========================================================================
-- The comparison: one line per difference; none when the state is right.
-- Stale flags and re-stamps are checked for rows stamped after `since`
-- (older rows were committed, and checked, before).
-- ===========================================================================
CREATE FUNCTION sh.diff(since timestamptz) RETURNS SETOF text LANGUAGE plpgsql STABLE AS $$
BEGIN
    -- status_history.objects against brute force over the history
    RETURN QUERY
    SELECT CASE
             WHEN o.object_id IS NULL THEN format('objects: no row for %s (expected %s)', e.object_id, e)
             WHEN e.object_id IS NULL THEN format('objects: row for unknown object %s: %s', o.object_id, o)
             ELSE format('objects[%s]: %s', o.object_id, concat_ws('; ',
                 CASE WHEN o.occurred_at IS DISTINCT FROM e.occurred_at THEN format('occurred_at %L, expected %L', o.occurred_at, e.occurred_at) END,
                 CASE WHEN o.status IS DISTINCT FROM e.status THEN format('status %L, expected %L', o.status, e.status) END,
                 CASE WHEN o.error IS DISTINCT FROM e.error THEN format('error %L, expected %L', o.error, e.error) END,
                 CASE WHEN o.details IS DISTINCT FROM e.details THEN format('details %L, expected %L', o.details, e.details) END,
                 CASE WHEN o.replica_id IS DISTINCT FROM e.replica_id THEN format('replica_id %L, expected %L', o.replica_id, e.replica_id) END,
                 CASE WHEN o.generation IS DISTINCT FROM e.generation THEN format('generation %L, expected %L', o.generation, e.generation) END,
                 CASE WHEN o.reported_at IS DISTINCT FROM e.reported_at THEN format('reported_at %L, expected %L', o.reported_at, e.reported_at) END,
                 CASE WHEN o.status_since IS DISTINCT FROM e.status_since THEN format('status_since %L, expected %L', o.status_since, e.status_since) END,
                 CASE WHEN o.fence IS DISTINCT FROM e.fence THEN format('fence %L, expected %L (shadow)', o.fence, e.fence) END))
           END
      FROM status_history.objects AS o
      FULL JOIN sh.expected AS e ON e.object_id = o.object_id
     -- (an object whose only reports were skipped after it was locked keeps
     -- an empty row: its first report created it)
     WHERE o.object_id IS NULL
        OR (e.object_id IS NULL AND (o.occurred_at IS NOT NULL OR o.status IS NOT NULL))
        OR (e.object_id IS NOT NULL AND (o.occurred_at, o.status, o.error, o.details, o.replica_id, o.generation,
            o.reported_at, o.status_since, o.fence)
           IS DISTINCT FROM
           (e.occurred_at, e.status, e.error, e.details, e.replica_id, e.generation,
            e.reported_at, e.status_since, e.fence))
    ;
    -- latest() against the same (the history's own columns: latest() has
    -- NULL in the column the harness adds)
    RETURN QUERY
    WITH l AS (SELECT occurred_at, object_id, status, error, details, replica_id, generation,
                      reported_at, stale
                 FROM status_history.latest(include_dropped => true)),
         c AS (SELECT occurred_at, object_id, status, error, details, replica_id, generation,
                      reported_at, stale
                 FROM sh.current_rows)
    SELECT 'latest(): returns ' || sh.fields_text(x.object_id, x.status, x.error, x.details,
                                                  x.replica_id, x.generation, x.reported_at)
           || ' at ' || x.occurred_at
      FROM (SELECT * FROM l EXCEPT ALL SELECT * FROM c) AS x
    UNION ALL
    SELECT 'latest(): lacks ' || sh.fields_text(x.object_id, x.status, x.error, x.details,
                                                x.replica_id, x.generation, x.reported_at)
           || ' at ' || x.occurred_at
      FROM (SELECT * FROM c EXCEPT ALL SELECT * FROM l) AS x;
    -- the stale flag of every new row, from the rules applied to the stored
    -- rows in stamp order (never from the stored flags): supplied (error
    -- 'forced'), below the fence and floors in force at its stamp, or after
    -- the object's first dropped report that is not stale itself.  A row a
    -- later trigger changed ('chg:...') may keep the stale verdict decided
    -- for it before the change: the extension refuses only the other way.
    RETURN QUERY
    WITH r AS MATERIALIZED (
        SELECT h.occurred_at, h.object_id, h.status, h.stale, sh.row_text(h) AS txt,
               h.error IS NOT DISTINCT FROM 'forced' OR (coalesce(h.error LIKE 'chg:%', false) AND h.stale) AS forced,
               sh.report_fence(h.object_id, h.replica_id, h.occurred_at) AS fence, h.generation
          FROM status_history.history AS h
         WHERE h.occurred_at > since OR h.status = 'dropped'
    ), d AS (
        SELECT r.object_id, min(r.occurred_at) AS dropped_at
          FROM r WHERE r.status = 'dropped' AND NOT r.forced AND r.generation >= r.fence
         GROUP BY r.object_id
    ), x AS (
        SELECT r.*, r.generation < r.fence AS fenced,
               coalesce(r.occurred_at > d.dropped_at, false) AS after_dropped
          FROM r LEFT JOIN d ON d.object_id = r.object_id
         WHERE r.occurred_at > since
    )
    SELECT format('history row %s at %s: stale = %s, expected %s (fence and floors in force %s, after dropped %s, supplied %s)',
                  x.txt, x.occurred_at, x.stale, x.forced OR x.fenced OR x.after_dropped,
                  x.fence, x.after_dropped, x.forced)
      FROM x
     WHERE x.stale IS DISTINCT FROM (x.forced OR x.fenced OR x.after_dropped)
    ;
    -- every row a reconnect() returned is in the history
    RETURN QUERY
    SELECT format('reconnect() returned %s at %s, which is not in the history', sh.row_text(s.r), (s.r).occurred_at)
      FROM sh.restamps AS s
     WHERE (s.r).occurred_at > since
       AND NOT EXISTS (SELECT FROM status_history.history AS h
                        WHERE h.occurred_at = (s.r).occurred_at AND (h.*)::text = (s.r)::text);
END $$;

-- ===========================================================================
-- Statement shapes that need functions, tables and triggers.
-- ===========================================================================
-- A reporter's "parse or NULL": an exception block, so a subtransaction per row.
CREATE FUNCTION sh.try_jsonb(t text) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN t::jsonb;
EXCEPTION WHEN others THEN
    RETURN NULL;
END $$;

-- A nested report inside a subtransaction that fails (invalid status) or is
-- made to fail after the report (fail), and is caught.
CREATE FUNCTION sh.try_report(o text, st text, fail boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    BEGIN
        PERFORM status_history.report(o, st, 'nested');
        IF fail THEN
            RAISE EXCEPTION 'chosen to fail after a nested report' USING ERRCODE = 'SHT01';
        END IF;
    EXCEPTION WHEN invalid_parameter_value OR sqlstate 'SHT01' THEN
        NULL;
    END;
    RETURN o;
END $$;

-- Fails the calling statement on the chosen row.
CREATE FUNCTION sh.fail_on(o text, fail boolean) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    IF fail THEN
        RAISE EXCEPTION 'chosen row % fails the statement', o USING ERRCODE = 'SHT01';
    END IF;
    RETURN o;
END $$;

-- A trusted PL running a query through SPI with a row limit.
CREATE FUNCTION sh.perl_insert(q text, n integer) RETURNS integer LANGUAGE plperl AS $$
    my $rv = spi_exec_query($_[0], $_[1]);
    return $rv->{processed};
$$;

-- Reports made by triggers on other tables: an AFTER ROW trigger (its
-- INSERTs run when the outer statement ends), a BEFORE ROW trigger calling
-- report(), and an AFTER STATEMENT trigger inserting its transition table.
CREATE TABLE sh.ev_after (object_id text, status text, replica_id text, generation bigint);
CREATE TABLE sh.ev_before (LIKE sh.ev_after);
CREATE TABLE sh.ev_stmt (LIKE sh.ev_after);
CREATE FUNCTION sh.ev_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_LEVEL = 'ROW' THEN
        INSERT INTO status_history.history (object_id, status, error, replica_id, generation)
        VALUES (NEW.object_id, NEW.status, 'via after trigger', NEW.replica_id, NEW.generation);
    ELSE
        INSERT INTO status_history.history (object_id, status, error, replica_id, generation)
        SELECT n.object_id, n.status, 'via statement trigger', n.replica_id, n.generation
          FROM new_rows AS n;
    END IF;
    RETURN NULL;
END $$;
CREATE FUNCTION sh.ev_report() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM status_history.report(NEW.object_id, NEW.status, 'via before trigger',
                                  replica_id => NEW.replica_id, generation => NEW.generation);
    RETURN NEW;
END $$;
CREATE TRIGGER ev_after AFTER INSERT ON sh.ev_after FOR EACH ROW EXECUTE FUNCTION sh.ev_insert();
CREATE TRIGGER ev_before BEFORE INSERT ON sh.ev_before FOR EACH ROW EXECUTE FUNCTION sh.ev_report();
CREATE TRIGGER ev_stmt AFTER INSERT ON sh.ev_stmt REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION sh.ev_insert();
SQL
}

# ---------------------------------------------------------------------------
# One psql session driven statement by statement (psql -f -, so COPY FROM
# STDIN reads its rows from the same stream).  After each statement psql
# echoes a tag and :SQLSTATE to stdout and the tag to stderr; the session
# waits for both.
# ---------------------------------------------------------------------------
package ShRandom::Session;

sub new
{
	my ($class, $node, $db) = @_;
	my $self = bless { in => '', out => '', err => '', n => 0 }, $class;
	$self->{timer} = IPC::Run::timeout(300);
	my @cmd = (
		$node->installed_command('psql'), '-X', '-A', '-t', '-q',
		'-v', 'ON_ERROR_STOP=0', '-v', 'VERBOSITY=verbose',
		'-d', $node->connstr($db), '-f', '-');
	$self->{h} = IPC::Run::start(\@cmd, '<', \$self->{in}, '>', \$self->{out},
		'2>', \$self->{err}, $self->{timer});
	return $self;
}

# Run one statement (or COPY with its rows and \.).  Returns { sqlstate, out,
# err }, or { dead => why } when psql or the server went away.
sub run
{
	my ($self, $sql) = @_;
	my $tag = '@@sh-done ' . ++$self->{n};
	$self->{out} = $self->{err} = '';
	$self->{in} .= "$sql\n\\echo '$tag' :SQLSTATE\n\\warn '$tag'\n";
	$self->{timer}->start(300);
	my $ok = eval {
		until ($self->{out} =~ /^\Q$tag\E \S*\n/m && $self->{err} =~ /^\Q$tag\E\n/m)
		{
			die "psql exited\n" unless $self->{h}->pumpable;
			$self->{h}->pump;
		}
		1;
	};
	if (!$ok)
	{
		my $why = $@ || 'unknown';
		$why =~ s/\s+$//;
		$self->{dead} = 1;
		return { dead => $why, out => $self->{out}, err => $self->{err} };
	}
	my ($out, $state) = $self->{out} =~ /^(.*?)^\Q$tag\E (\S*)\n/ms;
	my ($err) = $self->{err} =~ /^(.*?)^\Q$tag\E\n/ms;
	# psql leaves :SQLSTATE as it was (unset, at first, or the previous
	# statement's) when COPY FROM STDIN fails on a row: the error it printed
	# says what happened.
	$state = '00000' unless $state =~ /^[0-9A-Z]{5}$/;
	if ($err =~ /^(?:psql:\S+ )?(?:ERROR|FATAL|PANIC):  ([0-9A-Z]{5}): /m)
	{
		$state = $1;
	}
	return { sqlstate => $state, out => $out, err => $err };
}

sub quit
{
	my ($self) = @_;
	if ($self->{dead})
	{
		eval { $self->{h}->kill_kill; };
		return;
	}
	$self->{in} .= "\\q\n";
	eval { $self->{h}->finish; 1 } or eval { $self->{h}->kill_kill; };
	return;
}

# ---------------------------------------------------------------------------
# The oracle, run after every statement: the differences (one line each),
# and the newest stamp, which becomes the point after which stale flags are
# checked next time (older rows are committed and were checked already).
# ---------------------------------------------------------------------------
package ShRandom;

sub check
{
	my ($session, $since) = @_;
	my $r = $session->run(
		"SELECT d FROM sh.diff('$since') AS d UNION ALL "
		  . "SELECT '\@\@wm ' || coalesce(max(occurred_at)::text, '-infinity') FROM status_history.history;");
	return { dead => $r->{dead} } if $r->{dead};
	return { skipped => 1 } if $r->{sqlstate} eq '25P02';    # in an aborted transaction
	return { error => "the check itself failed ($r->{sqlstate}): $r->{err}" }
	  if $r->{sqlstate} ne '00000';
	my (@diffs, $wm);
	for my $line (split /\n/, $r->{out})
	{
		if ($line =~ /^\@\@wm (.*)$/) { $wm = $1; }
		else { push @diffs, $line; }
	}
	return { diffs => \@diffs, wm => $wm };
}

# Errors a random statement may end with: invalid or NULL values, a unique
# index, the append-only refusal, a row the test chose to fail, statements in
# an aborted transaction, any error inside PL/Perl (which reports it as
# 38000), and from reconnect() 55000 (checked below) and 25001 (refused in a
# transaction that already holds object locks from reports).
my %EXPECTED_SQLSTATE = map { $_ => 1 } qw(00000 22023 23502 22004 23505 0A000 SHT01 25P02 38000);

# undef when the statement's outcome is acceptable, else why not.
sub classify
{
	my ($r, $st) = @_;
	return "the session died (server crash?): $r->{dead}" if $r->{dead};
	my $state = $r->{sqlstate} // '';
	return "the reconnect() wrapper found a disagreement ($state)" if $state =~ /^SHF/;
	if ($state eq '55000')
	{
		# The wrapper announces each call with what the shadow expects; the
		# failing call is the last one announced before the error.
		my ($before) = split /^ERROR:/m, $r->{err};
		my @expect = $before =~ /sh-reconnect\(.*?\) expect_fail=([tf])/g;
		return '55000 from a statement without reconnect()' unless @expect;
		return 'reconnect() failed with 55000, but the shadow fences (and floor) of its scope are all at or below its generation'
		  if $expect[-1] eq 'f';
		return undef;
	}
	return undef if $EXPECTED_SQLSTATE{$state};
	# A report on an object made while a row of it is in flight, or a row
	# changed after the extension decided it, may be refused.
	return undef if $state eq '27000' && $st->{nests};
	return undef if $state eq '25001' && $r->{err} =~ /sh-reconnect\(/;
	return "unexpected error class " . ($state eq '' ? '(none)' : $state);
}

# ---------------------------------------------------------------------------
# The generator: random statements over a handful of objects, 3 replicas and
# generations 0..4, in and out of transactions.  Deterministic for a given
# srand() and the outcomes of the statements before.
# ---------------------------------------------------------------------------
package ShRandom::Gen;

my @STATUSES = qw(starting running paused stalled ceased);
my $HISTORY = 'status_history.history';
my @FULL = qw(object_id status error details replica_id generation reported_at);

sub chance { return rand() < $_[0]; }
sub pick { return $_[ int rand @_ ]; }
sub lit { return defined $_[0] ? "'" . ($_[0] =~ s/'/''/gr) . "'" : 'NULL'; }
sub clamp { my $g = shift; return $g < 0 ? 0 : $g > 4 ? 4 : $g; }

# len: statements in the epoch; unique_index: (object_id, reported_at)
# exists; skip: { shape name => 1 } for shapes not to generate;
# report_many: the build has status_history.report_many(); prefix: of the
# names of prepared transactions (unique in the cluster).
sub new
{
	my ($class, %o) = @_;
	return bless {
		skip => {},
		%o,
		slots => [ map { "o$_" } 1 .. 6 ],
		next_id => 7, G => 0,
		tx => 0, aborted => 0, savepoints => [], tx_left => 0,
		prepared => undef, names => 0, closing => 0,
	}, $class;
}

# ---- values ----
sub obj
{
	my ($s) = @_;
	return '' if chance(0.004);
	return pick(@{ $s->{slots} });
}

sub fresh_id { my ($s) = @_; return "o$s->{next_id}"; }

sub status
{
	return 'bogus' if chance(0.01);
	return 'dropped' if chance(0.035);
	return pick(@STATUSES);
}

sub gen
{
	my ($s) = @_;
	return -1 if chance(0.003);
	return clamp($s->{G} + pick(-2, -1, 0, 0, 0, 0, 1));
}

sub replica { return chance(0.25) ? undef : pick(qw(r1 r2 r3)); }
sub error { return chance(0.7) ? undef : 'e' . int(rand(50)); }

sub details
{
	return undef if chance(0.65);
	return pick('{"k": 1}', '{"hints": ["check the broker address"]}', '{"n": ' . int(rand(9)) . '}');
}

sub reported_at
{
	my ($s, $p) = @_;
	# With the unique index, a reconnect() re-stamping a report that has a
	# reported_at conflicts with it (23505): keep those few, except where
	# conflicts are the point (on_conflict).
	return chance($p // ($s->{unique_index} ? 0.12 : 0.25))
	  ? sprintf('2024-01-01 00:00:0%d+00', int rand($s->{unique_index} ? 3 : 6))
	  : undef;
}

# A dropped object's slot is often taken over by a new object.
sub rotate
{
	my ($s, $o) = @_;
	return unless chance(0.5);
	for my $slot (@{ $s->{slots} })
	{
		if ($slot eq $o) { $slot = 'o' . $s->{next_id}++; last; }
	}
	return;
}

sub row
{
	my ($s, %over) = @_;
	my %r = (
		o => $s->obj, st => status(), err => error(), det => details(),
		rep => replica(), gen => $s->gen, rat => $s->reported_at,
		stale => chance(0.03) ? 1 : 0, %over);
	$s->rotate($r{o}) if $r{st} eq 'dropped';
	return \%r;
}

# Column sets: min (object_id, status), full, or full + stale (a supplied
# stale = true carries error 'forced', which the oracle reads).
sub colset
{
	my ($s, $rows) = @_;
	return 'stale' if grep({ $_->{stale} } @$rows) && chance(0.7);
	return pick('min', 'full', 'full', 'full');
}

sub colnames
{
	my ($set) = @_;
	return '(object_id, status)' if $set eq 'min';
	return '(' . join(', ', @FULL, $set eq 'stale' ? 'stale' : ()) . ')';
}

sub tuple
{
	my ($r, $set) = @_;
	return '(' . lit($r->{o}) . ', ' . lit($r->{st}) . ')' if $set eq 'min';
	my $forced = $set eq 'stale' && $r->{stale};
	my @v = (lit($r->{o}), lit($r->{st}), lit($forced ? 'forced' : $r->{err}), lit($r->{det}),
		lit($r->{rep}), $r->{gen}, lit($r->{rat}));
	push @v, $r->{stale} ? 'true' : 'false' if $set eq 'stale';
	return '(' . join(', ', @v) . ')';
}

sub values_list
{
	my ($rows, $set) = @_;
	return 'VALUES ' . join(', ', map { tuple($_, $set) } @$rows);
}

# A typed VALUES row for a derived table.
sub typed
{
	my @v = @_;
	my @out;
	while (my ($val, $type) = splice(@v, 0, 2))
	{
		push @out, ($type eq 'bigint' || $type eq 'boolean') ? "${val}::$type" : lit($val) . "::$type";
	}
	return '(' . join(', ', @out) . ')';
}

sub rows { my ($s, $min, $max) = @_; return [ map { $s->row } 1 .. $min + int rand($max - $min + 1) ]; }

sub returning { return chance(0.2) ? ' RETURNING *' : ''; }

# ---- reconnect() arguments: generation, replica, list ----
sub rc_args
{
	my ($s, %o) = @_;
	my $g = chance(0.01) ? -1 : chance(0.005) ? 'NULL' : clamp($s->{G} + pick(-1, 0, 0, 1));
	my $rep = chance(0.5) ? 'NULL' : chance(0.01) ? "''" : lit(pick(qw(r1 r2 r3)));
	my $ids = 'NULL';
	if ($o{list} || chance(0.45))
	{
		my @ids = map { pick(@{ $s->{slots} }) } 1 .. 1 + int rand 3;
		push @ids, $s->fresh_id if chance(0.15);
		push @ids, undef if chance(0.01);
		push @ids, '' if chance(0.01);
		$ids = 'ARRAY[' . join(', ', map { lit($_) } @ids) . ']::text[]';
	}
	return "$g, $rep, $ids";
}

# ---- statement shapes ----
my %SHAPES = (
	insert_values => [ 14, \&insert_values ],
	insert_select => [ 8, \&insert_select ],
	copy => [ 6, \&copy ],
	cte => [ 8, \&cte ],
	trigger_table => [ 7, \&trigger_table ],
	try_jsonb => [ 5, \&try_jsonb ],
	try_report => [ 5, \&try_report ],
	fail_on_row => [ 4, \&fail_on_row ],
	on_conflict => [ 6, \&on_conflict ],
	plperl_limited => [ 5, \&plperl_limited ],
	report_in_insert => [ 5, \&report_in_insert ],
	report_select => [ 5, \&report_select ],
	reconnect => [ 6, \&reconnect ],
	reconnect_in_insert => [ 6, \&reconnect_in_insert ],
	try_reconnect => [ 2, \&try_reconnect ],
	do_block => [ 3, \&do_block ],
	cache_size => [ 2, \&cache_size ],
	refused_change => [ 1, \&refused_change ],
	report_many => [ 4, \&report_many ],    # only where the build has report_many()
	nested => [ 9, \&nested ],
	nested_rls => [ 3, \&nested_rls ],
	merge => [ 4, \&merge ],
);
my @SHAPE_NAMES = sort keys %SHAPES;
sub shape_names { return @SHAPE_NAMES; }

sub statement
{
	my ($s) = @_;
	my @names = grep { !$s->{skip}{$_} && ($_ ne 'report_many' || $s->{report_many}) } @SHAPE_NAMES;
	my $total = 0;
	$total += $SHAPES{$_}[0] for @names;
	my $x = rand($total);
	for my $name (@names)
	{
		$x -= $SHAPES{$name}[0];
		next if $x >= 0;
		my ($kind, $sql, %extra) = $SHAPES{$name}[1]->($s);
		return { kind => $kind // $name, sql => $sql, %extra };
	}
	die 'unreachable';
}

sub insert_values
{
	my ($s) = @_;
	my $rows = $s->rows(1, chance(0.5) ? 1 : 6);
	my $set = $s->colset($rows);
	return (@$rows > 1 ? 'insert_values_multi' : 'insert_values_single',
		"INSERT INTO $HISTORY " . colnames($set) . ' ' . values_list($rows, $set) . returning() . ';');
}

sub insert_select
{
	my ($s) = @_;
	my $k = 1 + int rand 4;
	my @v = map {
		typed($s->obj, 'text', status(), 'text', status(), 'text', error(), 'text', details(), 'jsonb',
			replica(), 'text', $s->gen, 'bigint')
	} 1 .. 1 + int rand 3;
	return (undef,
		"INSERT INTO $HISTORY (object_id, status, error, details, replica_id, generation)"
		  . " SELECT v.o, CASE WHEN i % 2 = 1 THEN v.s1 ELSE v.s2 END, v.e, v.d, v.r, v.g"
		  . ' FROM (VALUES ' . join(', ', @v) . ') AS v(o, s1, s2, e, d, r, g),'
		  . " generate_series(1, $k) AS i ORDER BY i, v.o" . returning() . ';');
}

sub copy
{
	my ($s) = @_;
	my $rows = $s->rows(1, 6);
	my $data = '';
	for my $r (@$rows)
	{
		$data .= join("\t", map { defined $_ ? $_ : '\N' }
			  @$r{qw(o st err det rep gen rat)}) . "\n";
	}
	return (undef, "COPY $HISTORY (" . join(', ', @FULL) . ") FROM STDIN;\n$data\\.");
}

sub cte
{
	my ($s) = @_;
	my $ins = sub {
		my $rows = $s->rows(1, 3);
		my $set = $s->colset($rows);
		return "INSERT INTO $HISTORY " . colnames($set) . ' ' . values_list($rows, $set);
	};
	my $v = int rand 5;
	if ($v == 0)
	{
		return ('cte_two_inserts',
			'WITH a AS (' . $ins->() . ' RETURNING object_id), b AS (' . $ins->()
			  . ' RETURNING object_id) SELECT count(*) FROM (SELECT * FROM a UNION ALL SELECT * FROM b) AS x;');
	}
	if ($v == 1)
	{
		return ('cte_insert_from_insert',
			'WITH a AS (' . $ins->() . " RETURNING object_id) INSERT INTO $HISTORY (object_id, status)"
			  . ' SELECT a.object_id, ' . lit(status()) . ' FROM a' . returning() . ';');
	}
	if ($v == 2)
	{
		return ('cte_unread_insert', 'WITH a AS (' . $ins->() . ') ' . $ins->() . returning() . ';');
	}
	if ($v == 3)
	{
		return ('cte_reconnect_and_insert',
			'WITH r AS (SELECT * FROM sh.reconnect(' . $s->rc_args . ')), a AS (' . $ins->()
			  . ' RETURNING 1) SELECT (SELECT count(*) FROM a), (SELECT count(*) FROM r);');
	}
	return ('cte_insert_into_trigger_table',
		'WITH h AS (' . $ins->() . ' RETURNING object_id) INSERT INTO sh.'
		  . pick(qw(ev_after ev_before ev_stmt)) . ' (object_id, status, replica_id, generation)'
		  . ' SELECT h.object_id, ' . lit(status()) . ', ' . lit(replica()) . ', ' . $s->gen . ' FROM h;');
}

sub trigger_table
{
	my ($s) = @_;
	my $t = pick(qw(ev_after ev_before ev_stmt));
	my @v = map { '(' . join(', ', lit($s->obj), lit(status()), lit(replica()), $s->gen) . ')' } 1 .. 1 + int rand 4;
	return ("trigger_$t",
		"INSERT INTO sh.$t (object_id, status, replica_id, generation) VALUES " . join(', ', @v) . ';');
}

sub try_jsonb
{
	my ($s) = @_;
	my @v = map {
		typed($s->obj, 'text', status(), 'text', chance(0.35) ? 'not json' : '{"ok": ' . int(rand 9) . '}', 'text',
			replica(), 'text', $s->gen, 'bigint')
	} 1 .. 2 + int rand 4;
	return (undef,
		"INSERT INTO $HISTORY (object_id, status, details, replica_id, generation)"
		  . ' SELECT v.o, v.s, sh.try_jsonb(v.d), v.r, v.g FROM (VALUES ' . join(', ', @v)
		  . ') AS v(o, s, d, r, g);');
}

sub try_report
{
	my ($s) = @_;
	my @v = map {
		typed($s->obj, 'text', status(), 'text', chance(0.35) ? 'bogus' : status(), 'text',
			chance(0.3) ? 'true' : 'false', 'boolean', $s->gen, 'bigint')
	} 1 .. 1 + int rand 4;
	my $from = ' FROM (VALUES ' . join(', ', @v) . ') AS v(o, s, s2, f, g)';
	return ('try_report_in_insert',
		"INSERT INTO $HISTORY (object_id, status, generation) SELECT sh.try_report(v.o, v.s2, v.f), v.s, v.g$from;")
	  if chance(0.7);
	return ('try_report_select', "SELECT sh.try_report(v.o, v.s2, v.f)$from;");
}

sub fail_on_row
{
	my ($s) = @_;
	my $n = 2 + int rand 4;
	my $bad = chance(0.6) ? int rand $n : -1;
	my @v = map {
		typed($s->obj, 'text', status(), 'text', $_ == $bad ? 'true' : 'false', 'boolean', $s->gen, 'bigint')
	} 0 .. $n - 1;
	return (undef,
		"INSERT INTO $HISTORY (object_id, status, generation) SELECT sh.fail_on(v.o, v.f), v.s, v.g"
		  . ' FROM (VALUES ' . join(', ', @v) . ') AS v(o, s, f, g);');
}

# Few objects and few reported_at values, so the unique index (when the
# epoch has one) skips rows, also within one statement.
sub on_conflict
{
	my ($s) = @_;
	my @two = (pick(@{ $s->{slots} }), pick(@{ $s->{slots} }));
	my $rows = [ map { $s->row(o => pick(@two), rat => $s->reported_at(0.85), stale => 0) } 1 .. 1 + int rand 4 ];
	my $target =
	    $s->{unique_index} && chance(0.5) ? ' ON CONFLICT (object_id, reported_at) DO NOTHING'
	  : chance(0.15) ? ' ON CONFLICT (occurred_at) DO NOTHING'
	  : ' ON CONFLICT DO NOTHING';
	return (undef, "INSERT INTO $HISTORY " . colnames('full') . ' ' . values_list($rows, 'full') . $target . returning() . ';');
}

# INSERT ... RETURNING through SPI with a row limit (0: none).
sub plperl_limited
{
	my ($s) = @_;
	my $rows = $s->rows(2, 4);
	my $set = $s->colset($rows);
	my $n = pick(0, 1, 1, 2);
	my $q = "INSERT INTO $HISTORY " . colnames($set) . ' ' . values_list($rows, $set) . ' RETURNING *';
	return ("plperl_limit_$n", "SELECT sh.perl_insert(\$q\$$q\$q\$, $n);");
}

sub report_in_insert
{
	my ($s) = @_;
	if (chance(0.3))
	{
		my @v = map {
			'((status_history.report(' . lit($s->obj) . ', ' . lit(status()) . ', generation => ' . $s->gen . ')).object_id, ' . lit(status()) . ')'
		} 1 .. 1 + int rand 3;
		return ('report_in_insert_values', "INSERT INTO $HISTORY (object_id, status) VALUES " . join(', ', @v) . ';');
	}
	my @v = map {
		typed($s->obj, 'text', status(), 'text', status(), 'text', replica(), 'text', $s->gen, 'bigint')
	} 1 .. 1 + int rand 3;
	return ('report_in_insert_select',
		"INSERT INTO $HISTORY (object_id, status, replica_id, generation)"
		  . ' SELECT (status_history.report(v.o, v.s1, replica_id => v.r, generation => v.g)).object_id, v.s2, v.r, v.g'
		  . ' FROM (VALUES ' . join(', ', @v) . ') AS v(o, s1, s2, r, g);');
}

sub report_select
{
	my ($s) = @_;
	my @v = map {
		typed($s->obj, 'text', status(), 'text', error(), 'text', details(), 'jsonb', replica(), 'text',
			$s->gen, 'bigint', $s->reported_at, 'timestamptz')
	} 1 .. 1 + int rand 3;
	return (undef,
		'SELECT (status_history.report(v.o, v.s, v.e, v.d, v.r, v.g, v.t)).stale FROM (VALUES '
		  . join(', ', @v) . ') AS v(o, s, e, d, r, g, t);');
}

sub reconnect
{
	my ($s) = @_;
	return (undef, 'SELECT count(*) FROM sh.reconnect(' . $s->rc_args . ');');
}

sub try_reconnect
{
	my ($s) = @_;
	return (undef, 'SELECT sh.try_reconnect(' . $s->rc_args . ');');
}

sub reconnect_in_insert
{
	my ($s) = @_;
	my $v = int rand 5;
	my $one = sub { return 'SELECT ' . join(', ', lit($s->obj), lit(status()), $s->gen); };
	my $rc = 'SELECT r.object_id, ' . lit(status()) . ', ' . $s->gen . ' FROM sh.reconnect(' . $s->rc_args . ') AS r';
	my $into = "INSERT INTO $HISTORY (object_id, status, generation) ";
	return ('reconnect_after_rows_in_insert', $into . $one->() . ' UNION ALL ' . $rc . ';') if $v == 0;
	return ('reconnect_before_rows_in_insert', $into . $rc . ' UNION ALL ' . $one->() . ';') if $v == 1;
	my @v = map { typed($s->obj, 'text', status(), 'text', $s->gen, 'bigint') } 1 .. 1 + int rand 4;
	my $values = '(VALUES ' . join(', ', @v) . ') AS v(o, s, g)';
	return ('reconnect_subquery_in_insert',
		$into . "SELECT v.o, v.s, v.g FROM $values WHERE (SELECT count(*) FROM sh.reconnect(" . $s->rc_args . ')) >= 0;')
	  if $v == 2;
	return ('reconnect_per_row_in_insert',
		$into . "SELECT v.o, v.s, v.g FROM $values CROSS JOIN LATERAL"
		  . ' (SELECT count(*) FROM sh.reconnect(' . clamp($s->{G} + pick(-1, 0, 0, 1)) . ', NULL, ARRAY[v.o])) AS r;')
	  if $v == 3;
	return ('reconnect_cte_into_insert',
		'WITH r AS (SELECT * FROM sh.reconnect(' . $s->rc_args . ")) $into"
		  . 'SELECT r.object_id, ' . lit(status()) . ', ' . $s->gen . ' FROM r;');
}

# Several statements in one, with a block that fails and is caught.
sub do_block
{
	my ($s) = @_;
	my $ins = sub {
		my $rows = $s->rows(1, 3);
		return "INSERT INTO $HISTORY " . colnames('full') . ' ' . values_list($rows, 'full') . ';';
	};
	my $inner = join("\n        ", map { chance(0.2) ? 'PERFORM sh.reconnect(' . $s->rc_args . ');' : $ins->() } 1 .. 1 + int rand 2);
	my $fail = chance(0.6) ? "RAISE EXCEPTION 'chosen to fail' USING ERRCODE = 'SHT01';" : 'NULL;';
	return (undef, "DO \$do\$\nBEGIN\n    PERFORM status_history.report(" . lit($s->obj) . ', ' . lit(status())
		  . ', generation => ' . $s->gen . ");\n    " . $ins->() . "\n    BEGIN\n        $inner\n        $fail\n"
		  . "    EXCEPTION WHEN sqlstate 'SHT01' OR invalid_parameter_value THEN\n        NULL;\n    END;\n    "
		  . $ins->() . "\nEND\n\$do\$;");
}

# A batch through report_many(), alone or feeding an INSERT.
sub report_many
{
	my ($s) = @_;
	my $rows = $s->rows(1, 5);
	my $arr = sub {
		my ($key, $type) = @_;
		return 'ARRAY[' . join(', ', map { $type eq 'bigint' ? $_->{$key} : lit($_->{$key}) } @$rows) . "]::${type}[]";
	};
	my $call = 'status_history.report_many(' . join(', ',
		$arr->('o', 'text'), $arr->('st', 'text'), $arr->('err', 'text'), $arr->('det', 'jsonb'),
		$arr->('rep', 'text'), $arr->('gen', 'bigint'), $arr->('rat', 'timestamptz')) . ')';
	return ('report_many_in_insert',
		"INSERT INTO $HISTORY (object_id, status) SELECT r.object_id, " . lit(status()) . " FROM $call AS r;")
	  if chance(0.3);
	return ('report_many', "SELECT count(*) FROM $call;");
}

# ---- reports made while a row is in flight (the harness's sh.nested_report) ----
# An error that tells the nesting machinery what to do with the row: report
# on other objects (or its own) from a constraint, policy, generated column
# or trigger, possibly 40 levels deep; or change or skip the row after the
# extension decided it.
sub nest_marker
{
	my ($s, $own, $rls) = @_;
	my $x = rand;
	return undef if $x < 0.3;
	if ($x < 0.42)
	{
		return pick('chg:gen:' . clamp($s->{G} + pick(-2, -1, 0, 1)), 'chg:rep:' . pick(qw(r1 r2 r3)), 'skip');
	}
	my $how = pick(qw(ck gen ab bt bt af as), $rls ? qw(pol pol) : ());
	my @objs = map { chance(0.12) ? $own : pick(@{ $s->{slots} }) } 1 .. 1 + int rand 3;
	my $depth = chance(0.06) ? 40 : 1 + int rand 3;
	my $st = chance(0.08) ? 'dropped' : pick(@STATUSES);
	return join(':', $how, join('/', @objs), $st, $depth);
}

sub nested_rows
{
	my ($s, $rls) = @_;
	return [ map {
		my $r = $s->row(stale => 0);
		$r->{err} = $s->nest_marker($r->{o}, $rls);
		$r;
	} 1 .. 1 + int rand 5 ];
}

sub nested_statement
{
	my ($s, $rows) = @_;
	my $v = int rand 3;
	return "INSERT INTO $HISTORY " . colnames('full') . ' ' . values_list($rows, 'full') if $v == 0;
	my $src = '(VALUES ' . join(', ', map {
		typed($_->{o}, 'text', $_->{st}, 'text', $_->{err}, 'text', $_->{rep}, 'text', $_->{gen}, 'bigint')
	} @$rows) . ') AS v(o, s, e, r, g)';
	return "INSERT INTO $HISTORY (object_id, status, error, replica_id, generation)"
	  . " SELECT v.o, v.s, v.e, v.r, v.g FROM $src" if $v == 1;
	return "MERGE INTO $HISTORY AS h USING $src ON false WHEN NOT MATCHED THEN"
	  . ' INSERT (object_id, status, error, replica_id, generation) VALUES (v.o, v.s, v.e, v.r, v.g)';
}

sub nested
{
	my ($s) = @_;
	my $q = $s->nested_statement($s->nested_rows(0));
	my ($kind) = $q =~ /^(INSERT|MERGE)/;
	return ('nested_' . lc($kind), "SELECT sh.nesting(\$q\$$q\$q\$);", nests => 1);
}

# The same as a role row security applies to (its WITH CHECK policy reports too).
sub nested_rls
{
	my ($s) = @_;
	my $rows = $s->nested_rows(1);
	my $q = "INSERT INTO $HISTORY " . colnames('full') . ' ' . values_list($rows, 'full');
	return (undef, "SELECT sh.as_rls(\$q\$$q\$q\$);", nests => 1);
}

# MERGE ... WHEN NOT MATCHED THEN INSERT, without nesting.
sub merge
{
	my ($s) = @_;
	my $rows = $s->rows(1, 4);
	my $src = '(VALUES ' . join(', ', map {
		typed($_->{o}, 'text', $_->{st}, 'text', $_->{err}, 'text', $_->{rep}, 'text', $_->{gen}, 'bigint')
	} @$rows) . ') AS v(o, s, e, r, g)';
	return (undef, "MERGE INTO $HISTORY AS h USING $src ON h.occurred_at = '-infinity'"
		  . ' WHEN NOT MATCHED THEN INSERT (object_id, status, error, replica_id, generation)'
		  . ' VALUES (v.o, v.s, v.e, v.r, v.g);');
}

sub cache_size
{
	return (undef, chance(0.4)
		? 'SET status_history.cache_max_objects = ' . pick(1, 2, 3) . ';'
		: 'RESET status_history.cache_max_objects;');
}

sub refused_change
{
	return (undef, pick("UPDATE $HISTORY SET status = 'running' WHERE object_id = 'o1';",
			"DELETE FROM $HISTORY WHERE object_id = 'o2';"));
}

# ---- transactions ----
# The next statement to run; transaction control depends on the outcomes
# reported through result().  other => 1: run it in the second session
# (never inside a transaction of the first).
sub next_statement
{
	my ($s) = @_;
	if (defined $s->{prepared})
	{
		my $gid = $s->{prepared};
		my $other = chance(0.5);    # finished by another session, or by this one
		return { kind => 'commit_prepared', sql => "COMMIT PREPARED '$gid';", ctl => 'end_prepared', other => $other }
		  if chance(0.7);
		return { kind => 'rollback_prepared', sql => "ROLLBACK PREPARED '$gid';", ctl => 'end_prepared', other => $other };
	}
	if ($s->{tx})
	{
		my @sp = @{ $s->{savepoints} };
		if ($s->{aborted})
		{
			if (@sp && !$s->{closing} && chance(0.7))
			{
				my $sp = pick(@sp);
				return { kind => 'rollback_to_savepoint', sql => "ROLLBACK TO SAVEPOINT $sp;", ctl => 'rollback_to', sp => $sp };
			}
			return { kind => 'commit_aborted', sql => 'COMMIT;', ctl => 'end' } if chance(0.3);
			return { kind => 'rollback', sql => 'ROLLBACK;', ctl => 'end' };
		}
		if ($s->{closing} || $s->{tx_left}-- <= 0)
		{
			my $x = rand;
			return { kind => 'commit', sql => 'COMMIT;', ctl => 'end' } if $x < 0.5;
			return { kind => 'rollback', sql => 'ROLLBACK;', ctl => 'end' } if $x < 0.7;
			my $gid = ($s->{prefix} // 'sh_') . 'p' . ++$s->{names};
			return { kind => 'prepare_transaction', sql => "PREPARE TRANSACTION '$gid';", ctl => 'prepare', gid => $gid };
		}
		my $x = rand;
		if ($x < 0.12)
		{
			my $sp = 's' . ++$s->{names};
			return { kind => 'savepoint', sql => "SAVEPOINT $sp;", ctl => 'savepoint', sp => $sp };
		}
		if ($x < 0.17 && @sp)
		{
			my $sp = pick(@sp);
			return { kind => 'release_savepoint', sql => "RELEASE SAVEPOINT $sp;", ctl => 'release', sp => $sp };
		}
		if ($x < 0.25 && @sp)
		{
			my $sp = pick(@sp);
			return { kind => 'rollback_to_savepoint', sql => "ROLLBACK TO SAVEPOINT $sp;", ctl => 'rollback_to', sp => $sp };
		}
		return $s->statement;
	}
	return undef if $s->{closing};
	$s->{G}++ if $s->{G} < 4 && chance(5 / $s->{len});
	if (chance(0.15))
	{
		$s->{tx_left} = 1 + int rand 8;
		return { kind => 'begin', sql => 'BEGIN;', ctl => 'begin' };
	}
	# Now and then a statement from another session (its own backend: its
	# own caches and kept plans), while this one holds no locks.
	my $st = $s->statement;
	$st->{other} = 1 if chance(0.1);
	return $st;
}

sub result
{
	my ($s, $st, $sqlstate) = @_;
	my $ok = ($sqlstate // '') eq '00000';
	my $ctl = $st->{ctl} // '';
	my $upto = sub {
		my ($keep) = @_;
		my @sp = @{ $s->{savepoints} };
		my ($i) = grep { $sp[$_] eq $st->{sp} } 0 .. $#sp;
		$s->{savepoints} = [ @sp[ 0 .. $i - ($keep ? 0 : 1) ] ] if defined $i;
	};
	if ($ctl eq 'begin') { @$s{qw(tx aborted savepoints)} = ($ok ? 1 : 0, 0, []); }
	elsif ($ctl eq 'end') { $s->{tx} = 0; }
	elsif ($ctl eq 'prepare') { $s->{tx} = 0; $s->{prepared} = $st->{gid} if $ok; }
	elsif ($ctl eq 'end_prepared') { $s->{prepared} = undef; }
	elsif (!$ok) { $s->{aborted} = 1 if $s->{tx}; }
	elsif ($ctl eq 'savepoint') { push @{ $s->{savepoints} }, $st->{sp}; }
	elsif ($ctl eq 'release') { $upto->(0); }
	elsif ($ctl eq 'rollback_to') { $upto->(1); $s->{aborted} = 0; }
	return;
}

sub in_transaction { my ($s) = @_; return $s->{tx} || defined $s->{prepared}; }

1;
