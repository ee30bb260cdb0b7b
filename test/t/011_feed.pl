# The change feed under load: 8 reporters (short transactions, long ones
# holding a stamp for up to two seconds, savepoints rolled back, prepared
# transactions committed or rolled back later by a resolver, reconnect()s)
# and two consumers looping changes() from their last position, which they
# keep in the same transaction as what they got.  At the end each
# consumer's rows equal the committed history, row for row, in stamp order,
# none twice.  Then the same across a kill -9 of the postmaster, with a
# prepared transaction left open across the restart.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;
use Time::HiRes qw(time sleep);
use lib 'test/t';
use ShTest;

my $seconds = $ENV{SH_STRESS} ? 60 : 8;
my $node = PostgreSQL::Test::Cluster->new('feed');
$node->init(allows_streaming => 1);
$node->append_conf('postgresql.conf', "max_prepared_transactions = 20\nmax_connections = 40\nrestart_after_crash = on");
$node->start;
my $dir = $node->basedir;

# The primary the consumers read from (the standby, once promoted).
my $cur = $node;
sub q1 { return $cur->safe_psql('postgres', $_[0]); }

q1(q{
	CREATE EXTENSION status_history;
	CREATE TABLE got1 (seq bigserial, LIKE status_history.history);
	CREATE TABLE got2 (seq bigserial, LIKE status_history.history);
});

my $report = q{SELECT count(*) FROM status_history.report('o' || :k, (ARRAY['starting','running','stalled','paused'])[:s], replica_id => 'r' || :client_id, generation => 1);};
my %scripts = (
	'short.sql' => "\\set k random(1, 50)\n\\set s random(1, 4)\n$report\n",
	'long.sql' => "\\set k random(1, 50)\n\\set s random(1, 4)\nBEGIN;\n$report\nSELECT pg_sleep(random() * 2);\n\\set s random(1, 4)\n$report\nCOMMIT;\n",
	'savepoint.sql' => "\\set k random(1, 50)\n\\set s random(1, 4)\nBEGIN;\n$report\nSAVEPOINT a;\n\\set s random(1, 4)\n$report\nROLLBACK TO a;\n\\set s random(1, 4)\n$report\nCOMMIT;\n",
	'prepare.sql' => "\\set k random(1, 50)\n\\set s random(1, 4)\n\\set g random(1, 1000000000)\nBEGIN;\n$report\nPREPARE TRANSACTION 'sh_:g';\nSELECT pg_sleep(0.2);\n",
	'reconnect.sql' => "\\set k random(1, 50)\nSELECT count(*) FROM status_history.reconnect(1, object_ids => ARRAY['o' || :k]);\nSELECT pg_sleep(0.05);\n",
	'consume1.sql' => "INSERT INTO got1 (occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease) SELECT occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease FROM status_history.changes((SELECT max(occurred_at) FROM got1), 200);\n",
	'consume2.sql' => "INSERT INTO got2 (occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease) SELECT occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease FROM status_history.changes((SELECT max(occurred_at) FROM got2), 7);\n");
ShTest::write_file("$dir/$_", $scripts{$_}) for keys %scripts;

# The load, each script a pgbench of its own; a resolver commits or rolls
# back prepared transactions at random.
sub run_load
{
	my ($secs) = @_;
	my @runs;
	my @conn = ('pgbench', '-n', '-h', $node->host, '-p', $node->port);
	for my $s (['short.sql', 3], ['long.sql', 2], ['savepoint.sql', 1], ['prepare.sql', 2],
		['reconnect.sql', 1], ['consume1.sql', 1], ['consume2.sql', 1])
	{
		my ($out, $err) = ('', '');
		push @runs, IPC::Run::start([ @conn, '-c', $s->[1], '-j', 1, '-T', $secs, '-f', "$dir/$s->[0]", 'postgres' ],
			'>', \$out, '2>', \$err);
	}
	return \@runs;
}

sub resolve_some
{
	my ($all) = @_;
	my ($rc, $gids) = $node->psql('postgres', q{SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'sh_%'});
	return if $rc != 0;
	for my $gid (split /\n/, $gids)
	{
		next if !$all && rand() < 0.5;
		$node->psql('postgres', (rand() < 0.6 ? 'COMMIT' : 'ROLLBACK') . " PREPARED '$gid'");
	}
}

# Wait for the load to end, resolving prepared transactions meanwhile (their
# object locks hold the other reporters of those objects).
sub finish_load
{
	my ($runs) = @_;
	for my $r (@$runs)
	{
		while ($r->pumpable)
		{
			resolve_some(1);
			$r->pump_nb;
			sleep 0.2;
		}
		$r->finish;
	}
}

sub drain
{
	for my $t (1 .. 200)
	{
		my $n1 = q1(q{WITH i AS (INSERT INTO got1 (occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease)
		                SELECT occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease
		                  FROM status_history.changes((SELECT max(occurred_at) FROM got1), 1000) RETURNING 1)
		              SELECT count(*) FROM i});
		my $n2 = q1(q{WITH i AS (INSERT INTO got2 (occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease)
		                SELECT occurred_at, object_id, status, error, details, replica_id, generation, reported_at, stale, lease
		                  FROM status_history.changes((SELECT max(occurred_at) FROM got2), 1000) RETURNING 1)
		              SELECT count(*) FROM i});
		return if $n1 == 0 && $n2 == 0;
	}
}

