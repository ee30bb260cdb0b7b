# prune() while reporters and controllers run (issue "Retention": the load
# test).  A history with many rows per key is built first, then the workload
# of 003 (single reports, sorted multi-object transactions, rolled-back
# savepoints, report_many() batches, drops, heartbeats, two reconnect()
# controllers) runs, every report and re-stamped copy acknowledged in the
# table acks in its own transaction (ShTest::setup_acked_workload), and in
# the middle ONE prune(2) runs.  Afterwards:
#
# - nothing acknowledged after prune started is gone: every ack whose
#   transaction committed after prune's start (pg_xact_commit_timestamp of
#   the ack, track_commit_timestamp = on) has its row in the history;
# - every row prune's rules protect is there: each key's newest row, each
#   key's newest non-stale row (computed from everything ever acknowledged),
#   each object's current report;
# - prune removed only what its rule allows (a removed row is beyond its
#   key's 2 newest, not its newest non-stale one, not current), the history
#   holds only acknowledged rows, and acknowledged - left = what prune()
#   returned, which is > 0;
# - the per-object state equals brute force (ShTest::check_state: latest()
#   vs DISTINCT ON over non-stale rows, statuses = latest(), fences, unique
#   stamps, stamp order = commit order per object);
# - no deadlock, every client ran to the end.
#
# The start is clock_timestamp() read in prune's own statement, just before
# prune() is called (a projection's expressions run in order): prune takes its
# snapshot a few microseconds later, after its lock, so a row that committed
# in between is visible to it.  Such a row is its key's newest when it commits
# (per object, stamp order is commit order), and prune(2) could remove it only
# if two newer rows of the same key had also committed in that gap.  (Read in
# a statement of its own before prune's, the start lay a client round trip
# earlier; on a loaded machine that gap held a row and two newer copies once.)
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use ShTest;

my $stress    = $ShTest::STRESS;
my $clients   = $stress ? 16 : 8;
my $objects   = $stress ? 3000 : 700;     # with the savepoint script's objects, two prune batches (1000 objects)
my $replicas  = 4;                        # w0..w3: the replica ids the reporters use
my $per_key   = $stress ? 60 : 30;        # rows per key built before the load
my $load_secs = $stress ? 60 : 16;

my $node = PostgreSQL::Test::Cluster->new('prune_load');
$node->init;
$node->append_conf('postgresql.conf', "track_commit_timestamp = on\nmax_connections = 40");
$node->start;
my $dir = ShTest::setup_acked_workload($node, $objects);
sub one { return ShTest::one($node, $_[0]); }

# --- the history to prune: $per_key rows per (object, replica), half of them
# written after a reconnect raised every fence to 1, at generation 0 (stale)
# or 1.  Every row acknowledged in acks like the reporters' rows.
my $half = int($per_key / 2);
my $build = sub {
	my ($gen) = @_;
	one(qq{
		WITH r AS (
			INSERT INTO status_history.history (object_id, status, replica_id, generation)
			SELECT 'obj-' || (1 + i % $objects),
			       (ARRAY['starting','running','paused','stalled','ceased'])[1 + (i / $objects) % 5],
			       'w' || (i / $objects) % $replicas, $gen
			  FROM generate_series(0, $objects * $replicas * $half - 1) AS i
			RETURNING *)
		INSERT INTO acks SELECT * FROM r});
};
$build->('0');
one('SELECT sh_test_reconnect_acked()');
$build->("(i / $objects / $replicas) % 2");
my $built = one('SELECT count(*) FROM status_history.history');
cmp_ok(one('SELECT count(*) FROM status_history.history WHERE stale'), '>', 0,
	"the history to prune has stale rows ($built rows)");

# --- the load, and one prune in the middle of it ------------------------------
note("load: $clients clients and 2 controllers for ${load_secs}s on $objects objects; prune(2) after 3 s");
my $load = ShTest::start_load($node, $dir, $clients, [ '-T', $load_secs ],
	scripts => \@ShTest::ACKED_SCRIPTS, controller => 'acked_reconnect.sql');
sleep 3;
my ($start, $removed) = split /\|/, one('SELECT clock_timestamp(), status_history.prune(2)');
my $end = one('SELECT clock_timestamp()');
note("prune(2) removed $removed rows from $start to $end");
ShTest::finish_load($load);
ok($load->{complete}, "every reporter's transaction succeeded (no client aborted)");
is($load->{deadlocks}, 0, 'no deadlock between reporters, reconnect() and prune()');
cmp_ok($removed, '>', 0, 'prune removed rows');

# The load overlapped the prune: acknowledgements committed while it ran and after.
my $ct = 'pg_xact_commit_timestamp(a.xmin)';
my ($during, $after) = split /\|/, one(qq{
	SELECT count(*) FILTER (WHERE $ct > '$start' AND $ct < '$end'),
	       count(*) FILTER (WHERE $ct >= '$end')
	  FROM acks AS a});
