# Dump and restore with the real tools: pg_dump (custom and plain formats),
# pg_restore (also with --jobs 2, and --data-only into a fresh install) and
# psql.  After each restore the history (every column), the per-object state
# (fences, current reports, status_since, dropped tombstones) and the floors
# must equal the source's, compared by queries; a new report is stamped above
# every restored row, and reports below a restored fence or floor are stale.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('dump');
$node->init;
# Preloaded, as the lease worker needs (its utility hook then runs in the
# restoring sessions before CREATE EXTENSION); the worker records no lapses
# here, so that the databases compared stay as restored.
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'status_history'\nstatus_history.expire_interval = 0");
$node->start;
my $tmp = PostgreSQL::Test::Utils::tempdir();

sub q1 { my ($db, $sql) = @_; return $node->safe_psql($db, $sql); }

# A workload with everything a dump must keep: replicas, reconnects by list,
# by replica and for everything (floors), stale reports, dropped objects,
# reports after the drop, imported stamps (past and a little ahead), errors
# and details, and an object that was fenced but never reported on.
q1('postgres', 'CREATE DATABASE src');
q1('src', q{
	CREATE EXTENSION status_history;
	SELECT setseed(0.7);
	DO $$
	DECLARE st text[] := ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'];
	BEGIN
		FOR i IN 1 .. 1500 LOOP
			PERFORM status_history.report('o' || (i % 97), st[1 + i % 5],
				CASE WHEN i % 7 = 0 THEN 'error ' || i END,
				CASE WHEN i % 11 = 0 THEN jsonb_build_object('hints', jsonb_build_array('h' || i)) END,
				'r' || (i % 3), i / 500, now() - interval '1 minute' * (i % 4));
			IF i % 400 = 0 THEN COMMIT; END IF;
		END LOOP;
	END $$;
	SELECT count(*) FROM status_history.reconnect(3, object_ids => ARRAY['o1', 'o2', 'never-reported']);
	SELECT count(*) FROM status_history.reconnect(4, 'r1');
	SELECT count(*) FROM status_history.report('o5', 'dropped', generation => 4);
	SELECT count(*) FROM status_history.report('o5', 'running', generation => 4);
	SELECT count(*) FROM status_history.report('o6', 'running', generation => 1);
	INSERT INTO status_history.history (occurred_at, object_id, status, generation)
	VALUES (now() - interval '1 day', 'imported', 'running', 0),
	       (now() + interval '2 seconds', 'imported', 'stalled', 0);
	SELECT count(*) FROM status_history.reconnect(5);
	-- A heartbeat: the repeat appends no row, only its last_seen_at says it came.
	SELECT count(*) FROM status_history.report('hb', 'running', replica_id => 'r9', generation => 5);
	SELECT count(*) FROM status_history.report('hb', 'running', replica_id => 'r9', generation => 5);
	-- Leases: one renewed by a heartbeat (which only the state tables know), one run out.
	SELECT count(*) FROM status_history.report('leased', 'running', replica_id => 'r9', generation => 5,
	                                           lease => '1 hour');
	SELECT count(*) FROM status_history.report('lapsed', 'running', replica_id => 'r9', generation => 5,
	                                           lease => '1 microsecond');
});
my $first_expiry = q1('src', "SELECT expires_at FROM status_history.statuses WHERE object_id = 'leased'");
q1('src', q{SELECT pg_sleep(0.01);
	SELECT count(*) FROM status_history.report('leased', 'running', replica_id => 'r9', generation => 5,
	                                           lease => '1 hour')});
is(q1('src', "SELECT expires_at > '$first_expiry' FROM status_history.statuses WHERE object_id = 'leased'"),
	't', 'the source has a lease renewed by a heartbeat');
is(q1('src', "SELECT status FROM status_history.statuses WHERE object_id = 'lapsed'"), 'stalled',
	'the source has a lapsed lease');
is(q1('src', "SELECT last_seen_at > last_at FROM status_history.replica_state WHERE object_id = 'hb'"), 't',
	'the source has a key seen after its newest row (a repeat)');

# What must survive, as text to compare.
my %state_sql = (
	history => 'SELECT * FROM status_history.history ORDER BY occurred_at',
	objects => 'SELECT * FROM status_history.objects ORDER BY object_id',
	floors  => 'SELECT * FROM status_history.floors ORDER BY replica_id NULLS FIRST',
	keys    => 'SELECT * FROM status_history.replica_state ORDER BY object_id, replica_id NULLS FIRST',
	latest  => 'SELECT * FROM status_history.latest(include_dropped => true) ORDER BY object_id');