# Each consumer's rows against the committed history: the same rows, none
# twice, appended in stamp order.
sub check_consumers
{
	my ($label) = @_;
	for my $got ('got1', 'got2')
	{
		is(q1(qq{
			SELECT (SELECT count(*) FROM (SELECT occurred_at, object_id, status, replica_id, generation, stale FROM $got
			                              EXCEPT ALL
			                              SELECT occurred_at, object_id, status, replica_id, generation, stale FROM status_history.history) AS a)
			     || ' ' ||
			       (SELECT count(*) FROM (SELECT occurred_at, object_id, status, replica_id, generation, stale FROM status_history.history
			                              EXCEPT ALL
			                              SELECT occurred_at, object_id, status, replica_id, generation, stale FROM $got) AS b)
			     || ' ' ||
			       (SELECT count(*) FROM (SELECT occurred_at FROM $got GROUP BY 1 HAVING count(*) > 1) AS d)
			     || ' ' ||
			       (SELECT count(*) FROM (SELECT occurred_at < lag(occurred_at) OVER (ORDER BY seq) AS back FROM $got) AS o WHERE back)}),
			'0 0 0 0', "$label: $got got exactly the committed history (extra, missing, twice, out of order)");
	}
}

my $runs = run_load($seconds);
my $until = time + $seconds;
while (time < $until) { sleep 0.5; resolve_some(0); }
finish_load($runs);
resolve_some(1);
drain();
cmp_ok(q1('SELECT count(*) FROM got1'), '>', 100, 'the consumers read a load (' . q1('SELECT count(*) FROM got1') . ' rows)');
cmp_ok(q1(q{SELECT count(*) FROM status_history.history WHERE generation = 1}), '>', 0, 'reports committed');
check_consumers('under load');

# A crash in the middle, with a prepared transaction left open across it.
my ($across_at) = grep { /^\d{4}-/ } split /\n/, q1(q{BEGIN;
	SELECT occurred_at FROM status_history.report('across', 'running', generation => 1);
	PREPARE TRANSACTION 'across'});
like($across_at, qr/^\d{4}-/, 'a prepared transaction holds a stamp');
$runs = run_load($seconds * 2);
sleep $seconds / 2;
ShTest::crash_and_restart($node);
finish_load($runs);
is(q1(q{SELECT count(*) FROM pg_prepared_xacts WHERE gid = 'across'}), '1', 'it survived the crash');
is(q1(qq{SELECT status_history.stable_horizon() <= '$across_at'}), 't',
	'after the restart the horizon is held by the prepared transaction (found in the history)');
$runs = run_load($seconds);
$until = time + $seconds;
while (time < $until) { sleep 0.5; resolve_some(0); }
finish_load($runs);
is(q1(qq{SELECT count(*) FROM got1 WHERE occurred_at > '$across_at'}) . ' '
	 . q1(qq{SELECT count(*) FROM got2 WHERE occurred_at > '$across_at'}),
	'0 0', 'no consumer read past the prepared transaction while it was open');
q1(q{COMMIT PREPARED 'across'});
resolve_some(1);
drain();
is(q1(q{SELECT count(*) FROM got1 WHERE object_id = 'across'}), '1', 'its row came once it committed');
check_consumers('across a kill -9');

# Prepared slots are reused: as many prepared transactions as the server
# allows commit with no horizon asked for in between, then one more is
# prepared; its stamp still holds the horizon.
for my $i (1 .. 20)
{
	q1(qq{BEGIN; SELECT count(*) FROM status_history.report('p$i', 'running', generation => 1);
	      PREPARE TRANSACTION 'fill_$i'});
	q1(qq{COMMIT PREPARED 'fill_$i'});
}
my ($victim_at) = grep { /^\d{4}-/ } split /\n/, q1(q{BEGIN;
	SELECT occurred_at FROM status_history.report('victim', 'running', generation => 1);
	PREPARE TRANSACTION 'victim'});
q1(q{SELECT count(*) FROM status_history.report('after-victim', 'running', generation => 1)});
is(q1(qq{SELECT status_history.stable_horizon() <= '$victim_at'}), 't',
	'a prepared transaction after many ended ones still holds the horizon');
q1(q{COMMIT PREPARED 'victim'});
drain();
is(q1(q{SELECT count(*) FROM got1 WHERE object_id IN ('victim', 'after-victim')}), '2', 'and its row came');
check_consumers('prepared slots reused');

# A standby follows the primary's horizon as replayed: a consumer there
# reads the same rows, once the horizon given out on the primary has come.
$node->backup('feedbase');
my $standby = PostgreSQL::Test::Cluster->new('feed_standby');
$standby->init_from_backup($node, 'feedbase', has_streaming => 1);
$standby->start;
q1(q{SELECT count(*) FROM status_history.report('late', 'running', generation => 1)});
my $h = q1(q{SELECT status_history.stable_horizon()});
$node->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT status_history.stable_horizon()}), $h,
	"the standby's horizon is the one the primary gave out");
is($standby->safe_psql('postgres', q{SELECT count(*) FROM status_history.changes(NULL, 1000000)}),
	q1(qq{SELECT count(*) FROM status_history.history WHERE occurred_at < '$h'}),
	'a consumer on the standby reads every row below it');

# A failover: the primary stops once the standby has everything (as with
# synchronous replication), the standby is promoted, and the consumers go
# on there from their positions (kept in got1 and got2, replicated too).
q1(q{SELECT count(*) FROM status_history.report('before-failover', 'running', generation => 1)});
$node->wait_for_catchup($standby);
$node->stop;
$standby->promote;
$standby->safe_psql('postgres', q{SELECT count(*) FROM status_history.report('after-failover', 'running', generation => 1)});
$cur = $standby;
drain();
check_consumers('after a failover');
is(q1(q{SELECT count(*) FROM got1 WHERE object_id IN ('before-failover', 'after-failover')}), '2',
	'the rows on both sides of the failover came');
$standby->stop;
done_testing();