cmp_ok($during, '>', 0, "reports were acknowledged while prune ran ($during)");
cmp_ok($after, '>', 0, "and after it committed ($after)");
cmp_ok(one(q{SELECT count(*) FROM fence_log}), '>', 0, 'reconnects succeeded during the load');

# --- nothing acknowledged after prune started is lost ---------------------------
# A repeat (heartbeats) appends no row: its acknowledgement names the row it
# repeats, acknowledged before.  A row is judged by its first acknowledgement.
my $first = qq{SELECT a.occurred_at, min($ct) AS ct FROM acks AS a GROUP BY a.occurred_at};
my $late = one(qq{SELECT count(*) FROM ($first) AS f WHERE f.ct > '$start'});
is( one(qq{
		SELECT count(*) FROM ($first) AS f
		 WHERE f.ct > '$start'
		   AND NOT EXISTS (SELECT FROM status_history.history AS h WHERE h.occurred_at = f.occurred_at)}),
	0, "all $late rows first acknowledged after prune started are in the history");

# --- the history holds acknowledged rows only, and prune's count adds up -------
is( one(q{SELECT count(*) FROM (SELECT * FROM status_history.history EXCEPT SELECT * FROM acks) AS x}),
	0, 'every row of the history is an acknowledged row, as acknowledged');
my $acked = one('SELECT count(DISTINCT occurred_at) FROM acks');
my $left  = one('SELECT count(*) FROM status_history.history');
is($acked - $left, $removed, "acknowledged ($acked) - left ($left) = what prune() returned");

# --- what the rules protect is there; what went, the rule allowed --------------
# Over everything ever acknowledged, per key, newest first: rows only come
# after a key's existing ones (no imports here), so a row's rank there is at
# least its rank in prune's snapshot.
my $ranked = q{
	WITH s AS (SELECT DISTINCT ON (occurred_at) * FROM acks ORDER BY occurred_at),
	r AS (SELECT s.*, row_number() OVER w AS n,
	             count(*) FILTER (WHERE NOT s.stale) OVER w AS live_n,
	             EXISTS (SELECT FROM status_history.history AS h WHERE h.occurred_at = s.occurred_at) AS kept
	        FROM s WINDOW w AS (PARTITION BY s.object_id, s.replica_id ORDER BY s.occurred_at DESC))};
my ($newest, $newest_live) = split /\|/, one(qq{$ranked
	SELECT count(*) FILTER (WHERE n = 1 AND NOT kept),
	       count(*) FILTER (WHERE NOT stale AND live_n = 1 AND NOT kept) FROM r});
is($newest, 0, "each key's newest row is there (" . one("$ranked SELECT count(*) FROM r WHERE n = 1") . ' keys)');
is($newest_live, 0, "each key's newest non-stale row is there");
is( one(q{
		SELECT count(*) FROM status_history.objects AS o
		 WHERE o.occurred_at IS NOT NULL
		   AND NOT EXISTS (SELECT FROM status_history.history AS h WHERE h.occurred_at = o.occurred_at)}),
	0, "each object's current report is there");
is( one(qq{$ranked
		SELECT count(*) FROM r
		 WHERE NOT kept AND (n <= 2 OR (NOT stale AND live_n = 1)
		       OR EXISTS (SELECT FROM status_history.objects AS o WHERE o.occurred_at = r.occurred_at))}),
	0, "every removed row was beyond its key's 2 newest, not its newest non-stale one, not current");

# --- the state ----------------------------------------------------------------------
ShTest::check_state($node, 'after prune under load');

# Pruned again with nothing running, the history is exactly what prune(2)
# keeps of it by brute force.
one(q{
	CREATE TABLE kept AS SELECT c.occurred_at FROM (
		SELECT h.occurred_at, h.stale, row_number() OVER w AS n,
		       count(*) FILTER (WHERE NOT h.stale) OVER w AS live_n
		  FROM status_history.history AS h
		WINDOW w AS (PARTITION BY h.object_id, h.replica_id ORDER BY h.occurred_at DESC)) AS c
	 WHERE c.n <= 2 OR (NOT c.stale AND c.live_n = 1)
	    OR EXISTS (SELECT FROM status_history.objects AS o WHERE o.occurred_at = c.occurred_at)});
my $again = one('SELECT status_history.prune(2)');
is( one(q{
		SELECT count(*) FROM (
			(SELECT occurred_at FROM status_history.history EXCEPT SELECT occurred_at FROM kept)
			UNION ALL
			(SELECT occurred_at FROM kept EXCEPT SELECT occurred_at FROM status_history.history)) AS d}),
	0, "a second prune(2), alone, removes $again rows and leaves exactly what brute force keeps ("
	  . one('SELECT count(*) FROM kept') . ' rows)');
ShTest::check_state($node, 'after a second prune');

$node->stop;
done_testing();
