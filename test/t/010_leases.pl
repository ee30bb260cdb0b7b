# Leases without the reporter: the background worker records a lapse within
# its interval (plus a margin) in every database that has the extension, on
# the primary only, again after a kill -9 of the postmaster and on a standby
# once it is promoted; a standby shows the lapse derived before it is
# recorded; DROP DATABASE is not held up by the worker.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time sleep);
use lib 'test/t';
use ShTest;

my $interval_ms = 300;
my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', qq{
shared_preload_libraries = 'status_history'
status_history.expire_interval = ${interval_ms}ms
});
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION status_history');
$primary->safe_psql('postgres', 'CREATE DATABASE app2');
$primary->safe_psql('app2', 'CREATE EXTENSION status_history');
$primary->safe_psql('postgres', 'CREATE DATABASE plain');    # no extension: no worker stays

# Wait until the lapse of $object is in the history of $db; returns how long
# after the lease ran out it was recorded (seconds), or undef after $limit s.
sub lapse_recorded_after
{
	my ($node, $db, $object, $limit) = @_;
	my $until = time + $limit;
	while (time < $until)
	{
		my $late = $node->safe_psql($db, qq{
			SELECT extract(epoch FROM h.occurred_at - h.reported_at)
			  FROM status_history.history AS h
			 WHERE h.object_id = '$object' AND h.error LIKE 'lease expired: %'});
		return $late if $late ne '';
		sleep 0.1;
	}
	return undef;
}

# A report with a one-second lease, then nothing: the worker records the lapse.
sub silent_reporter
{
	my ($node, $db, $object) = @_;
	$node->safe_psql($db, qq{SELECT count(*) FROM status_history.report('$object', 'running',
	                                 replica_id => 'r1', lease => '1 second')});
}

# The launcher looks for new databases every 10 s: wait for app2's worker.
sub wait_for_worker
{
	my ($node, $db) = @_;
	my $until = time + 30;
	sleep 0.2 while time < $until && $node->safe_psql('postgres',
		qq{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'status_history expire worker' AND datname = '$db'}) eq '0';
}
wait_for_worker($primary, 'postgres');
wait_for_worker($primary, 'app2');
silent_reporter($primary, 'postgres', 'a');
silent_reporter($primary, 'app2', 'b');
my $late_a = lapse_recorded_after($primary, 'postgres', 'a', 20);
my $late_b = lapse_recorded_after($primary, 'app2', 'b', 20);
ok(defined $late_a && $late_a <= $interval_ms / 1000 + 2,
	'the worker recorded the lapse within its interval plus a margin (' . ($late_a // 'never') . ' s late)');
ok(defined $late_b && $late_b <= $interval_ms / 1000 + 2,
	'in a second database too (' . ($late_b // 'never') . ' s late)');
is($primary->safe_psql('postgres', q{SELECT status || ' ' || (error LIKE 'lease expired: no report from replica r1 since %')
                                       FROM status_history.statuses WHERE object_id = 'a'}),
	'stalled true', 'the object shows the recorded lapse');
is($primary->safe_psql('postgres', q{SELECT count(*) FROM status_history.history WHERE object_id = 'a'}),
	'2', 'one lapse recorded, not one per round');
is($primary->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
                                      WHERE backend_type = 'status_history expire worker' AND datname = 'plain'}),
	'0', 'no worker stays in a database without the extension');

# A launcher that ends and is started again does not know its predecessor's
# workers: the second worker of a database leaves (one stays).
$primary->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                   WHERE backend_type = 'status_history launcher'});
sleep 25;    # (the launcher is started again after 10 s, and looks at once)
is($primary->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
                                      WHERE backend_type = 'status_history launcher'}),
	'1', 'the launcher is back');
is($primary->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
                                      WHERE backend_type = 'status_history expire worker' AND datname = 'postgres'}),
	'1', 'still one worker per database');

# A database with a worker can be dropped (the worker steps aside).
$primary->safe_psql('postgres', 'CREATE DATABASE dropme');
$primary->safe_psql('dropme', 'CREATE EXTENSION status_history');
wait_for_worker($primary, 'dropme');
is($primary->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
                                      WHERE backend_type = 'status_history expire worker' AND datname = 'dropme'}),
	'1', 'the new database got its worker');
my ($rc, $out, $err) = $primary->psql('postgres', 'DROP DATABASE dropme');
is($rc, 0, 'DROP DATABASE of a database with a worker succeeds') or diag($err);

