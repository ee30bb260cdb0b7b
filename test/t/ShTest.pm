# Helpers shared by the TAP tests: a concurrent workload run with pgbench,
# and the invariants checked after it (and after every crash).
package ShTest;

use strict;
use warnings;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

# Long versions under SH_STRESS=1 (make stress), short ones in every CI run.
our $STRESS = ($ENV{SH_STRESS} // 0) ? 1 : 0;

# Tables and functions the workload and the checks use, beside the extension.
sub setup_workload
{
	my ($node, $objects) = @_;
	$node->safe_psql('postgres', qq{
		CREATE EXTENSION IF NOT EXISTS status_history;
		-- Every report of the counted scripts is a row (the heartbeat script
		-- turns deduplication back on for itself).
		ALTER DATABASE postgres SET status_history.deduplicate = off;
		CREATE SEQUENCE gen_seq;
		-- What every successful reconnect() appended, committed with it.
		CREATE TABLE fence_log (generation bigint, object_id text, occurred_at timestamptz);
		CREATE FUNCTION sh_test_reconnect() RETURNS void LANGUAGE plpgsql AS \$\$
		DECLARE g bigint := nextval('gen_seq');
		BEGIN
			INSERT INTO fence_log
			SELECT g, r.object_id, r.occurred_at FROM status_history.reconnect(g) AS r;
		EXCEPTION WHEN object_not_in_prerequisite_state THEN
			NULL;  -- a concurrent newer reconnect won: this controller is superseded
		END \$\$;
	});
	my $dir = PostgreSQL::Test::Utils::tempdir();
	# Reporters lag the newest generation by 0 or 1, so some reports are stale.
	write_file("$dir/report.sql", qq{
\\set obj random(1, $objects)
\\set st random(1, 5)
\\set lag random(0, 1)
SELECT status_history.report('obj-' || :obj,
       (ARRAY['starting','running','paused','stalled','ceased'])[:st],
       NULL, NULL, 'w' || :client_id,
       (SELECT greatest(last_value - :lag, 0) FROM gen_seq));
});
	# Drops are rare: a pause before each.
	write_file("$dir/drop.sql", qq{
\\sleep 20 ms
\\set obj random(1, $objects)
SELECT status_history.report('obj-' || :obj, 'dropped');
});
	# Heartbeats: one key per client repeating itself (mostly no rows).
	write_file("$dir/heartbeat.sql", qq{
SET status_history.deduplicate = on;
SELECT status_history.report('hb-' || :client_id, 'running', NULL, NULL, 'w' || :client_id);
});
	# Several objects in one transaction, locked in bytewise (C) order.
	write_file("$dir/multi.sql", qq{
\\set a random(1, $objects / 3)
\\set b random($objects / 3 + 1, 2 * $objects / 3)
\\set c random(2 * $objects / 3 + 1, $objects)
BEGIN;
SELECT status_history.report(s.o, 'running', NULL, NULL, 'w' || :client_id,
       (SELECT greatest(last_value - 1, 0) FROM gen_seq))
  FROM (SELECT 'obj-' || x AS o FROM unnest(ARRAY[:a, :b, :c]) AS x
         ORDER BY ('obj-' || x) COLLATE "C") AS s;
COMMIT;
});
	# A savepoint rolled back in the middle: obj-N < obj-N-s < obj-N-t.
	write_file("$dir/savepoint.sql", qq{
\\set obj random(1, $objects)
BEGIN;
SELECT status_history.report('obj-' || :obj, 'paused', NULL, NULL, 'w' || :client_id);
SAVEPOINT s;
SELECT status_history.report('obj-' || :obj || '-s', 'stalled', NULL, NULL, 'w' || :client_id);
ROLLBACK TO SAVEPOINT s;
SELECT status_history.report('obj-' || :obj || '-t', 'running', NULL, NULL, 'w' || :client_id);
COMMIT;
});
	# A batch of 20 in no particular order: report_many() locks them sorted.
	write_file("$dir/bulk.sql", qq{
SELECT count(*) FROM status_history.report_many(
       ARRAY(SELECT 'obj-' || (1 + floor(random() * $objects))::int FROM generate_series(1, 20)),
       ARRAY(SELECT (ARRAY['starting','running','paused','stalled','ceased'])[1 + floor(random() * 5)::int]
               FROM generate_series(1, 20)),
       replica_ids => array_fill('w' || :client_id, ARRAY[20]),
       generations => array_fill((SELECT greatest(last_value - 1, 0) FROM gen_seq), ARRAY[20]));
});
	# Controllers spread their reconnects over the load.
	write_file("$dir/reconnect.sql", "\\sleep 100 ms\nSELECT sh_test_reconnect();\n");
	return $dir;
}



# The same workload, every report and re-stamped copy acknowledged in the
# table acks (the rows as report(), report_many() and reconnect() returned
# them, committed in the same transaction): a shadow of everything appended,
# for checks that cannot count rows (after prune()).  A heartbeat repeat
# appends no row and returns the row it repeats, so acks may hold a row twice.
# Scripts: @ACKED_SCRIPTS, controller 'acked_reconnect.sql'.
sub setup_acked_workload
{
	my ($node, $objects) = @_;
	my $dir = setup_workload($node, $objects);
	$node->safe_psql('postgres', q{
		CREATE TABLE acks (LIKE status_history.history);
		CREATE INDEX ON acks (occurred_at);
		CREATE INDEX ON fence_log (object_id, occurred_at);
		CREATE FUNCTION sh_test_reconnect_acked() RETURNS void LANGUAGE plpgsql AS $$
		DECLARE g bigint := nextval('gen_seq');
		BEGIN
			WITH r AS (SELECT * FROM status_history.reconnect(g)),
			     f AS (INSERT INTO fence_log SELECT g, r.object_id, r.occurred_at FROM r)
			INSERT INTO acks SELECT * FROM r;
		EXCEPTION WHEN object_not_in_prerequisite_state THEN
			NULL;  -- a concurrent newer reconnect won: this controller is superseded
		END $$;
	});
	my $gen = '(SELECT greatest(last_value - :lag, 0) FROM gen_seq)';
	write_file("$dir/acked_report.sql", qq{
\\set obj random(1, $objects)
\\set st random(1, 5)
\\set lag random(0, 1)
INSERT INTO acks SELECT * FROM status_history.report('obj-' || :obj,
       (ARRAY['starting','running','paused','stalled','ceased'])[:st],
       NULL, NULL, 'w' || :client_id, $gen);
});
	write_file("$dir/acked_drop.sql", qq{
\\sleep 20 ms
\\set obj random(1, $objects)
INSERT INTO acks SELECT * FROM status_history.report('obj-' || :obj, 'dropped');
});
	write_file("$dir/acked_heartbeat.sql", qq{
SET status_history.deduplicate = on;
INSERT INTO acks SELECT * FROM status_history.report('hb-' || :client_id, 'running', NULL, NULL, 'w' || :client_id);
});
	# The sorted subquery is the outer side of the lateral calls: bytewise order.
	write_file("$dir/acked_multi.sql", qq{
\\set a random(1, $objects / 3)
\\set b random($objects / 3 + 1, 2 * $objects / 3)
\\set c random(2 * $objects / 3 + 1, $objects)
BEGIN;
INSERT INTO acks SELECT r.*
  FROM (SELECT 'obj-' || x AS o FROM unnest(ARRAY[:a, :b, :c]) AS x
         ORDER BY ('obj-' || x) COLLATE "C") AS s
 CROSS JOIN LATERAL status_history.report(s.o, 'running', NULL, NULL, 'w' || :client_id,
       (SELECT greatest(last_value - 1, 0) FROM gen_seq)) AS r;
COMMIT;
});
	write_file("$dir/acked_savepoint.sql", qq{
\\set obj random(1, $objects)
BEGIN;
INSERT INTO acks SELECT * FROM status_history.report('obj-' || :obj, 'paused', NULL, NULL, 'w' || :client_id);
SAVEPOINT s;
INSERT INTO acks SELECT * FROM status_history.report('obj-' || :obj || '-s', 'stalled', NULL, NULL, 'w' || :client_id);
ROLLBACK TO SAVEPOINT s;
INSERT INTO acks SELECT * FROM status_history.report('obj-' || :obj || '-t', 'running', NULL, NULL, 'w' || :client_id);
COMMIT;
});
	write_file("$dir/acked_bulk.sql", qq{
INSERT INTO acks SELECT * FROM status_history.report_many(
       ARRAY(SELECT 'obj-' || (1 + floor(random() * $objects))::int FROM generate_series(1, 20)),
       ARRAY(SELECT (ARRAY['starting','running','paused','stalled','ceased'])[1 + floor(random() * 5)::int]
               FROM generate_series(1, 20)),
       replica_ids => array_fill('w' || :client_id, ARRAY[20]),
       generations => array_fill((SELECT greatest(last_value - 1, 0) FROM gen_seq), ARRAY[20]));
});
	# Each reconnect re-stamps every object: sparser than in reconnect.sql,
	# or the copies outnumber the reports on a few thousand objects.
	write_file("$dir/acked_reconnect.sql", "\\sleep 500 ms\nSELECT sh_test_reconnect_acked();\n");
	return $dir;
}

our @ACKED_SCRIPTS = (
	[ 'acked_report.sql', 4, 1 ], [ 'acked_multi.sql', 1, 3 ], [ 'acked_savepoint.sql', 1, 2 ],
	[ 'acked_bulk.sql', 1, 20 ], [ 'acked_drop.sql', 1, 1 ], [ 'acked_heartbeat.sql', 1, 0 ]);


sub write_file
{
	my ($path, $text) = @_;
	open my $fh, '>', $path or die "cannot write $path: $!";
	print $fh $text;
	close $fh;
}

# The reporters' scripts: share of the reporting clients, and reports each
# transaction commits.  Each runs as its own pgbench, so that its
# "transactions actually processed" is an exact client-side count
# (pgbench's per-script counts in a mixed run can miss a transaction).
our @SCRIPTS = (
	[ 'report.sql', 4, 1 ], [ 'multi.sql', 1, 3 ], [ 'savepoint.sql', 1, 2 ],
	[ 'bulk.sql', 1, 20 ], [ 'drop.sql', 1, 1 ], [ 'heartbeat.sql', 1, 0 ]);

# Start the load in the background: the reporters' scripts and two
# controllers (reconnect script), each a pgbench run of its own.  $limit is
# ['-T', seconds] or ['-t', per client]: pgbench does not count transactions
# still running when -T expires, so exact counts need -t.  $clients is the
# number of reporting clients, shared out by the scripts' shares.
#
# %opts: scripts => [ [file, share, reports per transaction], ... ] instead
# of @SCRIPTS, controller => the controllers' script instead of reconnect.sql.
sub start_load
{
	my ($node, $dir, $clients, $limit, %opts) = @_;
	my @scripts = @{ $opts{scripts} // \@SCRIPTS };
	my $controller = $opts{controller} // 'reconnect.sql';
	my %h = (runs => [], cout => '', cerr => '');
	my @conn = ('pgbench', '-n', '-h', $node->host, '-p', $node->port);
	my $shares = 0;
	$shares += $_->[1] for @scripts;
	for my $script (@scripts)
	{
		my $c = int($clients * $script->[1] / $shares + 0.5) || 1;
		my %r = (script => $script, out => '', err => '');
		my @lim = $script->[0] =~ /drop\.sql\z/ && $limit->[0] eq '-t' ? ('-t', int($limit->[1] / 100) || 1) : @$limit;
		$r{run} = IPC::Run::start([ @conn, '-c', $c, '-j', 1, @lim, '-f', "$dir/$script->[0]", 'postgres' ],
			'>', \$r{out}, '2>', \$r{err});
		push @{ $h{runs} }, \%r;
	}
	my @climit = $limit->[0] eq '-t' ? ('-t', 40) : @$limit;
	$h{controllers} = IPC::Run::start(
		[ @conn, '-c', 2, @climit, '-f', "$dir/$controller", 'postgres' ],
		'>', \$h{cout}, '2>', \$h{cerr});
	return \%h;
}

# Wait for the load; returns the reports pgbench saw succeed.  Also sets
# $h->{out} (the reporters' pgbench outputs), $h->{complete} (every reporting
# client finished all its transactions) and $h->{deadlocks}.
sub finish_load
{
	my ($h) = @_;
	my $reports = 0;
	my $errs = $h->{cerr};
	$h->{out} = '';
	$h->{complete} = 1;
	$_->{run}->finish for @{ $h->{runs} };
	$h->{controllers}->finish;
	for my $r (@{ $h->{runs} })
	{
		$h->{out} .= $r->{out};
		$errs .= $r->{err};
		if ($r->{out} !~ /^number of transactions actually processed: (\d+)(?:\/(\d+))?/m)
		{
			diag("pgbench printed no count for $r->{script}[0]:\n$r->{out}\n$r->{err}");
			$h->{complete} = 0;
			next;
		}
		$h->{complete} = 0 if defined $2 && $1 != $2;
		$reports += $1 * $r->{script}[2];
	}
	# Errors other than the server going away are worth seeing.
	my @lines = grep { /ERROR/ && !/terminat|connection|server closed/ } split /\n/, $errs;
	diag(join("\n", @lines[0 .. ($#lines < 4 ? $#lines : 4)])) if @lines;
	$h->{deadlocks} = () = $errs =~ /deadlock detected/g;
	return $reports;
}

# kill -9 the postmaster, then start again once its children are gone.
sub crash_and_restart
{
	my ($node) = @_;
	$node->kill9;
	for my $try (1 .. 30)
	{
		sleep 1;
		return if $node->start(fail_ok => 1);
		$node->{_pid} = undef;    # a failed start read the dead server's pid file
	}
	BAIL_OUT('the server did not come back after kill -9');
}

sub one
{
	my ($node, $sql) = @_;
	return $node->safe_psql('postgres', $sql);
}

# Every invariant of the contract, checked on the data as it stands.
# $acked: reports the client saw succeed; $exact: no crash, so none in doubt.
sub check_invariants
{
	my ($node, $label, $acked, $exact) = @_;
	my $rows = one($node, 'SELECT count(*) FROM status_history.history');
	my $restamps = one($node, q{SELECT count(*) FROM fence_log WHERE object_id NOT LIKE 'hb-%'});
	my $beats = one($node, q{SELECT count(*) FROM status_history.history WHERE object_id LIKE 'hb-%'});
	my $reports = $rows - $restamps - $beats;

	# A heartbeat key appends a row only when it stops being a repeat (a
	# re-stamp, or a floor that made it stale, even one rolled back since):
	# no row of it equals the one before in everything a repeat compares.
	is( one($node, q{
			SELECT count(*) FROM (
				SELECT status, error, details, generation, stale,
				       lag(ROW(status, error, details, generation, stale))
				           OVER (PARTITION BY object_id, replica_id ORDER BY occurred_at) AS prev
				  FROM status_history.history WHERE object_id LIKE 'hb-%') AS k
			 WHERE ROW(status, error, details, generation, stale) IS NOT DISTINCT FROM prev}),
		0, "$label: heartbeats appended no repeat ($beats rows)");

	if ($exact)
	{
		is($reports, $acked, "$label: all $acked acknowledged reports are in the history");
	}
	else
	{
		cmp_ok($reports, '>=', $acked,
			"$label: all $acked acknowledged reports are in the history ($reports committed)");
	}
	check_state($node, $label);
	return $rows;
}

# The invariants that do not count rows, so they hold after prune() too:
# unique stamps, per-object stamp order = commit order, latest() = brute
# force, no non-stale row below the fence in force (fence_log), statuses =
# latest(), new stamps above the table.
sub check_state
{
	my ($node, $label) = @_;
	my $rows = one($node, 'SELECT count(*) FROM status_history.history');
	is(one($node, 'SELECT count(*) - count(DISTINCT occurred_at) FROM status_history.history'),
		0, "$label: no two of $rows rows share an occurred_at");
	is( one($node, q{
			SELECT count(*) FROM (
				SELECT pg_xact_commit_timestamp(xmin) AS ct,
				       lag(pg_xact_commit_timestamp(xmin))
				           OVER (PARTITION BY object_id ORDER BY occurred_at) AS prev
				  FROM status_history.history) AS x
			 WHERE ct < prev}),
		0, "$label: per object, stamp order is commit order");
	is( one($node, q{
			WITH brute AS (
				SELECT DISTINCT ON (object_id) * FROM status_history.history
				 WHERE NOT stale ORDER BY object_id, occurred_at DESC
			), l AS (
				SELECT * FROM status_history.latest(include_dropped => true)
			)
			SELECT (SELECT count(*) FROM (SELECT * FROM l EXCEPT SELECT * FROM brute) AS a)
			     + (SELECT count(*) FROM (SELECT * FROM brute EXCEPT SELECT * FROM l) AS b)}),
		0, "$label: latest() equals brute force over "
		  . one($node, 'SELECT count(DISTINCT object_id) FROM status_history.history') . " objects");
	my $fenced = one($node, 'SELECT count(*) FROM fence_log');
	is( one($node, q{
			SELECT count(*) FROM status_history.history AS h
			  JOIN fence_log AS f ON f.object_id = h.object_id AND h.occurred_at > f.occurred_at
			 WHERE NOT h.stale AND h.generation < f.generation}),
		0, "$label: no non-stale row below the fence in force ($fenced re-stamps checked)");
	is( one($node, q{
			SELECT count(*) FROM status_history.statuses AS s
			  FULL JOIN (SELECT * FROM status_history.latest()) AS l USING (object_id)
			 WHERE s.occurred_at IS DISTINCT FROM l.occurred_at}),
		0, "$label: statuses agrees with latest()");
	is( one($node, q{
			SELECT (SELECT status_history.monotonic_now()) > max(occurred_at)
			  FROM status_history.history}),
		't', "$label: new stamps are above every stamp in the table");
	return $rows;
}

1;