my %before = map { $_ => q1('src', $state_sql{$_}) } keys %state_sql;
my $newest = q1('src', 'SELECT max(occurred_at) FROM status_history.history');
cmp_ok(q1('src', 'SELECT count(*) FROM status_history.history WHERE stale'), '>', 0,
	'the source has stale reports');
is(q1('src', "SELECT fence FROM status_history.objects WHERE object_id = 'never-reported'"), '5',
	'the source has a fenced object that never reported');

# Every way of restoring; each into a database of its own.
my $dumpc = "$tmp/src.dump";
my $dumpp = "$tmp/src.sql";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dumpc, '-d', $node->connstr('src') ], 'pg_dump -Fc');
$node->command_ok([ 'pg_dump', '-f', $dumpp, '-d', $node->connstr('src') ], 'pg_dump (plain SQL)');

my %restores = (
	'pg_restore' => sub {
		$node->command_ok([ 'pg_restore', '-d', $node->connstr($_[0]), $dumpc ], 'pg_restore');
	},
	'pg_restore --jobs 2' => sub {
		$node->command_ok([ 'pg_restore', '--jobs', '2', '-d', $node->connstr($_[0]), $dumpc ],
			'pg_restore --jobs 2');
	},
	'psql' => sub {
		$node->command_ok([ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($_[0]),
				'-f', $dumpp ], 'psql < plain dump');
	},
	'pg_restore --data-only' => sub {
		q1($_[0], 'CREATE EXTENSION status_history');
		$node->command_ok([ 'pg_restore', '--data-only', '-d', $node->connstr($_[0]), $dumpc ],
			'pg_restore --data-only into a fresh install');
	});

my $n = 0;
for my $how (sort keys %restores)
{
	my $db = 'dst' . ++$n;
	q1('postgres', "CREATE DATABASE $db");
	$restores{$how}->($db);
	for my $what (sort keys %state_sql)
	{
		my $sql = $state_sql{$what};
		# A parallel restore may leave a key's last_seen_at at its newest row's
		# stamp when that row is a controller's copy (README, Backup and
		# restore): compare the rest, and bound last_seen_at.
		# The same for a renewed lease's expiry (the objects row and the key's).
		if ($how =~ /--jobs/ && $what eq 'objects')
		{
			$sql = 'SELECT object_id, fence, occurred_at, status, error, details, replica_id, generation,'
			  . ' reported_at, status_since, lease FROM status_history.objects ORDER BY object_id';
			$before{jobs_objects} //= q1('src', $sql);
			ok(q1($db, $sql) eq $before{jobs_objects}, "$how: objects identical to the source but for expires_at");
			next;
		}
		if ($how =~ /--jobs/ && $what eq 'keys')
		{
			$sql = 'SELECT object_id, replica_id, last_at, occurred_at, status, status_since'
			  . ' FROM status_history.replica_state ORDER BY object_id, replica_id NULLS FIRST';
			$before{jobs_keys} //= q1('src', $sql);
			my $after = q1($db, $sql);
			ok($after eq $before{jobs_keys}, "$how: keys identical to the source but for last_seen_at");
			next;
		}
		my $after = q1($db, $sql);
		ok($after eq $before{$what}, "$how: $what identical to the source");
		if ($after ne $before{$what})
		{
			my @a = split /\n/, $before{$what};
			my @b = split /\n/, $after;
			for my $i (0 .. ($#a > $#b ? $#a : $#b))
			{
				next if ($a[$i] // '') eq ($b[$i] // '');
				diag("first difference, row $i:\n  source:   " . ($a[$i] // '(none)')
					. "\n  restored: " . ($b[$i] // '(none)'));
				last;
			}
		}
	}
	is(q1($db, "SELECT occurred_at > '$newest' FROM status_history.report('o1', 'running', generation => 5)"),
		't', "$how: a new report is stamped above every restored row");
	is(q1($db, "SELECT stale FROM status_history.report('o2', 'stalled', generation => 2)"), 't',
		"$how: a report below a restored fence is stale");
	is(q1($db, "SELECT stale FROM status_history.report('brand-new', 'running', generation => 4)"), 't',
		"$how: a report on a new object below the restored database-wide floor is stale");
	is(q1($db, "SELECT stale FROM status_history.report('o5', 'running', generation => 9)"), 't',
		"$how: a dropped object stays dropped");
	is(q1($db, "SELECT fence FROM status_history.objects WHERE object_id = 'never-reported'"), '5',
		"$how: the fence of an object that never reported survives");
}

$node->stop;
done_testing();