# A database without the extension, one where every expire() fails (a
# database owner made it read-only) and one still on 0.3.0 (between
# installing this library and ALTER EXTENSION UPDATE): their workers exit,
# and the launcher starts them again at most once per look (10 s), not at
# every exit.
$primary->safe_psql('postgres', 'CREATE DATABASE quiet');
$primary->safe_psql('postgres', 'CREATE DATABASE readonly');
$primary->safe_psql('readonly', 'CREATE EXTENSION status_history');
$primary->safe_psql('postgres', 'ALTER DATABASE readonly SET default_transaction_read_only = on');
$primary->safe_psql('postgres', 'CREATE DATABASE old030');
# (0.3.0's SQL cannot be created with this library: the catalog says it is.)
$primary->safe_psql('old030', 'CREATE EXTENSION status_history');
$primary->safe_psql('old030', "UPDATE pg_catalog.pg_extension SET extversion = '0.3.0' WHERE extname = 'status_history'");
my %dboid = map { $_ => $primary->safe_psql('postgres', "SELECT oid FROM pg_database WHERE datname = '$_'") }
  qw(quiet readonly old030);
$primary->safe_psql('postgres', q{ALTER SYSTEM SET log_min_messages = debug1; SELECT pg_reload_conf()});
my $log_from = -s $primary->logfile;
sleep 21;
$primary->safe_psql('postgres', q{ALTER SYSTEM RESET log_min_messages; SELECT pg_reload_conf()});
my $log = PostgreSQL::Test::Utils::slurp_file($primary->logfile, $log_from);
for my $db (qw(quiet readonly old030))
{
	my $starts = () = $log =~ /starting background worker process "status_history expire worker for database $dboid{$db}"/g;
	cmp_ok($starts, '<=', 4, "$db: its worker was started $starts times in 21 s (at most once per 10 s look)");
}
my $errors = () = $log =~ /exited with exit code 1/g;
cmp_ok($errors, '<=', 6, "the read-only database's failures are logged $errors times in 21 s, not at every round");

# A standby: no worker; a lapse shows derived before the primary records it.
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->safe_psql('postgres', q{ALTER SYSTEM SET status_history.expire_interval = 0; SELECT pg_reload_conf()});
sleep 1;
silent_reporter($primary, 'postgres', 'c');
$primary->wait_for_catchup($standby);
sleep 1.2;
is($standby->safe_psql('postgres', q{SELECT status || ' ' || (error LIKE 'lease expired: %') || ' ' || (status_since = expires_at)
                                      FROM status_history.statuses WHERE object_id = 'c'}),
	'stalled true true', 'a standby shows the lapse, derived, before it is recorded');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM status_history.history WHERE object_id = 'c'}),
	'1', '(not recorded yet)');
is($standby->safe_psql('postgres', q{SELECT count(*) FROM pg_stat_activity
                                      WHERE backend_type LIKE 'status_history%'}),
	'0', 'no launcher or worker on a standby');
my $shown = $standby->safe_psql('postgres', q{SELECT status, error FROM status_history.statuses WHERE object_id = 'c'});
$primary->safe_psql('postgres', q{ALTER SYSTEM RESET status_history.expire_interval; SELECT pg_reload_conf()});
ok(defined lapse_recorded_after($primary, 'postgres', 'c', 20), 'recorded once the interval is back');
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', q{SELECT status, error FROM status_history.statuses WHERE object_id = 'c'}),
	$shown, 'the recorded lapse is the one the standby showed');
$primary->safe_psql('postgres', qq{ALTER SYSTEM SET status_history.expire_interval = '${interval_ms}ms'; SELECT pg_reload_conf()});

# After kill -9 of the postmaster the worker comes back.
ShTest::crash_and_restart($primary);
silent_reporter($primary, 'postgres', 'd');
my $late_d = lapse_recorded_after($primary, 'postgres', 'd', 30);
ok(defined $late_d, 'after kill -9 and a restart the worker records lapses again (' . ($late_d // 'never') . ' s late)');

# After promotion the new primary's worker records them.
$primary->wait_for_catchup($standby);
$primary->stop('immediate');
$standby->promote;
$standby->safe_psql('postgres', q{ALTER SYSTEM SET status_history.expire_interval = '300ms'; SELECT pg_reload_conf()});
silent_reporter($standby, 'postgres', 'e');
my $late_e = lapse_recorded_after($standby, 'postgres', 'e', 30);
ok(defined $late_e, 'a promoted standby records lapses (' . ($late_e // 'never') . ' s late)');

$standby->stop;
done_testing();
