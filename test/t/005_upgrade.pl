# The upgrade chain.  For every older version whose frozen install script is
# installed (sql/status_history--<old>.sql, found by wildcard, so the chain is
# checked from the oldest shipped version): create it in a database of its own,
# fill it with a workload, ALTER EXTENSION status_history UPDATE, and check
#   (a) the catalog equals a fresh install of the current version: pg_dump
#       --schema-only --binary-upgrade of both databases, normalized (OIDs,
#       xids, sequence values), prints a diff when it differs;
#   (b) the history (every column the old version had) and the per-object
#       state (objects, latest(), statuses) are identical before and after, and
#       the clock's persisted bound has not gone back;
#   (b2) the state the upgrade leaves (every column of the current version,
#       but those in %not_from_history below) equals what the current version
#       builds from the same history, imported into a fresh install: new
#       per-object state must be back-filled from the history;
#   (c) after the upgrade a report works, is stamped above every row and is
#       current, the fences still hold, and reconnect() works.
# Run alone: test/tap.sh test/t/005_upgrade.pl
use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# Columns (b2) leaves out, per relation: state that is not a function of the
# history.  The fence is raised by reconnect() (also for objects that never
# reported), not by reports.
my %not_from_history = (history => [], objects => ['fence']);

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->start;

sub q1 { my ($db, $sql) = @_; return $node->safe_psql($db, $sql); }

# The same, but a failing query is a failing check rather than the end of the
# test: its result reads "failed: <error>".
sub q2
{
	my ($db, $sql) = @_;
	my ($rc, $out, $err) = $node->psql($db, $sql, on_error_stop => 1);
	return $rc == 0 ? $out : "failed: $err";
}

# ---------------------------------------------------------------------------
# The shipped versions, from the installed scripts.
# ---------------------------------------------------------------------------
my $extdir = q1('postgres', q{SELECT setting FROM pg_catalog.pg_config WHERE name = 'SHAREDIR'}) . '/extension';
my $current = q1('postgres',
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
	my $path = q1('postgres', qq{
		SELECT path FROM pg_catalog.pg_extension_update_paths('status_history')
		 WHERE source = '$v' AND target = '$current'});
	ok($path ne '', "an upgrade path leads from $v to $current: $path");
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
	if ($got eq $want)
	{
		pass($name);
		return 1;
	}
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
	fail($name);
	diag(join("\n", @summary, @lines));
	return 0;
}

# The database's schema as pg_dump --binary-upgrade shows it: unlike a plain
# dump, it lists the members of extensions (with ALTER EXTENSION ... ADD),
# their comments, their privileges and initial privileges.  What differs
# between two equal catalogs is normalized: OIDs, xids, the extension's
# configuration tables by OID, sequence values (checked with the data),
# columns an upgrade dropped, and values of columns an upgrade added.
sub schema_dump
{
	my ($db) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_dump', '--schema-only', '--binary-upgrade', '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err)
	  or die "pg_dump $db failed: $err";
	my %relname = map { split /\|/ } split /\n/, q1($db, q{
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

# The columns a relation of the extension has, as a select list.
sub columns
{
	my ($db, $rel, @except) = @_;
	my %skip = map { $_ => 1 } @except;
	my @cols = grep { !$skip{$_} } split /\n/, q1($db, qq{
		SELECT quote_ident(attname) FROM pg_catalog.pg_attribute
		 WHERE attrelid = 'status_history.$rel'::regclass AND attnum > 0 AND NOT attisdropped
		 ORDER BY attnum});
	return join(', ', @cols);
}

# The data and state, as text, in the columns the old version had.
sub snapshot
{
	my ($db, $cols) = @_;
	my %s;
	$s{history} = q2($db, "COPY (SELECT $cols->{history} FROM status_history.history ORDER BY occurred_at) TO STDOUT");
	$s{objects} = q2($db, "COPY (SELECT $cols->{objects} FROM status_history.objects ORDER BY object_id) TO STDOUT");
	$s{latest} = q2($db,
		"COPY (SELECT $cols->{history} FROM status_history.latest(NULL, true) ORDER BY object_id) TO STDOUT");
	$s{statuses} = q2($db,
		"COPY (SELECT $cols->{statuses} FROM status_history.statuses ORDER BY object_id) TO STDOUT");
	return \%s;
}

# Reporters, controllers: the grants an operator made survive the upgrade.
q1('postgres', q{CREATE ROLE sh_reporter; CREATE ROLE sh_controller;});
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
	SET status_history.max_import_lead = -1;
	INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation, reported_at)
	VALUES (now() + interval '2 hours', 'obj-3', 'stalled', 'r-old', 5, now()),
	       (now() + interval '3 hours', 'imported-1', 'running', 'r-old', 0, NULL),
	       (timestamptz '2001-02-03 04:05:06.789+00', 'imported-2', 'paused', NULL, 0, NULL);
	INSERT INTO status_history.history (occurred_at, object_id, status, stale)
	VALUES (now() + interval '4 hours', 'obj-4', 'running', true);
	RESET status_history.max_import_lead;

	SET ROLE sh_reporter;
	SELECT count(*) FROM generate_series(100, 200) AS i,
	  LATERAL status_history.report('obj-' || i, 'running', replica_id => 'r2', generation => 4);
	RESET ROLE;
	SET ROLE sh_controller;
	SELECT count(*) FROM status_history.reconnect(5, 'r2');
	RESET ROLE;
};

