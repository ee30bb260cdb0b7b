# The upgrade chain, as an operator runs it.  For every older version whose
# frozen install script is installed (sql/status_history--<old>.sql, found by
# wildcard, so the chain is checked from the oldest shipped version), on a
# server running that version's own build (its library and scripts, built
# from the commit CHANGELOG.md says it was released at, in a private copy of
# the PostgreSQL installation made by test/releases.sh; test/tap.sh passes
# their list in SH_RELEASES): create it in a database, fill it with a
# workload; then stop that server, serve the same data directory with the
# current build (the installation on PATH, where test/run.sh installed the
# working tree), ALTER EXTENSION status_history UPDATE, and check
#   (a) the catalog equals a fresh install of the current version: pg_dump
#       --schema-only --binary-upgrade of both databases, normalized (OIDs,
#       xids, sequence values), prints a diff when it differs;
#   (b) the history (every column the old version had) and the per-object
#       state (objects, latest(), statuses) are identical to what the old
#       build left, and the clock's persisted bound has not gone back;
#   (b2) the state the upgrade leaves (every column of the current version,
#       but those in %not_from_history below) equals what the current version
#       builds from the same history, imported into a fresh install: new
#       per-object state must be back-filled from the history;
#   (c) after the upgrade a report works, is stamped above every row and is
#       current, the fences still hold, and reconnect() works.
# And (d), an old library in an open session: on a server running the old
# build, a session that has loaded the old library stays open while the
# current library and scripts are installed over that same installation (as
# "make install" does while the server runs) and another session runs ALTER
# EXTENSION ... UPDATE; then the open session reports, reconnects and reads.
# Either those statements fail, or the state is right: the history, objects
# and replica_state equal what the current version builds from the same
# history, and what it read equals what the current version reads from it.
# Never a silent wrong state.
# And (e), the privileges, for every released version: a second database on
# the old server gets that version's own least-privilege recipe (the SQL of
# the "Roles" section of the README.md of its release commit, which
# test/releases.sh saves; 0.1.0's README had no such section, only the grants
# of its "Getting started") and then the same workload; after the upgrade
#   (e1) every relation and function of the schema, and the schema, belong to
#        the extension's owner (the recipes of 0.2.0 and 0.3.0 made the admin
#        role the history's owner);
#   (e2) status_history.roles records what the recipe did: the history's old
#        owner as the admin, public_reads false when the recipe revoked
#        PUBLIC's reading;
#   (e3) the upgrade grants no role anything, and tells the operator to run
#        grant_roles() (this database takes the path one step at a time,
#        ALTER EXTENSION ... UPDATE TO each version of it):
#        - the step into the current version never widens what PUBLIC may
#          do (has_*_privilege for PUBLIC on every relation, function and the
#          schema): no more than before that step, on the objects that
#          existed, and what it may in a fresh install after grant_roles(...,
#          public_reads => the value roles records); and PUBLIC keeps what it
#          could (earlier, shipped steps are shown, not checked: 0.2.0 ->
#          0.3.0 gives PUBLIC the reading of what it creates);
#        - no role of the recipe lost what its part gives it, but the
#          history's old owner (recorded as the admin) on the history, which
#          went back to the extension's owner with the privileges it had as
#          its owner;
#        - from a version before 0.4.0 the upgrade prints a WARNING to run
#          status_history.grant_roles() with all four roles, naming the
#          recorded admin, and a HINT with the call (a WARNING: ALTER
#          EXTENSION runs its scripts with client_min_messages at least
#          WARNING, a NOTICE is never shown);
#   (e4) after grant_roles() with the four roles and public_reads => false,
#        the privileges on every object of the schema (relacl, attacl,
#        proacl, nspacl, expanded with aclexplode: grantee, privileges,
#        grantor) and the catalog (as in (a), pg_init_privs included) equal a
#        fresh install's after the same call, and the admin reads the history
#        and imports (as that role); the same privileges for the database
#        upgraded without a recipe;
#   (e5) a pg_dump of it restored into a new database (pg_restore) has the
#        same privileges again (pg_dump writes the GRANTs relative to
#        pg_init_privs; the restored status_history.roles re-applies them).
# And (f), what a history owner attached: when that version's recipe made a
# role the history's owner (0.2.0, 0.3.0), a third database where that role,
# as itself, then attaches code of its own (a BEFORE INSERT trigger, a CHECK
# NOT VALID, a policy and row-level security, a column default, a rule, each
# calling its function, and a column of a domain whose CHECK calls it),
# makes history_refuse_change fire on replicas only, grants TRIGGER,
# TRUNCATE and REFERENCES to another role, adds statistics, a foreign key to
# the history and a table inheriting from it; the superuser adds an index on
# an expression calling its function (the role may not: CREATE INDEX needs
# CREATE on the schema).  A superuser's insert shows they run as that
# superuser.  After it the upgrade refuses (42501), its DETAIL naming each of
# them and nothing else, runs none of them, and changes nothing (the version,
# the history's owner, the catalog); removed one at a time, it refuses while
# any remains, naming what remains, and succeeds once all are gone; then
# grant_roles() with the four roles gives the privileges and the catalog of a
# fresh install.
# And (g), for every released version, a fourth database where a role that is
# not a superuser created the schema status_history before CREATE EXTENSION
# (which then installs into it) and put a function of its own there: the
# upgrade refuses (42501) while the schema is that role's ("not the
# extension's alone", its owner is not a superuser), while CREATE on it is
# granted to that role, and while it holds that function ("holds objects
# that are not the extension's"); without them it succeeds.
# The four roles are cluster-wide: each server creates them once and drops
# them at the end (DROP OWNED BY in every database, then DROP ROLE).
# Run alone: test/tap.sh test/t/005_upgrade.pl
use strict;
use warnings;
use File::Basename qw(dirname);
use File::Copy qw(copy);
use File::Path qw(rmtree);
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Columns (b2) and (d) leave out, per relation: state that is not a function
# of the history.  The fence is raised by reconnect() (also for objects that
# never reported), not by reports.  A key's last_seen_at moves when the key
# repeats its newest row, which appends no row (since 0.3.0); (b2) leaves it
# out only where the old version kept it ((b) checks it is unchanged), an
# upgrade from a version without replica_state back-fills it from the history.
my %not_from_history = (history => [], objects => ['fence'], replica_state => ['last_seen_at']);

# (d) is a TODO check until the library and the SQL of one version refuse to
# work with another's (0.4.0, in progress).  Today: 0.1.0's library lacks a C
# function the new SQL names (an error: passes), 0.2.0's library goes on
# reporting without maintaining replica_state (a silent wrong state: fails),
# 0.3.0's SQL is 0.4.0's (passes).  Set it to undef when (d) passes.
my $open_session_todo = undef;    # (0.4.0: the library refuses the SQL of another version)

# ---------------------------------------------------------------------------
# The installations: the current build, and one per released version.
# ---------------------------------------------------------------------------
my $pg_bindir = '';
IPC::Run::run([ 'pg_config', '--bindir' ], '>', \$pg_bindir) or die 'pg_config --bindir failed';
chomp $pg_bindir;
my $current_inst = dirname($pg_bindir);

# SH_RELEASES: test/releases.sh's directory; its file "releases" has a line
# "<version> <commit> <installation>" per version that built.
my %release;
my $releases = $ENV{SH_RELEASES} // '';
if (!ok($releases ne '' && -f "$releases/releases",
		'SH_RELEASES names the builds of the released versions (test/tap.sh makes them with test/releases.sh)'))
{
	done_testing();
	exit;
}
for my $line (split /\n/, slurp_file("$releases/releases"))
{
	my ($v, $commit, $inst) = split / /, $line;
	$release{$v} = { commit => $commit, inst => $inst };
}
note("released builds: " . join(', ', map { "$_ at $release{$_}{commit}" } sort keys %release));

# The reference: the current build, holding the fresh install and every
# database rebuilt from a history.
my $ref = PostgreSQL::Test::Cluster->new('current', install_path => $current_inst);
$ref->init;
$ref->start;

sub q1 { my ($node, $db, $sql) = @_; return $node->safe_psql($db, $sql); }

# The same, but a failing query is a failing check rather than the end of the
# test: its result reads "failed: <error>".
sub q2
{
	my ($node, $db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql, on_error_stop => 1);
	return $rc == 0 ? $out : "failed: $err";
}

# The directory a node's server takes $libdir from (it follows the server's
# binary): which installation serves it.
sub served_from
{
	my ($node) = @_;
	return q1($node, 'postgres', q{SELECT setting FROM pg_catalog.pg_config WHERE name = 'PKGLIBDIR'});
}

# Stop a node, and start its data directory with the server of another
# installation.  (PostgreSQL::Test::Cluster keeps a node's installation in
# _install_path, which only new() sets; every command it runs for the node
# is taken from there.)
sub serve_with
{
	my ($node, $inst) = @_;
	$node->stop;
	$node->{_install_path} = $inst;
	$node->start;
}

