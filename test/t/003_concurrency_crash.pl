# Many sessions reporting on a few hundred objects (several on the same
# objects): single reports, transactions over several objects in sorted
# order, savepoints rolled back, batches through report_many() in random
# order, with concurrent reconnect() calls at rising generations; then the
# same load with the postmaster killed in the middle, several times.  After
# each run every invariant of the contract is checked (see ShTest.pm).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShTest;

my $stress  = $ShTest::STRESS;
my $clients = $stress ? 16 : 8;
my $objects = $stress ? 1000 : 300;
my $per_client = $stress ? 20000 : 2000;
my $rounds  = $stress ? 6 : 2;

my $node = PostgreSQL::Test::Cluster->new('load');
$node->init;
# Commit timestamps let the checks compare stamp order with commit order.
$node->append_conf('postgresql.conf', "track_commit_timestamp = on\nmax_connections = 40");
$node->start;
my $dir = ShTest::setup_workload($node, $objects);

note("load: $clients clients x $per_client transactions on $objects objects");
my $load = ShTest::start_load($node, $dir, $clients, [ '-t', $per_client ]);
my $acked = ShTest::finish_load($load);
ok($load->{complete}, "every one of the reporters' transactions succeeded (no client aborted)");
is($load->{deadlocks}, 0, 'no deadlock between single-object, sorted multi-object, savepoint, '
	. 'report_many() and reconnect() transactions');
is(ShTest::one($node, "SELECT count(*) > 0 FROM fence_log"), 't', 'some reconnects succeeded');
is(ShTest::one($node, "SELECT count(*) > 0 FROM status_history.history WHERE stale"), 't',
	'some reports were stale');
my $total_acked = $acked;
ShTest::check_invariants($node, 'after load', $total_acked, 1);

for my $round (1 .. $rounds)
{
	my $crash_load = ShTest::start_load($node, $dir, $clients, [ '-T', $stress ? 20 : 6 ]);
	sleep($stress ? 8 : 3);
	ShTest::crash_and_restart($node);
	$total_acked += ShTest::finish_load($crash_load);
	ShTest::check_invariants($node, "crash $round", $total_acked, 0);
}

$node->stop;
done_testing();
