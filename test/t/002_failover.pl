# A streaming standby serves statuses and latest() read-only and refuses to
# stamp; after promotion, new reports and reconnect() sort after everything
# the old primary committed or handed out.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
# These tests import stamps hours ahead on purpose (a clock running fast).
$primary->append_conf('postgresql.conf', 'status_history.max_import_lead = -1');
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION status_history;
	SELECT status_history.report('s1', 'running', replica_id => 'r-old', generation => 1);
	SELECT status_history.report('s1', 'running', replica_id => 'r-new', generation => 2);
	SELECT status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
	SELECT status_history.report('s' || i, 'starting') FROM generate_series(2, 50) AS i;
});
$primary->backup('base');

my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;

$primary->safe_psql('postgres', q{
	SELECT * FROM status_history.reconnect(2, 'r-new');
	SELECT status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 1);
	-- A row from a machine whose clock runs hours fast, imported by the owner.
	INSERT INTO status_history.history (occurred_at, object_id, status)
	VALUES (now() + interval '2 hours', 's2', 'running');
});
$primary->wait_for_catchup($standby);

my $read = q{SELECT string_agg(object_id || ':' || status || ':' || coalesce(replica_id, '-'), ' ' ORDER BY object_id)
               FROM status_history.statuses};
my $latest = q{SELECT string_agg(object_id || ':' || status, ' ' ORDER BY object_id) FROM status_history.latest()};
is($standby->safe_psql('postgres', $read), $primary->safe_psql('postgres', $read),
	'the standby serves the same statuses');
is($standby->safe_psql('postgres', $latest), $primary->safe_psql('postgres', $latest),
	'the standby serves the same latest()');
is($standby->safe_psql('postgres', q{SELECT status FROM status_history.statuses WHERE object_id = 's1'}),
	'running', 'the standby shows the fenced scenario correctly');

my ($ret, $out, $err) = $standby->psql('postgres', q{SELECT status_history.report('s1', 'running')});
like($err, qr/cannot execute INSERT in a read-only transaction|cannot take a status_history stamp/,
	'the standby refuses reports');
($ret, $out, $err) = $standby->psql('postgres', q{SELECT status_history.monotonic_now()});
like($err, qr/cannot take a status_history stamp during recovery/,
	'the standby refuses to hand out stamps, with a clear error');

# A stamp handed out by the primary but never stored, far ahead of the clock.
my $handed = $primary->safe_psql('postgres', q{
	BEGIN;
	INSERT INTO status_history.history (occurred_at, object_id, status)
	VALUES (now() + interval '4 hours', 'ghost', 'running');
	SELECT status_history.monotonic_now();
	ROLLBACK;});
my $max_primary = $primary->safe_psql('postgres', 'SELECT max(occurred_at) FROM status_history.history');
$primary->wait_for_catchup($standby);
$primary->stop('immediate');
$standby->promote;

is($standby->safe_psql('postgres', "SELECT status_history.monotonic_now() > '$handed'"), 't',
	'after promotion the clock is above every stamp the old primary handed out');
is($standby->safe_psql('postgres',
	"SELECT occurred_at > '$max_primary' FROM status_history.report('s3', 'running')"),
	't', 'a new report sorts after everything the old primary committed');
is($standby->safe_psql('postgres',
	"SELECT bool_and(occurred_at > '$max_primary') FROM status_history.reconnect(3)"),
	't', 'reconnect() after promotion sorts after everything the old primary committed');
is($standby->safe_psql('postgres', q{SELECT status || ':' || generation FROM status_history.statuses WHERE object_id = 's1'}),
	'running:3', 'the promoted server carries the fence on');
is($standby->safe_psql('postgres', q{SELECT stale FROM status_history.report('s1', 'stalled', replica_id => 'r-old', generation => 2)}),
	't', 'a report below the new fence is stale on the promoted server');

$standby->stop;
done_testing();