# ---------------------------------------------------------------------------
# The shipped versions, from the installed scripts of the current build.
# ---------------------------------------------------------------------------
my $extdir = q1($ref, 'postgres', q{SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR'}) . '/extension';
my $current_libdir = served_from($ref);
my $current = q1($ref, 'postgres',
	q{SELECT default_version FROM pg_catalog.pg_available_extensions WHERE name = 'status_history'});
ok($current ne '', "status_history is installed, default_version $current");

sub version_cmp
{
	my @a = split /[.]/, $_[0];
	my @b = split /[.]/, $_[1];
	while (@a || @b)
	{
		my ($x, $y) = (shift(@a) // -1, shift(@b) // -1);
		my $c = ($x =~ /^\d+$/ && $y =~ /^\d+$/) ? $x <=> $y : $x cmp $y;
		return $c if $c;
	}
	return 0;
}

my (%install, @upgrade);
for my $f (glob("$extdir/status_history--*.sql"))
{
	my $base = $f =~ s{.*/status_history--}{}r =~ s{\.sql$}{}r;
	if ($base =~ /^(.+)--(.+)$/) { push @upgrade, [ $1, $2 ]; }
	else { $install{$base} = 1; }
}
ok($install{$current}, "the install script of $current is installed");
my @old = sort { version_cmp($a, $b) } grep { version_cmp($_, $current) < 0 } keys %install;
ok(@old > 0, 'older versions with a frozen install script: ' . join(', ', @old));
my @newer = grep { version_cmp($_, $current) > 0 } keys %install;
note("ignored, newer than $current (left over from another installation?): @newer") if @newer;
note('upgrade scripts: ' . join(', ', map { "$_->[0]--$_->[1]" } @upgrade));

# A version an upgrade script starts from was shipped, so its install script
# must have been frozen (otherwise the chain is not checked from there).
for my $u (@upgrade)
{
	ok($install{ $u->[0] }, "upgrade script $u->[0]--$u->[1] starts from a version with a frozen install script");
}
for my $v (@old)
{
	my $path = q1($ref, 'postgres', qq{
		SELECT path FROM pg_catalog.pg_extension_update_paths('status_history')
		 WHERE source = '$v' AND target = '$current'});
	ok($path ne '', "an upgrade path leads from $v to $current: $path");
}
# Every released version is one the chain starts from.
for my $v (sort { version_cmp($a, $b) } keys %release)
{
	ok($install{$v} && version_cmp($v, $current) < 0,
		"released version $v (CHANGELOG.md) is older than $current and has a frozen install script");
}

# ---------------------------------------------------------------------------
# Helpers.
# ---------------------------------------------------------------------------

# ok() on two texts; when they differ, a unified diff (want -> got) is shown,
# and for rows (COPY text, first column a key) with their column names, how
# many rows differ in each column.
sub same_text
{
	my ($got, $want, $name, $want_label, $got_label, $colnames) = @_;
	# (Two queries that failed alike are no result.)
	if ($got =~ /^failed: / || $want =~ /^failed: /)
	{
		fail($name);
		diag("$want_label: $want") if $want =~ /^failed: /;
		diag("$got_label: $got")   if $got =~ /^failed: /;
		return 0;
	}
	if ($got eq $want)
	{
		pass($name);
		return 1;
	}
	fail($name);
	diag(text_diff($got, $want, $want_label, $got_label, $colnames));
	return 0;
}

# How two texts differ (as same_text shows it).
sub text_diff
{
	my ($got, $want, $want_label, $got_label, $colnames) = @_;
	my @summary;
	if (!defined $colnames)
	{
		# A pg_dump: which of its entries ("-- Name: ...; Type: ...") differ.
		my (%w, %g, @order, %seen);
		for my $side ([ $want, \%w ], [ $got, \%g ])
		{
			my @parts = split /^--\n-- (Name: .*)\n--\n/m, $side->[0];
			shift @parts;
			while (my ($k, $body) = splice(@parts, 0, 2))
			{
				$k .= ' (again)' while exists $side->[1]{$k};
				$side->[1]{$k} = $body;
				push @order, $k unless $seen{$k}++;
			}
		}
		for my $k (@order)
		{
			push @summary, "only in $want_label: $k" if !exists $g{$k};
			push @summary, "only in $got_label: $k"  if !exists $w{$k};
			push @summary, "differs: $k" if exists $g{$k} && exists $w{$k} && $g{$k} ne $w{$k};
		}
	}
	else
	{
		my @names = split /, /, $colnames;
		my %w = map { (split /\t/)[0] => $_ } split /\n/, $want;
		my %g = map { (split /\t/)[0] => $_ } split /\n/, $got;
		my (%differ, @only);
		for my $k (sort keys %{ { %w, %g } })
		{
			if (!defined $w{$k} || !defined $g{$k}) { push @only, $k; next; }
			my @a = split /\t/, $w{$k}, -1;
			my @b = split /\t/, $g{$k}, -1;
			for my $i (0 .. $#names) { $differ{ $names[$i] }++ if ($a[$i] // '') ne ($b[$i] // ''); }
		}
		push @summary, 'rows differ in: ' . join(', ', map { "$_ ($differ{$_} rows)" } grep { $differ{$_} } @names)
		  if %differ;
		push @summary, scalar(@only) . " keys are on one side only, e.g. $only[0]" if @only;
	}
	my $dir = PostgreSQL::Test::Utils::tempdir();
	PostgreSQL::Test::Utils::append_to_file("$dir/want", "$want\n");
	PostgreSQL::Test::Utils::append_to_file("$dir/got",  "$got\n");
	my $diff = '';
	IPC::Run::run([ 'diff', '-u', '--label', $want_label, '--label', $got_label, "$dir/want", "$dir/got" ],
		'>', \$diff);
	my @lines = split /\n/, $diff;
	$#lines = 199 if @lines > 200;
	return join("\n", @summary, @lines);
}

# The database's schema as pg_dump --binary-upgrade shows it: unlike a plain
# dump, it lists the members of extensions (with ALTER EXTENSION ... ADD),
# their comments, their privileges and initial privileges.  What differs
# between two equal catalogs is normalized: OIDs, xids, the extension's
# configuration tables by OID, sequence values (checked with the data),
# columns an upgrade dropped, and values of columns an upgrade added.
sub schema_dump
{
	my ($node, $db) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ $ref->installed_command('pg_dump'), '--schema-only', '--binary-upgrade', '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err)
	  or die "pg_dump $db failed: $err";
	my %relname = map { split /\|/ } split /\n/, q1($node, $db, q{
		SELECT c.oid, c.oid::regclass FROM pg_catalog.pg_class AS c
		 WHERE c.relnamespace = 'status_history'::regnamespace});
	$out =~ s/^\\(?:un)?restrict \S+\n//mg;
	$out =~ s/^-- Dumped (?:from|by) .*\n//mg;
	$out =~ s/^-- For binary upgrade, must preserve .*\n//mg;
	$out =~ s/^SELECT pg_catalog\.binary_upgrade_set_next_\w+\(.*\);\n//mg;
	$out =~ s/^-- For binary upgrade, set \w+'s relfrozenxid and relminmxid\nUPDATE pg_catalog\.pg_class\nSET relfrozenxid = .*\nWHERE oid = .*;\n//mg;
	$out =~ s/^-- set missing value\.\nSELECT pg_catalog\.binary_upgrade_set_missing_value\(.*\);\n//mg;
	$out =~ s/^-- For binary upgrade, recreate dropped column\.\nUPDATE pg_catalog\.pg_attribute\n.*\n.*\n.*\nALTER TABLE ONLY .* DROP COLUMN .*;\n//mg;
	$out =~ s/,\n\s*"\.+pg\.dropped\.\d+\.+" INTEGER \/\* dummy \*\///g;
	$out =~ s/^\s*"\.+pg\.dropped\.\d+\.+" INTEGER \/\* dummy \*\/,?\n//mg;
	$out =~ s/(binary_upgrade_create_empty_extension\('status_history', 'status_history', \w+, '[^']*', ')\{([\d,]*)\}/
		$1 . '{' . join(',', map { $relname{$_} \/\/ "oid $_" } split(m{,}, $2)) . '}'/e;
	$out =~ s/^(SELECT pg_catalog\.setval\('[^']*'), \d+, (?:true|false)\);$/$1, <value>);/mg;
	$out =~ s/\n{3,}/\n\n/g;
	return $out;
}

# The columns a relation of the extension has, as a select list ('' when
# the relation does not exist).
sub columns
{
	my ($node, $db, $rel, @except) = @_;
	my %skip = map { $_ => 1 } @except;
	my @cols = grep { !$skip{$_} } split /\n/, q1($node, $db, qq{
		SELECT quote_ident(attname) FROM pg_catalog.pg_attribute
		 WHERE attrelid = to_regclass('status_history.$rel') AND attnum > 0 AND NOT attisdropped
		 ORDER BY attnum});
	return join(', ', @cols);
}

# The data and state, as text, in the columns the old version had.
sub snapshot
{
	my ($node, $db, $cols) = @_;
	my %s;
	$s{history} = q2($node, $db,
		"COPY (SELECT $cols->{history} FROM status_history.history ORDER BY occurred_at) TO STDOUT");
	$s{objects} = q2($node, $db,
		"COPY (SELECT $cols->{objects} FROM status_history.objects ORDER BY object_id) TO STDOUT");
	$s{latest} = q2($node, $db,
		"COPY (SELECT $cols->{history} FROM status_history.latest(NULL, true) ORDER BY object_id) TO STDOUT");
	$s{statuses} = q2($node, $db,
		"COPY (SELECT $cols->{statuses} FROM status_history.statuses ORDER BY object_id) TO STDOUT");
	$s{replica_state} = q2($node, $db, "COPY (SELECT $cols->{replica_state} FROM status_history.replica_state"
		  . ' ORDER BY object_id, replica_id NULLS FIRST) TO STDOUT')
	  if $cols->{replica_state} ne '';
	return \%s;
}

# A fresh install of the current version on the reference server, with the
# history of $node's database $db imported (the columns $db's history has):
# what the current version builds from that history.  Returns the database's
# name, or undef (after a failed check) when the history does not import.
sub rebuild
{
	my ($node, $db, $rebuilt, $label) = @_;
	q1($ref, 'postgres', "CREATE DATABASE $rebuilt");
	q1($ref, $rebuilt, 'CREATE EXTENSION status_history');
	my $cols = columns($node, $db, 'history');
	my $copy = q2($node, $db, "COPY (SELECT $cols FROM status_history.history ORDER BY occurred_at) TO STDOUT");
	my $data = $copy eq '' ? '' : "$copy\n";
	# (Stamps imported hours ahead are in it: lift the import lead limit, as
	# the README says a restore of such a history needs.)
	return $rebuilt
	  if is(q2($ref, $rebuilt, "SET status_history.max_import_lead = -1;\n"
			  . "COPY status_history.history ($cols) FROM STDIN;\n$data\\.\n"), '',
		"$label: the history imports into a fresh $current");
	return undef;
}

# The queries that read the state a history determines, in the columns $db
# has (every column of history, objects and replica_state when it has one,
# but those in $leave_out, by relation): relation => [query, its columns].
sub state_queries
{
	my ($node, $db, $leave_out) = @_;
	my %q;
	my $hist = columns($node, $db, 'history', @{ $leave_out->{history} // [] });
	$q{history} = [ "COPY (SELECT $hist FROM status_history.history ORDER BY occurred_at) TO STDOUT", $hist ];
	my $obj = columns($node, $db, 'objects', @{ $leave_out->{objects} // [] });
	$q{objects} = [ "COPY (SELECT $obj FROM status_history.objects AS o"
		  . ' WHERE EXISTS (SELECT FROM status_history.history AS h WHERE h.object_id = o.object_id)'
		  . ' ORDER BY object_id) TO STDOUT', $obj ];
	my $key = columns($node, $db, 'replica_state', @{ $leave_out->{replica_state} // [] });
	$q{replica_state} = [ "COPY (SELECT $key FROM status_history.replica_state"
		  . ' ORDER BY object_id, replica_id NULLS FIRST) TO STDOUT', $key ]
	  if $key ne '';
	$q{latest} = [ "COPY (SELECT $hist FROM status_history.latest(NULL, true) ORDER BY object_id) TO STDOUT", $hist ];
	return \%q;
}

# Replace a file as "make install" (install(1)) does: a new file under the
# name, never a write into the old one (a running backend has the old library
# mapped).
sub install_file
{
	my ($from, $to) = @_;
	copy($from, "$to.new") or die "copy $from to $to.new: $!";
	chmod((stat $from)[2] & 07777, "$to.new");
	rename("$to.new", $to) or die "rename $to.new: $!";
}

# The status_history library a session has mapped, from its /proc/self/maps
# ("<file> (deleted)" once another file took its name).
sub mapped_library
{
	my ($session) = @_;
	my ($out) = $session->query(q{
		SELECT string_agg(DISTINCT substring(l FROM ' (/\S*/status_history\.so.*)$'), ', ')
		  FROM regexp_split_to_table(pg_catalog.pg_read_file('/proc/self/maps'), E'\n') AS l
		 WHERE l LIKE '%/status_history.so%'});
	return $out;
}

# The four roles of the README's recipe (cluster-wide: created once per
# server, dropped at its end).  Reporters, controllers: the grants an
# operator made survive the upgrade.
my @role_names = qw(sh_reporter sh_controller sh_reader sh_admin);
my $roles = join(' ', map { "CREATE ROLE $_ NOLOGIN;" } @role_names);
my $grants = q{
	GRANT INSERT ON status_history.history TO sh_reporter;
	GRANT EXECUTE ON FUNCTION status_history.reconnect(bigint, text, text[]) TO sh_controller;
};

# The workload, written against the oldest version's interface: reports on
# many objects from three replicas, one by one and in multi-row INSERTs,
# reconnects that raise fences (scoped by replica, by list, and all), late
# reports below the fence (stale), dropped objects and reports after the drop
# (stale), an object fenced that never reported, and stamps imported by the
# owner hours in the future and years in the past, one with stale supplied.
my $workload = q{
	SET ROLE sh_reporter;
	SELECT count(*) FROM generate_series(1, 300) AS i,
	  LATERAL status_history.report('obj-' || i,
	           (ARRAY['starting', 'running', 'paused', 'stalled'])[1 + i % 4],
	           error => CASE WHEN i % 4 = 3 THEN 'broker unreachable ' || i END,
	           details => CASE WHEN i % 5 = 0
	                      THEN jsonb_build_object('hints', jsonb_build_array('hint ' || i)) END,
	           replica_id => 'r' || (1 + i % 3), generation => 1,
	           reported_at => timestamptz '2024-01-01 00:00:00+00' + i * interval '1 second');
	INSERT INTO status_history.history (object_id, status, replica_id, generation, reported_at)
	SELECT 'obj-' || (1 + i % 300), (ARRAY['running', 'running', 'stalled', 'paused'])[1 + i % 4],
	       'r' || (1 + i % 3), 1, timestamptz '2024-01-02 00:00:00+00' + i * interval '1 second'
	  FROM generate_series(1, 900) AS i;
	RESET ROLE;

	SET ROLE sh_controller;
	SELECT count(*) FROM status_history.reconnect(2, 'r1');
	RESET ROLE;

	SET ROLE sh_reporter;
	-- r1's late reports at generation 1: stale where r1's reconnect fenced.
	SELECT count(*) FROM generate_series(1, 300, 7) AS i,
	  LATERAL status_history.report('obj-' || i, 'stalled', error => 'late', replica_id => 'r1', generation => 1);
	-- Dropped objects (an object-wide event), then reports after the drop.
	SELECT count(*) FROM generate_series(10, 300, 10) AS i,
	  LATERAL status_history.report('obj-' || i, 'dropped', generation => 2);
	SELECT count(*) FROM generate_series(20, 300, 20) AS i,
	  LATERAL status_history.report('obj-' || i, 'running', replica_id => 'r2', generation => 2);
	RESET ROLE;

	SET ROLE sh_controller;
	SELECT count(*) FROM status_history.reconnect(3);
	SELECT count(*) FROM status_history.reconnect(4, object_ids => ARRAY['obj-1', 'obj-2', 'never-reported']);
	RESET ROLE;

	SET ROLE sh_reporter;
	SELECT count(*) FROM generate_series(1, 60) AS i,
	  LATERAL status_history.report('obj-' || i, 'running', replica_id => 'r3', generation => 3);
	RESET ROLE;

	-- The owner imports rows: from a clock hours fast (past the import lead
	-- limit, lifted for it), from long ago, one stale.
	-- (0.1.0 has no such limit, nor the setting.)
	BEGIN;
	SELECT set_config(name, '-1', true) FROM pg_catalog.pg_settings WHERE name = 'status_history.max_import_lead';
	INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation, reported_at)
	VALUES (now() + interval '2 hours', 'obj-3', 'stalled', 'r-old', 5, now()),
	       (now() + interval '3 hours', 'imported-1', 'running', 'r-old', 0, NULL),
	       (timestamptz '2001-02-03 04:05:06.789+00', 'imported-2', 'paused', NULL, 0, NULL);
	INSERT INTO status_history.history (occurred_at, object_id, status, stale)
	VALUES (now() + interval '4 hours', 'obj-4', 'running', true);
	COMMIT;

	SET ROLE sh_reporter;
	SELECT count(*) FROM generate_series(100, 200) AS i,
	  LATERAL status_history.report('obj-' || i, 'running', replica_id => 'r2', generation => 4);
	RESET ROLE;
	SET ROLE sh_controller;
	SELECT count(*) FROM status_history.reconnect(5, 'r2');
	RESET ROLE;
};

# What the open session of (d) runs after the upgrade, one transaction each,
# in the oldest version's interface: reports from three replicas, the same
# again (repeats: heartbeats where the version deduplicates), a multi-row
# INSERT, a new object, a replica's reconnect and its late reports (stale),
# a drop.
my @open_session_statements = (
	q{SELECT count(*) FROM generate_series(1, 60) AS i,
	    LATERAL status_history.report('obj-' || i, (ARRAY['running', 'stalled', 'paused'])[1 + i % 3],
	             replica_id => 'r' || (1 + i % 3), generation => 6)},
	q{SELECT count(*) FROM generate_series(1, 60) AS i,
	    LATERAL status_history.report('obj-' || i, (ARRAY['running', 'stalled', 'paused'])[1 + i % 3],
	             replica_id => 'r' || (1 + i % 3), generation => 6)},
	q{INSERT INTO status_history.history (object_id, status, replica_id, generation)
	  SELECT 'obj-' || i, 'starting', 'r2', 6 FROM generate_series(40, 120) AS i},
	q{SELECT count(*) FROM status_history.report('after-upgrade', 'running', replica_id => 'r1', generation => 6)},
	q{SELECT count(*) FROM status_history.reconnect(7, 'r1')},
	q{SELECT count(*) FROM generate_series(1, 30) AS i,
	    LATERAL status_history.report('obj-' || i, 'stalled', error => 'late', replica_id => 'r1', generation => 6)},
	q{SELECT count(*) FROM status_history.report('obj-7', 'dropped', generation => 7)});

# A statement in a background session: (output, error or '').  A session
# that died (its backend crashed) answers with an error too.
sub in_session
{
	my ($session, $sql) = @_;
	my $out = eval { scalar $session->query($sql) };
	return ('', "the session ended: $@ $session->{stderr}") unless defined $out;
	my $err = $session->{stderr};
	$session->{stderr} = '';
	return ($out, $err =~ /\b(?:ERROR|FATAL|PANIC):/ ? $err : '');
}

# ---------------------------------------------------------------------------
# (e) Privileges.
# ---------------------------------------------------------------------------

# grant_roles() with the four roles, as the README's Roles section runs it.
sub grant_roles_sql
{
	my ($public_reads) = @_;
	return "SELECT status_history.grant_roles(reporter => 'sh_reporter', controller => 'sh_controller',"
	  . " reader => 'sh_reader', admin => 'sh_admin', public_reads => $public_reads)";
}

# The least-privilege recipe of a version's own README.md (test/releases.sh
# saves the release commit's): the SQL block of its "Roles" section, or,
# for a README without one (0.1.0), the lines of its SQL blocks that create
# roles (with the grants on them).  The roles are the test's (created once per
# server), so its CREATE ROLE statements are left out, and a role the README
# names without the sh_ prefix (0.1.0: reporter, controller) is the sh_ role
# of that part.  Returns the statements ('' when there are none).
sub readme_recipe
{
	my ($readme) = @_;
	my (@blocks, @cur, $in_sql);
	my $section = '';
	for my $l (split /\n/, $readme)
	{
		if ($in_sql)
		{
			if ($l =~ /^```\s*$/) { $in_sql = 0; push @blocks, [ $section, join("\n", @cur) ]; }
			else { push @cur, $l; }
		}
		elsif ($l =~ /^## (.*)/) { $section = $1; }
		elsif ($l =~ /^```sql\s*$/) { $in_sql = 1; @cur = (); }
	}
	my ($text) = map { $_->[1] } grep { $_->[0] =~ /^Roles\b/ } @blocks;
	$text //= join("\n", grep { /^\s*CREATE\s+ROLE\b/i } map { split /\n/, $_->[1] } @blocks);
	$text =~ s/--.*$//mg;
	my @statements = grep { /\S/ } map { s/^\s+|\s+$//gr } split /;/, $text;
	my %rename = map { /^CREATE\s+ROLE\s+(reporter|controller|reader|admin)\b/i ? ($1 => "sh_$1") : () } @statements;
	my @out;
	for my $st (grep { !/^CREATE\s+ROLE\b/i } @statements)
	{
		$st =~ s/(\b(?:TO|FROM)\s+)(\w+(?:\s*,\s*\w+)*)$/$1 . join(', ', map { $rename{$_} \/\/ $_ } split(m{\s*,\s*}, $2))/e;
		push @out, "$st;";
	}
	return join("\n", @out);
}

# What status_history.roles should record after an upgrade of a database the
# recipe was applied to, as "reporter|controller|reader|admin|public_reads":
# the roles a grant_roles() call of the recipe names, or (before 0.4.0) the
# role the recipe made the history's owner as the admin, and PUBLIC reading
# unless the recipe revoked a read from it.
sub recipe_expects
{
	my ($recipe) = @_;
	my %e = (public_reads => 't');
	if ($recipe =~ /\bgrant_roles\s*\(([^;]*)\)\s*;/i)
	{
		my $args = $1;
		$e{ lc $1 } = $2 while $args =~ /(\w+)\s*=>\s*'?(\w+)'?/g;
		$e{public_reads} = ($e{public_reads} // 'false') eq 'true' ? 't' : 'f';
	}
	$e{admin} = $1 if $recipe =~ /ALTER\s+TABLE\s+status_history\.history\s+OWNER\s+TO\s+(\w+)/i;
	$e{public_reads} = 'f' if $recipe =~ /\bREVOKE\s+(?:SELECT|EXECUTE|ALL)\b[^;]*\bFROM\s+PUBLIC\b/i;
	return join('|', map { $e{$_} // '' } qw(reporter controller reader admin public_reads));
}

my $roles_row = q{SELECT coalesce(reporter::text, ''), coalesce(controller::text, ''), coalesce(reader::text, ''),
	coalesce(admin::text, ''), public_reads FROM status_history.roles};

# What a role (or PUBLIC) may do on every relation, function and the schema
# (has_*_privilege, so through memberships too): a line "<object>\t<privileges>"
# each.
sub effective_privileges
{
	my ($node, $db, $role) = @_;
	return q2($node, $db, qq{COPY (
		SELECT 'relation ' || c.oid::pg_catalog.regclass,
		       array_to_string(ARRAY(
		         SELECT p FROM unnest(CASE c.relkind WHEN 'S' THEN ARRAY['USAGE', 'SELECT', 'UPDATE']
		                              ELSE ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER'] END) AS p
		          WHERE CASE c.relkind WHEN 'S' THEN has_sequence_privilege('$role', c.oid, p)
		                ELSE has_table_privilege('$role', c.oid, p) END)
		       || ARRAY(SELECT 'column ' || p FROM unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'REFERENCES']) AS p
		                 WHERE c.relkind <> 'S' AND NOT has_table_privilege('$role', c.oid, p)
		                   AND has_any_column_privilege('$role', c.oid, p)), ',')
		  FROM pg_catalog.pg_class AS c
		 WHERE c.relnamespace = 'status_history'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
		UNION ALL
		SELECT 'function ' || p.oid::pg_catalog.regprocedure,
		       CASE WHEN has_function_privilege('$role', p.oid, 'EXECUTE') THEN 'EXECUTE' ELSE '' END
		  FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = 'status_history'::regnamespace
		UNION ALL
		SELECT 'schema status_history', array_to_string(ARRAY(
		         SELECT p FROM unnest(ARRAY['USAGE', 'CREATE']) AS p
		          WHERE has_schema_privilege('$role', 'status_history', p)), ',')
		ORDER BY 1) TO STDOUT});
}

# The privileges granted on every object of the schema and on the schema (the
# members of the extension), as stored: relacl, attacl, proacl, nspacl (NULL
# read as the default ACL) expanded with aclexplode, a line
# "<object>\t<grantee>\t<privileges, * grantable>\t<grantor>" per grantee and
# grantor.
sub granted_privileges
{
	my ($node, $db) = @_;
	return q2($node, $db, q{COPY (
		WITH o (obj, acl) AS (
		  SELECT 'relation ' || c.oid::pg_catalog.regclass,
		         coalesce(c.relacl, pg_catalog.acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char", c.relowner))
		    FROM pg_catalog.pg_class AS c
		   WHERE c.relnamespace = 'status_history'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
		  UNION ALL
		  SELECT 'column ' || a.attrelid::pg_catalog.regclass || '.' || quote_ident(a.attname), a.attacl
		    FROM pg_catalog.pg_attribute AS a JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
		   WHERE c.relnamespace = 'status_history'::regnamespace AND a.attacl IS NOT NULL AND NOT a.attisdropped
		  UNION ALL
		  SELECT 'function ' || p.oid::pg_catalog.regprocedure, coalesce(p.proacl, pg_catalog.acldefault('f', p.proowner))
		    FROM pg_catalog.pg_proc AS p WHERE p.pronamespace = 'status_history'::regnamespace
		  UNION ALL
		  SELECT 'schema ' || quote_ident(n.nspname), coalesce(n.nspacl, pg_catalog.acldefault('n', n.nspowner))
		    FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'status_history')
		SELECT o.obj, CASE a.grantee WHEN 0 THEN 'PUBLIC' ELSE a.grantee::regrole::text END,
		       string_agg(a.privilege_type || CASE WHEN a.is_grantable THEN '*' ELSE '' END, ',' ORDER BY a.privilege_type),
		       'granted by ' || a.grantor::regrole
		  FROM o CROSS JOIN LATERAL pg_catalog.aclexplode(o.acl) AS a
		 GROUP BY 1, 2, 4 ORDER BY 1, 2, 4) TO STDOUT});
}

# effective_privileges()'s lines as object => { privilege => 1 }.
sub privilege_sets
{
	my ($text) = @_;
	my %set;
	for (split /\n/, $text)
	{
		my ($obj, $privs) = split /\t/, $_, 2;
		$set{$obj} = { map { $_ => 1 } split /,/, $privs // '' };
	}
	return \%set;
}

# What effective_privileges() text $after has that $before has not and
# $allowed has not either (another such text, or ''): a line
# "<object>: <privileges>" each; objects $before does not list count unless
# $existing_only.  A failed query is its error.
sub privileges_gained
{
	my ($before, $after, $allowed, $existing_only) = @_;
	if (my @failed = grep { /^failed: / } $before, $after, $allowed) { return join("\n", @failed); }
	my ($b, $a, $ok) = map { privilege_sets($_) } $before, $after, $allowed;
	my @out;
	for my $obj (sort keys %$a)
	{
		next if $existing_only && !exists $b->{$obj};
		my @more = grep { !$b->{$obj}{$_} && !$ok->{$obj}{$_} } sort keys %{ $a->{$obj} };
		push @out, "$obj: " . join(',', @more) if @more;
	}
	return join("\n", @out);
}

# Relations, functions and the schema that do not belong to the extension's
# owner: a line "<object> owned by <role>" each.
sub not_owned_by_extension_owner
{
	my ($node, $db) = @_;
	return q2($node, $db, q{COPY (
		WITH e AS (SELECT extowner FROM pg_catalog.pg_extension WHERE extname = 'status_history')
		SELECT 'relation ' || c.oid::pg_catalog.regclass || ' owned by ' || c.relowner::regrole
		  FROM pg_catalog.pg_class AS c, e
		 WHERE c.relnamespace = 'status_history'::regnamespace AND c.relowner <> e.extowner
		UNION ALL
		SELECT 'function ' || p.oid::pg_catalog.regprocedure || ' owned by ' || p.proowner::regrole
		  FROM pg_catalog.pg_proc AS p, e
		 WHERE p.pronamespace = 'status_history'::regnamespace AND p.proowner <> e.extowner
		UNION ALL
		SELECT 'schema status_history owned by ' || n.nspowner::regrole
		  FROM pg_catalog.pg_namespace AS n, e
		 WHERE n.nspname = 'status_history' AND n.nspowner <> e.extowner
		ORDER BY 1) TO STDOUT});
}

# The end of a server: the roles dropped (DROP OWNED BY in every database,
# then DROP ROLE).
sub drop_roles
{
	my ($node, $label) = @_;
	my $list = join(', ', @role_names);
	my $err = '';
	for my $d (split /\n/, q1($node, 'postgres',
			q{SELECT datname FROM pg_catalog.pg_database WHERE datallowconn ORDER BY datname}))
	{
		my $r = q2($node, $d, "DROP OWNED BY $list");
		$err .= "$d: $r\n" if $r ne '';
	}
	$err .= q2($node, 'postgres', "DROP ROLE $list");
	is($err, '', "$label: the roles are dropped at the end (DROP OWNED BY in every database, then DROP ROLE)");
}

# ---------------------------------------------------------------------------
# The reference: a fresh install of the current version.
# ---------------------------------------------------------------------------
q1($ref, 'postgres', $roles);
q1($ref, 'postgres', 'CREATE DATABASE fresh');
if (!is(q2($ref, 'fresh', "CREATE EXTENSION status_history; $grants"), '', "$current installs"))
{
	done_testing();
	exit;
}
my $fresh_dump = schema_dump($ref, 'fresh');

# (e) fresh installs after grant_roles() with the four roles, PUBLIC reading
# and not: their privileges, what PUBLIC may do, and (without PUBLIC reading)
# the catalog.
my %fresh_roles;
for my $public_reads ('true', 'false')
{
	my $d = "fresh_roles_public_reads_$public_reads";
	q1($ref, 'postgres', "CREATE DATABASE $d");
	is(q2($ref, $d, 'CREATE EXTENSION status_history; ' . grant_roles_sql($public_reads)), '',
		"$current installs, grant_roles() with the four roles, public_reads => $public_reads");
	$fresh_roles{ substr($public_reads, 0, 1) } = {
		granted => granted_privileges($ref, $d),
		public  => effective_privileges($ref, $d, 'public'),
		roles   => q2($ref, $d, $roles_row),
		role    => { map { $_ => effective_privileges($ref, $d, $_) } @role_names },
		dump    => $public_reads eq 'false' ? schema_dump($ref, $d) : undef };
}
like($fresh_roles{f}{public}, qr/^relation status_history\.history\t\n/m,
	'(e) in a fresh install after grant_roles(..., public_reads => false) PUBLIC does not read the history');
like($fresh_roles{t}{public}, qr/^relation status_history\.history\tSELECT\n/m,
	'(e) with public_reads => true it does');

for my $v (@old)
{
	my $vname = $v =~ s/\W/_/gr;
	my $db = "upgrade_from_$vname";
	my $rel = $release{$v};
	if (!ok($rel, "$v: CHANGELOG.md names the commit $v was released at, and test/releases.sh built it"))
	{
		diag(-f "$releases/$v.log"
			? "its build's output ($releases/$v.log):\n" . slurp_file("$releases/$v.log")
			: "no \"Released at\" line for $v in CHANGELOG.md");
		next;
	}
	my $inst = $rel->{inst};
	my $old_extdir = '';
	IPC::Run::run([ "$inst/bin/pg_config", '--sharedir' ], '>', \$old_extdir) or die "$inst/bin/pg_config failed";
	$old_extdir = ($old_extdir =~ s/\n$//r) . '/extension';
	my $shipped = "$old_extdir/status_history--$v.sql";
	same_text(-f $shipped ? slurp_file($shipped) : "(no $shipped)", slurp_file("$extdir/status_history--$v.sql"),
		"$v: its frozen install script is the one $v shipped at $rel->{commit}",
		"frozen sql/status_history--$v.sql", "the one $v installs");

	# The old server, with v's own build.
	my $node = PostgreSQL::Test::Cluster->new("from_$vname", install_path => $inst);
	$node->init;
	$node->start;
	is(served_from($node), "$inst/lib", "$v: a server of ${v}'s own installation");
	q1($node, 'postgres', $roles);
	q1($node, 'postgres', "CREATE DATABASE $db");
	if (!is(q2($node, $db, "CREATE EXTENSION status_history VERSION '$v'; $grants"), '',
			"$v: installs with its own library"))
	{
		$node->stop;
		next;
	}
	# (When it fails part-way, the checks below still run on what it wrote.)
	unlike(q2($node, $db, $workload), qr/^failed: /, "$v: the workload runs on ${v}'s own build");
	note("$v: " . q1($node, $db, q{
		SELECT count(*) || ' rows, ' || count(*) FILTER (WHERE stale) || ' stale, '
		       || count(DISTINCT object_id) || ' objects, '
		       || count(DISTINCT replica_id) || ' replicas, '
		       || (SELECT count(*) FROM status_history.objects WHERE fence > 0) || ' fenced, '
		       || (SELECT count(*) FROM status_history.objects WHERE status = 'dropped') || ' dropped'
		  FROM status_history.history}));

	# (e) A second database: ${v}'s own recipe of roles and privileges, from
	# its README, then the same workload.
	my $rdb = "recipe_from_$vname";
	my $readme = "$releases/$v.README.md";
	my $recipe = -f $readme ? readme_recipe(slurp_file($readme)) : '';
	my ($rdb_ok, %roles_before);
	if (ok($recipe ne '', "$v (e): the README.md of $rel->{commit} has a recipe of roles and privileges"))
	{
		note("$v (e): ${v}'s recipe, as applied (the roles exist already):\n$recipe");
		q1($node, 'postgres', "CREATE DATABASE $rdb");
		$rdb_ok = is(q2($node, $rdb, "CREATE EXTENSION status_history VERSION '$v';\n$recipe"), '',
			"$v (e): installs, and ${v}'s recipe applies");
		unlike(q2($node, $rdb, $workload), qr/^failed: /, "$v (e): the workload runs after ${v}'s recipe")
		  if $rdb_ok;
		%roles_before = map { $_ => effective_privileges($node, $rdb, $_) } @role_names if $rdb_ok;
	}
	# (f) A third database: ${v}'s recipe, then the history's owner (when the
	# recipe made a role its owner) attaches code and grants rights.  (g) A
	# fourth: a role that is not a superuser created the schema first.
	my $hostile = $rdb_ok ? hostile_setup($node, $v, $recipe) : undef;
	my $schema_db = schema_setup($node, $v);

	my %old_cols = (
		history  => columns($node, $db, 'history'),
		objects  => columns($node, $db, 'objects'),
		statuses => columns($node, $db, 'statuses'),
		replica_state => columns($node, $db, 'replica_state'));
	my $before = snapshot($node, $db, \%old_cols);
	my $bound_before = q1($node, $db, 'SELECT last_value FROM status_history.clock_bound');

	# The new build installed: the same data directory, the current server.
	serve_with($node, $current_inst);
	is(served_from($node), $current_libdir, "$v: the same data directory, now served by the current build");

	my ($alter_rc, $alter_out, $alter_err) = $node->psql($db, 'ALTER EXTENSION status_history UPDATE', on_error_stop => 1);
	is($alter_rc == 0 ? $alter_out : "failed: $alter_err", '',
		"$v: ALTER EXTENSION status_history UPDATE succeeds with the workload in place");
	like($alter_err, qr/WARNING:  run status_history\.grant_roles\(\) now, with all four roles\n/,
		"$v: the upgrade (no roles recorded) printed a WARNING to run status_history.grant_roles() with all four roles")
	  if version_cmp($v, '0.4.0') < 0;
	is(q1($node, $db, q{SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'status_history'}),
		$current, "$v: the extension is now at $current");

	# (a) the catalog
	same_text(schema_dump($node, $db), $fresh_dump,
		"$v: after the upgrade the catalog equals a fresh install of $current",
		"fresh install of $current", "upgraded from $v");

	# (b) data and state intact
	my $after = snapshot($node, $db, \%old_cols);
	for my $what (grep { exists $before->{$_} } qw(history objects latest statuses replica_state))
	{
		my $rows = $before->{$what} eq '' ? 0 : 1 + (() = $before->{$what} =~ /\n/g);
		same_text($after->{$what}, $before->{$what},
			"$v: $what after the upgrade identical to what $v left ($rows rows, columns of the old version)",
			"$what before", "$what after", $old_cols{ $what eq 'latest' ? 'history' : $what });
	}
	is(q2($node, $db, "SELECT last_value >= $bound_before FROM status_history.clock_bound"),
		't', "$v: the clock's persisted bound has not gone back");

	# (b2) the state is the state the current version builds from the
	# history: every column of the current version (its fresh install says
	# which), per-object state and per-key state (new in 0.3.0) back-filled.
	if (my $rebuilt = rebuild($node, $db, "rebuilt_from_$vname", $v))
	{
		my %leave = %not_from_history;
		$leave{replica_state} = [] if $old_cols{replica_state} eq '';
		my $q = state_queries($ref, $rebuilt, \%leave);
		for my $what (qw(history objects replica_state latest))
		{
			my @left = @{ $leave{$what} // [] };
			same_text(q2($node, $db, $q->{$what}[0]), q2($ref, $rebuilt, $q->{$what}[0]),
				"$v: $what after the upgrade (every column of $current"
				  . (@left ? ' but ' . join(', ', @left) : '')
				  . ") equals what $current builds from the same history",
				"$what built by $current from the history", "$what upgraded from $v", $q->{$what}[1]);
		}
	}

	# (c) the upgraded extension works
	my $max = q2($node, $db, 'SELECT max(occurred_at) FROM status_history.history');
	my $new = q2($node, $db, q{SET ROLE sh_reporter;
		SELECT occurred_at FROM status_history.report('obj-1', 'paused', replica_id => 'r-up', generation => 9)});
	if (like($new, qr/^\d{4}-/, "$v: a reporter's report() works after the upgrade"))
	{
		is(q2($node, $db, "SELECT '$new'::timestamptz > '$max'::timestamptz"), 't',
			"$v: it is stamped above every row ($new > $max)");
		is(q2($node, $db, q{SELECT status || ' ' || occurred_at FROM status_history.statuses WHERE object_id = 'obj-1'}),
			"paused $new", "$v: and it is current");
	}
	is(q2($node, $db, q{SET ROLE sh_reporter;
		SELECT stale FROM status_history.report('obj-1', 'stalled', replica_id => 'r1', generation => 3)}),
		't', "$v: a report below a fence raised before the upgrade is stale");
	# (The subquery does not see the rows the reconnect() appends.)
	like(q2($node, $db, q{SET ROLE sh_controller;
		SELECT count(*), bool_and(r.occurred_at > (SELECT max(occurred_at) FROM status_history.history))
		  FROM status_history.reconnect(10) AS r}),
		qr/^[1-9]\d*\|t$/, "$v: reconnect() after the upgrade re-stamps above every row");
	like(q2($node, $db, q{SELECT count(*) FILTER (WHERE fence <> 10) || ' of ' || count(*) FROM status_history.objects}),
		qr/^0 of [1-9]/, "$v: and raises every fence");

	# (e4) without a recipe: the four roles adopted after the upgrade.
	is(q2($node, $db, grant_roles_sql('false')), '',
		"$v (e4): grant_roles() with the four roles in the database upgraded without a recipe");
	same_text(granted_privileges($node, $db), $fresh_roles{f}{granted},
		"$v (e4): then the privileges on every object of the schema (upgraded without a recipe) equal a fresh "
		  . "install's after the same grant_roles()",
		"fresh install of $current, grant_roles()", "upgraded from $v, grant_roles()");

	# (e) with ${v}'s recipe.
	recipe_upgrade($node, $v, $rdb, $recipe, \%roles_before) if $rdb_ok;
	hostile_upgrade($node, $v, $hostile) if $hostile;
	schema_upgrade($node, $v, $schema_db) if $schema_db;

	drop_roles($node, $v);
	$node->stop;

	open_session($v, $inst, $old_extdir);
}

# (e) The database ${v}'s recipe was applied to, on the current build:
# upgraded, then adopting the four roles, then dumped and restored.
sub recipe_upgrade
{
	my ($node, $v, $rdb, $recipe, $roles_before) = @_;
	my $vname = $v =~ s/\W/_/gr;

	# Who owned what before the upgrade (the recipes of 0.2.0 and 0.3.0 made
	# the admin role the history's owner).
	my %owned_before = map { split /\|/ } split /\n/, q1($node, $rdb, q{
		SELECT 'relation ' || c.oid::pg_catalog.regclass, c.relowner::pg_catalog.regrole
		  FROM pg_catalog.pg_class AS c, pg_catalog.pg_extension AS e
		 WHERE e.extname = 'status_history' AND c.relnamespace = 'status_history'::regnamespace
		   AND c.relowner <> e.extowner});

	# The upgrade path one step at a time (ALTER EXTENSION ... UPDATE TO each
	# version of the path in turn: the same scripts, in the same order, as one
	# ALTER EXTENSION ... UPDATE), so that what PUBLIC may do before the step
	# into the current version is known.  What every step printed (its
	# warnings) is kept.
	my @path = split /--/, q1($node, $rdb, qq{
		SELECT path FROM pg_catalog.pg_extension_update_paths('status_history')
		 WHERE source = '$v' AND target = '$current'});
	shift @path;
	my ($messages, $public_before_last) = ('', '');
	my @public_by_step = ([ $v, effective_privileges($node, $rdb, 'public') ]);
	for my $i (0 .. $#path)
	{
		my $to = $path[$i];
		my $last = $i == $#path;
		$public_before_last = $public_by_step[-1][1] if $last;
		my ($rc, $out, $err) = $node->psql($rdb,
			$last ? 'ALTER EXTENSION status_history UPDATE' : "ALTER EXTENSION status_history UPDATE TO '$to'",
			on_error_stop => 1);
		$messages .= $err;
		return
		  unless is($rc == 0 ? $out : "failed: $err", '',
			$last
			? "$v (e): ALTER EXTENSION status_history UPDATE (from $public_by_step[-1][0]) succeeds after "
			  . "${v}'s recipe and the workload"
			: "$v (e): ALTER EXTENSION status_history UPDATE TO '$to' (a step of the path) succeeds after "
			  . "${v}'s recipe and the workload");
		push @public_by_step, [ $to, effective_privileges($node, $rdb, 'public') ];
	}
	my $public_after = $public_by_step[-1][1];

	# (e1), (e2), (e3): what the upgrade itself leaves.
	is(not_owned_by_extension_owner($node, $rdb), '',
		"$v (e1): after the upgrade every relation and function of the schema, and the schema, belong to "
		  . "the extension's owner");
	my $expect = recipe_expects($recipe);
	is(q2($node, $rdb, $roles_row), $expect,
		"$v (e2): status_history.roles records what ${v}'s recipe did (reporter|controller|reader|admin|public_reads)");
	my $pr = (split /\|/, $expect)[-1];
	my $pr_word = $pr eq 't' ? 'true' : 'false';
	my $admin = (split /\|/, $expect)[3];

	# (e3) PUBLIC: the step into the current version (this version's upgrade
	# script) never widens what PUBLIC may do.  After it PUBLIC may do no more
	# than it could before it, on the objects that existed then, and what it
	# may in a fresh install after grant_roles(..., public_reads => the value
	# roles records).  And PUBLIC keeps what it could do before it, until
	# grant_roles().  (An earlier step is a shipped script, run as it shipped:
	# what it gave PUBLIC stays until grant_roles() -- 0.2.0 -> 0.3.0 gives
	# PUBLIC the reading of what it creates, after 0.2.0's recipe revoked
	# PUBLIC's reading of 0.2.0's objects -- and is shown below, not checked.)
	my $fresh_public = $fresh_roles{$pr}{public};
	for my $s (1 .. $#public_by_step - 1)
	{
		my $gained = privileges_gained($public_by_step[ $s - 1 ][1], $public_by_step[$s][1], $fresh_public);
		note("$v (e3): the shipped step $public_by_step[$s-1][0] -> $public_by_step[$s][0] gave PUBLIC, beyond what it "
			  . "had and a fresh install's PUBLIC with public_reads => $pr_word has:\n$gained")
		  if $gained ne '';
	}
	is(privileges_gained($public_before_last, $public_after, $fresh_public), '',
		"$v (e3): the upgrade into $current gives PUBLIC nothing beyond what it could do before (on the objects "
		  . "that existed) and what it may in a fresh install after grant_roles(..., public_reads => $pr_word)");
	is(privileges_gained($public_after, $public_before_last, '', 1), '',
		"$v (e3): and PUBLIC keeps what it could do before the upgrade into $current (until grant_roles())");

	# (e3) The recipe's roles: what they could do before the upgrade and
	# cannot after it (grant_roles() not run yet), on objects of both
	# versions.  Nothing of their part (what a fresh install's grant_roles()
	# gives them), but for the history's old owner on what it owned: the
	# upgrade gives those relations back to the extension's owner, and the
	# privileges the old owner had on them as their owner (its part
	# included: it neither reads nor imports) go with them until
	# grant_roles().  What they lose outside their part is shown, not checked.
	my (@lost_part, @lost_owned, @lost_other);
	for my $r (@role_names)
	{
		my @texts = ($roles_before->{$r}, effective_privileges($node, $rdb, $r), $fresh_roles{f}{role}{$r});
		if (my @failed = grep { /^failed: / } @texts)
		{
			push @lost_part, "$r: @failed";
			next;
		}
		my ($was, $is, $part) = map { privilege_sets($_) } @texts;
		for my $obj (sort grep { exists $is->{$_} } keys %$was)
		{
			my @gone = grep { !$is->{$obj}{$_} } sort keys %{ $was->{$obj} };
			my @in_part = grep { $part->{$obj}{$_} } @gone;
			my @other = grep { !$part->{$obj}{$_} } @gone;
			if (@in_part && ($owned_before{$obj} // '') eq $r) { push @lost_owned, "$r: $obj: " . join(',', @in_part); }
			elsif (@in_part) { push @lost_part, "$r: $obj: " . join(',', @in_part); }
			push @lost_other, "$r: $obj: " . join(',', @other) if @other;
		}
	}
	note("$v (e): lost by the upgrade until grant_roles(), by the history's old owner, of its part:\n"
		  . join("\n", @lost_owned)) if @lost_owned;
	note("$v (e): lost by the upgrade, outside the role's part:\n" . join("\n", @lost_other)) if @lost_other;
	is(join("\n", @lost_part), '',
		"$v (e3): after the upgrade (before grant_roles()) no role of ${v}'s recipe lost what its part gives it, "
		  . 'but the old owner of a relation on that relation');
	is(join("\n", map { s/:.*//r } @lost_owned), join("\n", ($admin) x @lost_owned),
		"$v (e3): the role that lost its part on what it owned is the one roles records as the admin");

	# The upgrade tells the operator to run grant_roles() with all four roles,
	# naming the admin it recorded (the history's old owner): from a version
	# before 0.4.0, whose upgrade script grants nothing to any role.
	if (version_cmp($v, '0.4.0') < 0)
	{
		like($messages, qr/WARNING:  run status_history\.grant_roles\(\) now, with all four roles/m,
			"$v (e3): the upgrade printed a WARNING to run status_history.grant_roles() with all four roles");
		like($messages,
			qr/HINT:  Run, with your roles: SELECT status_history\.grant_roles\(reporter => [^\n]*admin => [^\n]*public_reads => $pr_word\);/,
			"$v (e3): with a HINT that shows the call, with public_reads => $pr_word as roles records it");
		if ($admin ne '')
		{
			like($messages, qr/WARNING:  [^\n]*grant_roles\(\).*admin => '\Q$admin\E'/m,
				"$v (e3): the WARNING names the recorded admin, $admin (the history's old owner)");
		}
		note("$v (e3): the upgrade printed:\n$messages");
	}

	# (e4) the four roles adopted: as in a fresh install.
	is(q2($node, $rdb, grant_roles_sql('false')), '',
		"$v (e4): grant_roles() with the four roles, public_reads => false, after the upgrade");
	same_text(granted_privileges($node, $rdb), $fresh_roles{f}{granted},
		"$v (e4): then the privileges on every object of the schema equal a fresh install's after the same grant_roles()",
		"fresh install of $current, grant_roles()", "upgraded from $v with its recipe, grant_roles()");
	same_text(effective_privileges($node, $rdb, 'public'), $fresh_roles{f}{public},
		"$v (e4): and PUBLIC may do what it may there", "PUBLIC, fresh install, grant_roles()",
		"PUBLIC, upgraded from $v with its recipe, grant_roles()");
	is(q2($node, $rdb, $roles_row), $fresh_roles{f}{roles}, "$v (e4): and status_history.roles is the same");
	same_text(schema_dump($node, $rdb), $fresh_roles{f}{dump},
		"$v (e4): and the catalog (initial privileges too) equals a fresh install's after the same grant_roles()",
		"fresh install of $current, grant_roles()", "upgraded from $v with its recipe, grant_roles()");
	# The admin reads the history and imports (supplies occurred_at), as
	# that role: also the history's old owner, which could not until now.
	is(q2($node, $rdb, q{SET ROLE sh_admin;
		SELECT count(*) > 0 FROM status_history.history;
		INSERT INTO status_history.history (occurred_at, object_id, status)
		VALUES (timestamptz '2001-02-03 04:05:06+00', 'imported-by-admin', 'paused');
		SELECT occurred_at = timestamptz '2001-02-03 04:05:06+00' FROM status_history.history
		 WHERE object_id = 'imported-by-admin';
		RESET ROLE}), "t\nt",
		"$v (e4): after grant_roles() the admin (sh_admin) reads the history and imports a row with occurred_at supplied");

	# (e5) dumped and restored into a new database: the same privileges.
	my $dir = PostgreSQL::Test::Utils::tempdir();
	my $restored = "restored_from_$vname";
	$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dir/$rdb.dump", '-d', $node->connstr($rdb) ],
		"$v (e5): pg_dump -Fc of the upgraded database");
	q1($node, 'postgres', "CREATE DATABASE $restored");
	{
		# (Stamps imported hours ahead: restored with the lead limit lifted.)
		local $ENV{PGOPTIONS} = '-c status_history.max_import_lead=-1';
		$node->command_ok([ 'pg_restore', '-d', $node->connstr($restored), "$dir/$rdb.dump" ],
			"$v (e5): pg_restore into a new database");
	}
	same_text(granted_privileges($node, $restored), $fresh_roles{f}{granted},
		"$v (e5): the restored database has the same privileges on every object of the schema",
		"fresh install of $current, grant_roles()", "upgraded from $v, grant_roles(), dumped and restored");
	is(q2($node, $restored, $roles_row), $fresh_roles{f}{roles}, "$v (e5): and the same status_history.roles");
}

# ALTER EXTENSION status_history UPDATE as the superuser, with the error's
# SQLSTATE (VERBOSITY verbose): { ok, state, message, detail, stderr }.
sub try_upgrade
{
	my ($node, $db) = @_;
	my ($rc, $out, $err) = $node->psql($db, "\\set VERBOSITY verbose\nALTER EXTENSION status_history UPDATE",
		on_error_stop => 1);
	my ($state, $message) = $err =~ /\bERROR:  (\w{5}): (.*)$/m;
	my ($detail) = $err =~ /^DETAIL:  (.*)$/m;
	return { ok => $rc == 0, state => $state // '', message => $message // '', detail => $detail // '',
		stderr => $err };
}

sub extversion
{
	my ($node, $db) = @_;
	return q2($node, $db, q{SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'status_history'});
}

# (f) A database with ${v}'s recipe, when it made a role the history's owner:
# that role, as itself, uses the ownership to attach what would run, or let
# others run, code as the extension's owner once the upgrade gives the table
# back -- a trigger, a CHECK (NOT VALID), a policy and row-level security, a
# column default, a rule, each calling a function of its own; the append-only
# statement trigger disabled; TRIGGER, TRUNCATE and REFERENCES granted to
# another role; extended statistics, a foreign key to the history (from a
# table of its own) and a table inheriting from it.  An index it cannot create (CREATE INDEX needs
# CREATE on the schema, which no recipe granted): the superuser adds one on an
# expression calling the role's function (as someone who had CREATE there
# might have), so that the upgrade's check of indexes is tried too.  Returns
# { db, owner, items => [[what the upgrade's DETAIL names (names as the
# upgrade's search_path shows them), how the superuser removes it], ...] }, or
# undef when the recipe left the history to the extension's owner.  (The
# database is dropped when its checks end.)
sub hostile_setup
{
	my ($node, $v, $recipe) = @_;
	my $vname = $v =~ s/\W/_/gr;
	my $hdb = "hostile_from_$vname";
	q1($node, 'postgres', "CREATE DATABASE $hdb");
	my $gone = sub { q1($node, 'postgres', "DROP DATABASE $hdb"); return undef; };
	return $gone->()
	  unless is(q2($node, $hdb, "CREATE EXTENSION status_history VERSION '$v';\n$recipe"), '',
		"$v (f): installs, and ${v}'s recipe applies (a database for the history owner's attachments)");
	unlike(q2($node, $hdb, $workload), qr/^failed: /, "$v (f): the workload runs");
	my $owner = q2($node, $hdb, q{
		SELECT c.relowner::pg_catalog.regrole FROM pg_catalog.pg_class AS c, pg_catalog.pg_extension AS e
		 WHERE c.oid = 'status_history.history'::pg_catalog.regclass AND e.extname = 'status_history'
		   AND c.relowner <> e.extowner});
	my $recorded = (split /\|/, recipe_expects($recipe))[3];
	is($owner, $recorded, "$v (f): the history's owner after ${v}'s recipe is the role the recipe names ("
		  . ($recorded eq '' ? 'none' : $recorded) . ')');
	if ($owner eq '' || $owner =~ /^failed: /)
	{
		note("$v (f): ${v}'s recipe leaves the history to the extension's owner: nothing to attach as another");
		return $gone->();
	}
	my $other = 'sh_reader';
	# (The role gets CREATE on the database for a schema of its own, as an
	# application role usually has one.)
	my $attach = qq{
		GRANT CREATE ON DATABASE $hdb TO $owner;
		SET ROLE $owner;
		CREATE SCHEMA hostile;
		CREATE FUNCTION hostile.escalate(what text) RETURNS boolean LANGUAGE plpgsql AS \$\$
		BEGIN
		  IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
		    RAISE WARNING 'hostile code ran as superuser %: %', current_user, what;
		  END IF;
		  RETURN true;
		END \$\$;
		CREATE FUNCTION hostile.before_insert() RETURNS trigger LANGUAGE plpgsql
		  AS \$\$ BEGIN PERFORM hostile.escalate('trigger'); RETURN NEW; END \$\$;
		CREATE FUNCTION hostile.check_row(text) RETURNS boolean LANGUAGE sql
		  AS \$\$ SELECT hostile.escalate('check') \$\$;
		CREATE FUNCTION hostile.policy_ok() RETURNS boolean LANGUAGE sql
		  AS \$\$ SELECT hostile.escalate('policy') \$\$;
		CREATE FUNCTION hostile.index_key(text) RETURNS text LANGUAGE plpgsql IMMUTABLE
		  AS \$\$ BEGIN PERFORM hostile.escalate('index'); RETURN \$1; END \$\$;
		CREATE FUNCTION hostile.default_generation() RETURNS bigint LANGUAGE plpgsql
		  AS \$\$ BEGIN PERFORM hostile.escalate('default'); RETURN 0; END \$\$;
		CREATE TRIGGER hostile_before_insert BEFORE INSERT ON status_history.history
		  FOR EACH ROW EXECUTE FUNCTION hostile.before_insert();
		ALTER TABLE status_history.history ADD CONSTRAINT hostile_check CHECK (hostile.check_row(object_id)) NOT VALID;
		CREATE POLICY hostile_policy ON status_history.history USING (hostile.policy_ok());
		ALTER TABLE status_history.history ENABLE ROW LEVEL SECURITY;
		ALTER TABLE status_history.history ENABLE REPLICA TRIGGER history_refuse_change;
		GRANT TRIGGER, TRUNCATE, REFERENCES ON status_history.history TO $other;
		ALTER TABLE status_history.history ALTER COLUMN generation SET DEFAULT hostile.default_generation();
		CREATE RULE hostile_rule AS ON INSERT TO status_history.history DO ALSO SELECT hostile.escalate('rule');
		CREATE STATISTICS hostile.hostile_stats ON object_id, status FROM status_history.history;
		CREATE TABLE hostile.refs (at timestamptz CONSTRAINT hostile_fkey REFERENCES status_history.history (occurred_at));
		CREATE TABLE hostile.child () INHERITS (status_history.history);
		CREATE DOMAIN hostile.d AS text CHECK (hostile.escalate('domain'));
		ALTER TABLE status_history.history ADD COLUMN note hostile.d;
		RESET ROLE;
		SELECT 'attached'};
	return $gone->()
	  unless is(q2($node, $hdb, $attach), 'attached',
		"$v (f): the history's owner ($owner, as itself) attaches a trigger, a CHECK, a policy with row-level "
		  . "security, a column default and a rule calling its functions, makes history_refuse_change fire on "
		  . "replicas only (not ALWAYS), "
		  . "grants TRIGGER, TRUNCATE and REFERENCES to $other, adds statistics, a foreign key to the "
		  . 'history, a table inheriting from it, and a column of a domain whose CHECK calls its function');
	like(q2($node, $hdb, "SET ROLE $owner;\n"
			  . 'CREATE INDEX hostile_index ON status_history.history (hostile.index_key(object_id))'),
		qr/^failed: .*ERROR:  permission denied for schema status_history/,
		"$v (f): an index it cannot create (no CREATE on the schema)");
	return $gone->()
	  unless is(q2($node, $hdb, 'CREATE INDEX hostile_index ON status_history.history (hostile.index_key(object_id))'),
		'', "$v (f): the superuser creates one on an expression calling the owner's function");
	# Live: a superuser's insert (as the SECURITY DEFINER functions of 0.4.0
	# would insert, once the history is the extension's owner's) runs the
	# owner's code as that superuser.  (Rolled back.)
	my ($rc, $out, $err) = $node->psql($hdb, q{BEGIN;
		INSERT INTO status_history.history (object_id, status) VALUES ('probe', 'running');
		ROLLBACK;}, on_error_stop => 1);
	my %ran = map { $_ => 1 } $err =~ /hostile code ran as superuser \w+: (\w+)/g;
	is(join(', ', sort keys %ran), 'check, default, domain, index, rule, trigger',
		"$v (f): they are live: a superuser's insert into the history runs the owner's trigger, CHECK, "
		  . "domain's CHECK, index expression, default and rule as that superuser")
	  or diag("the insert printed:\n$err");
	# In the order the superuser removes them.
	my @items = (
		[ 'trigger hostile_before_insert on history', 'DROP TRIGGER hostile_before_insert ON status_history.history' ],
		[ 'constraint hostile_check on history', 'ALTER TABLE status_history.history DROP CONSTRAINT hostile_check' ],
		[ 'policy hostile_policy on history', 'DROP POLICY hostile_policy ON status_history.history' ],
		[ 'row level security on history', 'ALTER TABLE status_history.history DISABLE ROW LEVEL SECURITY' ],
		[ 'index hostile_index', 'DROP INDEX status_history.hostile_index' ],
		[ 'default of history.generation', 'ALTER TABLE status_history.history ALTER COLUMN generation SET DEFAULT 0' ],
		[ 'rule hostile_rule on history', 'DROP RULE hostile_rule ON status_history.history' ],
		[ 'statistics hostile_stats', 'DROP STATISTICS hostile.hostile_stats' ],
		[ 'constraint hostile_fkey on hostile.refs', 'ALTER TABLE hostile.refs DROP CONSTRAINT hostile_fkey' ],
		[ 'inheritance between hostile.child and history', 'ALTER TABLE hostile.child NO INHERIT status_history.history' ],
		[ "TRIGGER on history to $other", "REVOKE TRIGGER ON status_history.history FROM $other" ],
		[ "TRUNCATE on history to $other", "REVOKE TRUNCATE ON status_history.history FROM $other" ],
		[ "REFERENCES on history to $other", "REVOKE REFERENCES ON status_history.history FROM $other" ],
		[ 'trigger history_refuse_change on history not ENABLE ALWAYS',
			'ALTER TABLE status_history.history ENABLE ALWAYS TRIGGER history_refuse_change' ],
		[ 'column note of history of type hostile.d', 'ALTER TABLE status_history.history DROP COLUMN note' ]);
	return { db => $hdb, owner => $owner, items => \@items };
}

# What try_upgrade() shows of a refusal, for a failed check.
sub refusal_diag
{
	my ($r) = @_;
	return $r->{ok} ? 'the upgrade succeeded' : "the upgrade printed:\n$r->{stderr}";
}

# (f) On the current build: the upgrade refuses, naming each attachment, and
# changes nothing; removed one by one, it refuses while any remains and
# succeeds once all are gone; then grant_roles() gives what a fresh install's
# does.
sub hostile_upgrade
{
	my ($node, $v, $h) = @_;
	hostile_checks($node, $v, $h);
	q1($node, 'postgres', "DROP DATABASE $h->{db}");
}

sub hostile_checks
{
	my ($node, $v, $h) = @_;
	my ($hdb, $owner, @items) = ($h->{db}, $h->{owner}, @{ $h->{items} });
	my $refused = q{the extension's tables carry what a fresh install does not have};
	# What the owner's code says when it runs as a superuser (a WARNING:
	# ALTER EXTENSION shows warnings, and they outlive a rolled-back upgrade).
	my $ran_as_superuser = qr/hostile code ran as superuser/;
	my $catalog_before = schema_dump($node, $hdb);
	my $r = try_upgrade($node, $hdb);
	ok(!$r->{ok} && $r->{state} eq '42501' && $r->{message} eq $refused,
		"$v (f): ALTER EXTENSION status_history UPDATE refuses with 42501, \"$refused\"")
	  or diag(refusal_diag($r));
	my @found = $r->{detail} =~ /^Found: (.*)\.$/ ? split(/, /, $1) : ();
	is(join("\n", sort @found), join("\n", sort map { $_->[0] } @items),
		"$v (f): its DETAIL names each of them (and nothing else): " . join(', ', map { $_->[0] } @items))
	  or diag(refusal_diag($r));
	unlike($r->{stderr}, $ran_as_superuser, "$v (f): none of the owner's code ran as a superuser during the upgrade");
	is(extversion($node, $hdb), $v, "$v (f): the extension is still at $v");
	is(q2($node, $hdb, q{SELECT relowner::pg_catalog.regrole FROM pg_catalog.pg_class
		 WHERE oid = 'status_history.history'::pg_catalog.regclass}), $owner,
		"$v (f): the history still belongs to $owner");
	same_text(schema_dump($node, $hdb), $catalog_before, "$v (f): the catalog is as before the refused upgrade",
		'before the upgrade', 'after the refused upgrade');

	# Removed one at a time by the superuser.
	for my $i (0 .. $#items)
	{
		my $removed = $items[$i][0];
		is(q2($node, $hdb, $items[$i][1]), '', "$v (f): the superuser removes the $removed ($items[$i][1])");
		my @left = map { $_->[0] } @items[ $i + 1 .. $#items ];
		$r = try_upgrade($node, $hdb);
		if (@left)
		{
			@found = $r->{detail} =~ /^Found: (.*)\.$/ ? split(/, /, $1) : ();
			ok(!$r->{ok} && $r->{state} eq '42501' && $r->{message} eq $refused
				  && join("\n", sort @found) eq join("\n", sort @left),
				"$v (f): without the $removed the upgrade still refuses (42501), naming what remains: "
				  . join(', ', @left))
			  or diag(refusal_diag($r));
			is(extversion($node, $hdb), $v, "$v (f): the extension is still at $v") unless @left > 1;
		}
		else
		{
			ok($r->{ok}, "$v (f): with all of them removed the upgrade succeeds") or diag(refusal_diag($r));
			unlike($r->{stderr}, $ran_as_superuser, "$v (f): and none of the owner's code ran as a superuser");
			like($r->{stderr}, qr/\bWARNING:  (?:\w{5}: )?run status_history\.grant_roles\(\) now, with all four roles and admin => '\Q$owner\E'$/m,
				"$v (f): and warns to run grant_roles() with admin => '$owner'");
		}
	}
	return unless is(extversion($node, $hdb), $current, "$v (f): the extension is at $current");
	is(not_owned_by_extension_owner($node, $hdb), '',
		"$v (f): every relation and function of the schema, and the schema, belong to the extension's owner");

	# Its functions dropped (nothing of the extension's refers to them now),
	# then the four roles adopted: as in a fresh install.
	is(q2($node, $hdb, "DROP SCHEMA hostile CASCADE; REVOKE CREATE ON DATABASE $hdb FROM $owner"), '',
		"$v (f): the owner's schema of functions dropped (no dependent objects left)");
	is(q2($node, $hdb, grant_roles_sql('false')), '', "$v (f): grant_roles() with the four roles, public_reads => false");
	same_text(granted_privileges($node, $hdb), $fresh_roles{f}{granted},
		"$v (f): then the privileges on every object of the schema equal a fresh install's after the same grant_roles()",
		"fresh install of $current, grant_roles()", "upgraded from $v after the owner's attachments, grant_roles()");
	same_text(effective_privileges($node, $hdb, 'public'), $fresh_roles{f}{public},
		"$v (f): and PUBLIC may do what it may there", "PUBLIC, fresh install, grant_roles()",
		"PUBLIC, upgraded from $v after the owner's attachments, grant_roles()");
	for my $role (@role_names)
	{
		same_text(effective_privileges($node, $hdb, $role), $fresh_roles{f}{role}{$role},
			"$v (f): and $role may do what it may there", "$role, fresh install, grant_roles()",
			"$role, upgraded from $v after the owner's attachments, grant_roles()");
	}
	is(q2($node, $hdb, $roles_row), $fresh_roles{f}{roles}, "$v (f): and status_history.roles is the same");
	same_text(schema_dump($node, $hdb), $fresh_roles{f}{dump},
		"$v (f): and the catalog equals a fresh install's after the same grant_roles()",
		"fresh install of $current, grant_roles()", "upgraded from $v after the owner's attachments, grant_roles()");
}

# (g) A database where a role that is not a superuser (sh_admin, as itself,
# with CREATE on the database) created the schema status_history before ${v}'s
# CREATE EXTENSION, which installs into it (the control file's schema exists),
# and then put a function of its own in it.  Returns the database, or undef.
# (It is dropped when its checks end.)
sub schema_setup
{
	my ($node, $v) = @_;
	my $vname = $v =~ s/\W/_/gr;
	my $sdb = "schema_from_$vname";
	q1($node, 'postgres', "CREATE DATABASE $sdb");
	return $sdb
	  if is(q2($node, $sdb, qq{
		GRANT CREATE ON DATABASE $sdb TO sh_admin;
		SET ROLE sh_admin;
		CREATE SCHEMA status_history;
		RESET ROLE;
		CREATE EXTENSION status_history VERSION '$v';
		SET ROLE sh_admin;
		CREATE FUNCTION status_history.reconnect(generation integer) RETURNS SETOF status_history.history
		  LANGUAGE sql AS 'SELECT * FROM status_history.history WHERE false';
		RESET ROLE;
		SELECT n.nspowner::pg_catalog.regrole FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'status_history'}),
		'sh_admin',
		"$v (g): CREATE EXTENSION installs into a schema status_history that sh_admin created, and sh_admin adds "
		  . 'a reconnect(integer) of its own there');
	q1($node, 'postgres', "DROP DATABASE $sdb");
	return undef;
}

# (g) On the current build: the upgrade refuses while the schema is not the
# extension's alone (owned by sh_admin; then given to the superuser but with
# CREATE granted to sh_admin), then while it holds sh_admin's function, and
# succeeds without it.
sub schema_upgrade
{
	my ($node, $v, $sdb) = @_;
	my $alone = q{schema status_history is not the extension's alone};
	my $holds = q{schema status_history holds objects that are not the extension's};
	my @steps = (
		[ 'the schema owned by sh_admin', '', $alone, 'Its owner is not a superuser.' ],
		[ 'the schema given to the superuser, CREATE on it granted to sh_admin',
			'ALTER SCHEMA status_history OWNER TO CURRENT_USER; GRANT CREATE ON SCHEMA status_history TO sh_admin',
			$alone, 'CREATE on it is granted to sh_admin.' ],
		[ "CREATE revoked, sh_admin's function still there", 'REVOKE CREATE ON SCHEMA status_history FROM sh_admin',
			$holds, q{Not the extension's: function reconnect(integer).} ],
		[ "sh_admin's function dropped", 'DROP FUNCTION status_history.reconnect(integer)', undef, undef ]);
	for my $s (@steps)
	{
		my ($what, $sql, $message, $detail) = @$s;
		is(q2($node, $sdb, $sql), '', "$v (g): $what") if $sql ne '';
		my $r = try_upgrade($node, $sdb);
		if (defined $message)
		{
			ok(!$r->{ok} && $r->{state} eq '42501' && $r->{message} eq $message && $r->{detail} eq $detail,
				"$v (g): $what: the upgrade refuses (42501), \"$message\", DETAIL \"$detail\"")
			  or diag(refusal_diag($r));
			is(extversion($node, $sdb), $v, "$v (g): the extension is still at $v");
		}
		else
		{
			ok($r->{ok}, "$v (g): $what: the upgrade succeeds") or diag(refusal_diag($r));
			is(extversion($node, $sdb), $current, "$v (g): the extension is at $current");
		}
	}
	q1($node, 'postgres', "DROP DATABASE $sdb");
}

# (d) v's library in a session that stays open while the current build is
# installed over v's installation and another session upgrades.  (Last for
# v: it overwrites v's installation.)
sub open_session
{
	my ($v, $inst, $old_extdir) = @_;
	my $vname = $v =~ s/\W/_/gr;
	my $db = 'open_session';
	my $node = PostgreSQL::Test::Cluster->new("open_session_$vname", install_path => $inst);
	$node->init;
	$node->start;
	q1($node, 'postgres', $roles);
	q1($node, 'postgres', "CREATE DATABASE $db");
	if (!is(q2($node, $db, "CREATE EXTENSION status_history VERSION '$v'; $grants"), '', "$v (d): installs")
		|| !unlike(q2($node, $db, $workload), qr/^failed: /, "$v (d): the workload runs"))
	{
		$node->stop;
		return;
	}
	my $so = "$inst/lib/status_history.so";
	my $s1 = $node->background_psql($db, on_error_stop => 0);
	my ($out, $err) = in_session($s1, q{SELECT count(*) FROM status_history.report('obj-1', 'running', replica_id => 'r1', generation => 6)});
	is("$out$err", '1', "$v (d): a session reports with ${v}'s library");
	is(mapped_library($s1), $so, "$v (d): that session has ${v}'s library loaded ($so)");

	# "make install" of the current build while the server runs: the
	# library, its bitcode, the control file and every script.
	my $current_pkglib = $current_libdir;
	install_file("$current_pkglib/status_history.so", $so);
	if (-d "$current_pkglib/bitcode/status_history")
	{
		rmtree("$inst/lib/bitcode/status_history");
		system('cp', '-R', "$current_pkglib/bitcode/status_history", "$inst/lib/bitcode/") == 0
		  or die 'cp bitcode failed';
		install_file("$current_pkglib/bitcode/status_history.index.bc", "$inst/lib/bitcode/status_history.index.bc");
	}
	install_file($_, "$old_extdir/" . (split m{/}, $_)[-1]) for glob("$extdir/status_history[.-]*");
	is(q1($node, 'postgres', q{SELECT default_version FROM pg_catalog.pg_available_extensions WHERE name = 'status_history'}),
		$current, "$v (d): the current build is installed over ${v}'s installation, the server still running");

	# Another session upgrades.
	my $alter = q2($node, $db, 'ALTER EXTENSION status_history UPDATE');
	my $version = q1($node, $db, q{SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'status_history'});
	note("$v (d): ALTER EXTENSION status_history UPDATE in another session: "
		  . ($alter eq '' ? "done, at $version" : "$alter; still at $version"));

	# The open session goes on.
	my @outcomes;
	for my $sql (@open_session_statements)
	{
		my ($o, $e) = in_session($s1, $sql);
		push @outcomes, [ $sql =~ s/\s+/ /gr, $e eq '' ? "ok: $o" : "error: $e" ];
	}
	note("$v (d): the open session after the upgrade:\n"
		  . join("\n", map { "  $_->[0]\n    -> $_->[1]" } @outcomes));
	my $q = state_queries($node, $db, \%not_from_history);
	my ($read, $read_err) = in_session($s1, $q->{latest}[0]);
	my $still = mapped_library($s1) // '';
	note("$v (d): the open session has $still loaded");
	$s1->quit;

	# The rule: the open session's statements may fail, but the state is
	# the state the current version builds from the history, and what the
	# session read is what the current version reads from it.
	my @wrong;
	if (my $rebuilt = rebuild($node, $db, "rebuilt_open_session_$vname", "$v (d)"))
	{
		for my $what (qw(history objects replica_state))
		{
			next unless $q->{$what};
			my ($got, $want) = (q2($node, $db, $q->{$what}[0]), q2($ref, $rebuilt, $q->{$what}[0]));
			push @wrong, [ $what, $got, $want, $q->{$what}[1] ] if $got ne $want;
		}
		my $want = q2($ref, $rebuilt, $q->{latest}[0]);
		push @wrong, [ 'latest() read by the open session', $read, $want, $q->{latest}[1] ]
		  if $read_err eq '' && $read ne $want;
	}
	else
	{
		push @wrong, [ 'history', 'does not import', '', '' ];
	}
	{
		local $TODO = $open_session_todo;
		ok(!@wrong, "$v (d): a session that kept ${v}'s library across the upgrade leaves the state the "
			  . "history determines, or fails (never a silent wrong state)")
		  or diag(join("\n", map {
				"$_->[0] differs from what $current builds from the history:\n"
				  . text_diff($_->[1], $_->[2], "$_->[0] built by $current from the history",
					"$_->[0] after the upgrade", $_->[3]) } @wrong));
	}
	drop_roles($node, "$v (d)");
	$node->stop;
}

drop_roles($ref, 'the reference');
$ref->stop;
done_testing();