# ---------------------------------------------------------------------------
# The reference: a fresh install of the current version.
# ---------------------------------------------------------------------------
q1('postgres', 'CREATE DATABASE fresh');
if (!is(q2('fresh', "CREATE EXTENSION status_history; $grants"), '', "$current installs"))
{
	done_testing();
	exit;
}
my $fresh_dump = schema_dump('fresh');

for my $v (@old)
{
	my $db = 'upgrade_from_' . ($v =~ s/\W/_/gr);
	my $rebuilt = 'rebuilt_from_' . ($v =~ s/\W/_/gr);
	q1('postgres', "CREATE DATABASE $db");
	# The library is already the current one, as in a real upgrade between
	# "make install" and ALTER EXTENSION ... UPDATE: the current library must
	# still serve the old version's SQL (its C symbols, its tables).
	next
	  unless is(q2($db, "CREATE EXTENSION status_history VERSION '$v'; $grants"), '',
		"$v: its frozen install script installs with the current library");
	# (When it fails part-way, the checks below still run on what it wrote.)
	unlike(q2($db, $workload), qr/^failed: /, "$v: the workload runs on $v with the current library");
	note("$v: " . q1($db, q{
		SELECT count(*) || ' rows, ' || count(*) FILTER (WHERE stale) || ' stale, '
		       || count(DISTINCT object_id) || ' objects, '
		       || count(DISTINCT replica_id) || ' replicas, '
		       || (SELECT count(*) FROM status_history.objects WHERE fence > 0) || ' fenced, '
		       || (SELECT count(*) FROM status_history.objects WHERE status = 'dropped') || ' dropped'
		  FROM status_history.history}));

	my %old_cols = (
		history  => columns($db, 'history'),
		objects  => columns($db, 'objects'),
		statuses => columns($db, 'statuses'));
	my $before = snapshot($db, \%old_cols);
	my $bound_before = q1($db, 'SELECT last_value FROM status_history.clock_bound');

	is(q2($db, 'ALTER EXTENSION status_history UPDATE'), '',
		"$v: ALTER EXTENSION status_history UPDATE succeeds with the workload in place");
	is(q1($db, q{SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'status_history'}),
		$current, "$v: the extension is now at $current");

	# (a) the catalog
	same_text(schema_dump($db), $fresh_dump,
		"$v: after the upgrade the catalog equals a fresh install of $current",
		"fresh install of $current", "upgraded from $v");

	# (b) data and state intact
	my $after = snapshot($db, \%old_cols);
	for my $what (qw(history objects latest statuses))
	{
		my $rows = $before->{$what} eq '' ? 0 : 1 + (() = $before->{$what} =~ /\n/g);
		same_text($after->{$what}, $before->{$what},
			"$v: $what identical before and after the upgrade ($rows rows, columns of the old version)",
			"$what before", "$what after", $old_cols{ $what eq 'latest' ? 'history' : $what });
	}
	is(q2($db, "SELECT last_value >= $bound_before FROM status_history.clock_bound"),
		't', "$v: the clock's persisted bound has not gone back");

	# (b2) the state is the state the current version builds from the history
	q1('postgres', "CREATE DATABASE $rebuilt");
	q1($rebuilt, 'CREATE EXTENSION status_history');
	my $copy = q2($db, "COPY (SELECT $old_cols{history} FROM status_history.history ORDER BY occurred_at) TO STDOUT");
	my $data = $copy eq '' ? '' : "$copy\n";
	# (Stamps imported hours ahead are in it: lift the import lead limit, as
	# the README says a restore of such a history needs.)
	is(q2($rebuilt, "SET status_history.max_import_lead = -1;\n"
			. "COPY status_history.history ($old_cols{history}) FROM STDIN;\n$data\\.\n"), '',
		"$v: the history imports into a fresh $current");
	my $hist_cols = columns($rebuilt, 'history', @{ $not_from_history{history} });
	my $hist_all = "COPY (SELECT $hist_cols FROM status_history.history ORDER BY occurred_at) TO STDOUT";
	same_text(q2($db, $hist_all), q2($rebuilt, $hist_all),
		"$v: the history after the upgrade (every column of $current) equals the same history imported into $current",
		"history imported into $current", "history upgraded from $v", $hist_cols);
	my $obj_cols = columns($rebuilt, 'objects', @{ $not_from_history{objects} });
	my $obj_all = "COPY (SELECT $obj_cols"
	  . ' FROM status_history.objects AS o'
	  . ' WHERE EXISTS (SELECT FROM status_history.history AS h WHERE h.object_id = o.object_id)'
	  . ' ORDER BY object_id) TO STDOUT';
	same_text(q2($db, $obj_all), q2($rebuilt, $obj_all),
		"$v: per-object state after the upgrade equals what $current builds from the history (every column but "
		  . join(', ', @{ $not_from_history{objects} }) . ')',
		"objects built by $current from the history", "objects upgraded from $v", $obj_cols);
	# The per-key state (new in 0.3.0) is back-filled the same way.
	my $key_cols = columns($rebuilt, 'replica_state');
	my $key_all = "COPY (SELECT $key_cols FROM status_history.replica_state"
	  . ' ORDER BY object_id, replica_id NULLS FIRST) TO STDOUT';
	same_text(q2($db, $key_all), q2($rebuilt, $key_all),
		"$v: per-key state after the upgrade equals what $current builds from the history",
		"replica_state built by $current from the history", "replica_state upgraded from $v", $key_cols);

	# (c) the upgraded extension works
	my $max = q2($db, 'SELECT max(occurred_at) FROM status_history.history');
	my $new = q2($db, q{SET ROLE sh_reporter;
		SELECT occurred_at FROM status_history.report('obj-1', 'paused', replica_id => 'r-up', generation => 9)});
	if (like($new, qr/^\d{4}-/, "$v: a reporter's report() works after the upgrade"))
	{
		is(q2($db, "SELECT '$new'::timestamptz > '$max'::timestamptz"), 't',
			"$v: it is stamped above every row ($new > $max)");
		is(q2($db, q{SELECT status || ' ' || occurred_at FROM status_history.statuses WHERE object_id = 'obj-1'}),
			"paused $new", "$v: and it is current");
	}
	is(q2($db, q{SET ROLE sh_reporter;
		SELECT stale FROM status_history.report('obj-1', 'stalled', replica_id => 'r1', generation => 3)}),
		't', "$v: a report below a fence raised before the upgrade is stale");
	# (The subquery does not see the rows the reconnect() appends.)
	like(q2($db, q{SET ROLE sh_controller;
		SELECT count(*), bool_and(r.occurred_at > (SELECT max(occurred_at) FROM status_history.history))
		  FROM status_history.reconnect(10) AS r}),
		qr/^[1-9]\d*\|t$/, "$v: reconnect() after the upgrade re-stamps above every row");
	like(q2($db, q{SELECT count(*) FILTER (WHERE fence <> 10) || ' of ' || count(*) FROM status_history.objects}),
		qr/^0 of [1-9]/, "$v: and raises every fence");
}

$node->stop;
done_testing();
