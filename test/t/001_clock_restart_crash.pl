# The clock across restarts, crashes and a clock that "steps back" (rows
# imported hours in the future): stamps stay unique and increasing, and a
# report and a reconnect() still sort last.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShTest;

my $node = PostgreSQL::Test::Cluster->new('clock');
$node->init;
# These tests import stamps hours ahead on purpose (a clock running fast).
$node->append_conf('postgresql.conf', 'status_history.max_import_lead = -1');
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION status_history');

sub q1 { return $node->safe_psql('postgres', $_[0]); }

# Rows from a machine whose clock runs hours fast, imported by the owner.
my $future = q1(q{
	INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, generation)
	VALUES (now() + interval '3 hours', 's1', 'stalled', 'r-old', 1)
	RETURNING occurred_at});
$node->restart;
is(q1("SELECT status_history.monotonic_now() > '$future'"), 't',
	'after a restart the clock is seeded above a future stamp in the table');
is(q1("SELECT occurred_at > '$future' FROM status_history.report('s1', 'running', replica_id => 'r-new', generation => 2)"),
	't', 'a new report sorts after the future stamp');
is(q1("SELECT status FROM status_history.statuses WHERE object_id = 's1'"), 'running',
	'and is current');
is(q1("SELECT count(*) FROM status_history.reconnect(2, 'r-new') WHERE occurred_at > (SELECT max(occurred_at) FROM status_history.history WHERE generation < 2)"),
	'1', 'reconnect() re-stamps after every earlier row');

# A stamp handed out but never stored: far in the future, its row rolled back.
my $handed = q1(q{
	BEGIN;
	INSERT INTO status_history.history (occurred_at, object_id, status)
	VALUES (now() + interval '5 hours', 'ghost', 'running');
	SELECT status_history.monotonic_now();
	ROLLBACK;});
is(q1("SELECT max(occurred_at) < '$handed' FROM status_history.history"), 't',
	'the handed-out stamp is above everything stored');

for my $round (1 .. 3)
{
	ShTest::crash_and_restart($node);
	is(q1("SELECT status_history.monotonic_now() > '$handed'"), 't',
		"crash $round: the clock resumes above a stamp handed out before the crash");
	$handed = q1('SELECT status_history.monotonic_now()');
	is(q1(q{SELECT count(*) - count(DISTINCT occurred_at) FROM status_history.history}), '0',
		"crash $round: stamps are still unique");
}

# The persisted bound is ahead of what was handed out, by at most a second or so.
is(q1("SELECT last_value >= (extract(epoch FROM '$handed'::timestamptz - '2000-01-01 00:00:00+00') * 1000000)::bigint FROM status_history.clock_bound"),
	't', 'the persisted bound is at or above the newest stamp');

# An import inside a prepared transaction: the row becomes visible only after
# a restart, so the clock must have persisted a bound above it beforehand.
$node->append_conf('postgresql.conf', 'max_prepared_transactions = 2');
$node->restart;
my $prepared = q1(q{
	BEGIN;
	INSERT INTO status_history.history (occurred_at, object_id, status)
	VALUES (now() + interval '2 hours', 'prep', 'running') RETURNING occurred_at;
	PREPARE TRANSACTION 'import';});
ShTest::crash_and_restart($node);
q1("COMMIT PREPARED 'import'");
is(q1("SELECT status_history.monotonic_now() > '$prepared'"), 't',
	'a prepared import committed after a crash is below every new stamp');
is(q1("SELECT occurred_at > '$prepared' FROM status_history.report('prep', 'stalled')"), 't',
	'and a report on its object is stamped after it');

# DROP and CREATE EXTENSION (a new clock_bound sequence), or the owner
# restarting the sequence: the bound the clock kept in shared memory is no
# longer persisted anywhere and must not be trusted across the next crash.
for my $how ('recreate', 'restart')
{
	q1(q{INSERT INTO status_history.history (occurred_at, object_id, status)
		VALUES (now() + interval '4 hours', 'ahead', 'running')});
	if ($how eq 'recreate')
	{
		q1('DROP EXTENSION status_history; CREATE EXTENSION status_history');
	}
	else
	{
		q1('ALTER SEQUENCE status_history.clock_bound RESTART');
	}
	# Stored nowhere: only the persisted bound can keep the clock above it.
	my $ghost = q1('SELECT status_history.monotonic_now()');
	ShTest::crash_and_restart($node);
	is(q1("SELECT status_history.monotonic_now() > '$ghost'"), 't',
		"$how: the clock does not go back across a crash");
	q1('DROP EXTENSION status_history; CREATE EXTENSION status_history') if $how eq 'restart';
}

# Scratch databases come and go: the slots of dropped databases are reused.
for my $i (1 .. 70)
{
	$node->safe_psql('postgres', "CREATE DATABASE scratch$i");
	$node->safe_psql("scratch$i",
		'CREATE EXTENSION status_history; SELECT status_history.monotonic_now()');
	$node->safe_psql('postgres', "DROP DATABASE scratch$i");
}
is(q1("SELECT stale FROM status_history.report('after-scratch', 'running')"), 'f',
	'70 databases created and dropped: the clock still has a slot for every database');

# With shared_preload_libraries the clock reserves its memory at start-up; same behaviour.
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'status_history'");
$node->restart;
is(q1("SELECT status_history.monotonic_now() > '$handed'"), 't',
	'preloaded: the clock resumes above every stamp handed out');
is(q1("SELECT stale FROM status_history.report('s2', 'running')"), 'f',
	'preloaded: reports work');

$node->stop;
done_testing();
