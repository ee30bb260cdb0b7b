# The pg_cron recipe of docs/OPERATIONS.md ("Scheduling with pg_cron"), run as
# written: a server with pg_cron preloaded, a history with many reports per
# (object, replica) key, stale reports and a dropped object, the job
# scheduled with cron.schedule(), and a bounded wait for a succeeded run in
# cron.job_run_details.  Afterwards the history must be exactly what
# prune(2) promises (computed by brute force before the run): per key the
# two newest reports, plus the key's newest non-stale report when it is
# older, and every object's current report; the per-object state unchanged.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('cron');
$node->init;
# The recipe's server settings.
$node->append_conf('postgresql.conf', q{
shared_preload_libraries = 'pg_cron'
cron.database_name = 'postgres'
cron.use_background_workers = on
});
$node->start;

sub q1 { return $node->safe_psql('postgres', $_[0]); }

q1('CREATE EXTENSION status_history');
q1('CREATE EXTENSION pg_cron');

# 30 objects x 3 keys (r1, r2, the NULL replica) x 8 reports; then a fence
# for r2 and reports below it, so that some keys' newest reports are stale;
# and a dropped object with a late (stale) report.
q1(q{
	INSERT INTO status_history.history (object_id, status, replica_id, generation)
	SELECT 'obj-' || o, (ARRAY['starting', 'running', 'paused', 'stalled', 'ceased'])[1 + (o + n) % 5],
	       (ARRAY['r1', 'r2', NULL])[1 + k % 3], 0
	  FROM generate_series(1, 8) AS n, generate_series(1, 30) AS o, generate_series(0, 2) AS k
	 ORDER BY n, o, k;
	SELECT count(*) FROM status_history.reconnect(1, 'r2');
	INSERT INTO status_history.history (object_id, status, replica_id, generation)
	SELECT 'obj-' || o, 'stalled', 'r2', 0 FROM generate_series(1, 30, 3) AS o ORDER BY o;
	SELECT count(*) FROM status_history.report('obj-2', 'dropped', replica_id => 'r1', generation => 1);
	SELECT count(*) FROM status_history.report('obj-2', 'running', replica_id => 'r1', generation => 1);
});
my $rows_before = q1('SELECT count(*) FROM status_history.history');
cmp_ok(q1('SELECT count(*) FROM status_history.history WHERE stale'), '>', 0, 'the history has stale reports');

# What prune(2) must leave, by brute force.
q1(q{
	CREATE TABLE expected AS
	SELECT h.occurred_at FROM status_history.history AS h
	 WHERE (SELECT count(*) FROM status_history.history AS k
	         WHERE k.object_id = h.object_id AND k.replica_id IS NOT DISTINCT FROM h.replica_id
	           AND k.occurred_at > h.occurred_at) < 2
	    OR (NOT h.stale AND NOT EXISTS (
	            SELECT FROM status_history.history AS k
	             WHERE k.object_id = h.object_id AND k.replica_id IS NOT DISTINCT FROM h.replica_id
	               AND NOT k.stale AND k.occurred_at > h.occurred_at))
	    OR EXISTS (SELECT FROM status_history.objects AS o
	                WHERE o.object_id = h.object_id AND o.occurred_at = h.occurred_at);
	CREATE TABLE objects_before AS SELECT * FROM status_history.objects;
});
cmp_ok(q1('SELECT count(*) FROM expected'), '<', $rows_before, 'prune(2) has rows to remove');

# The recipe.
my $jobid = q1(q{SELECT cron.schedule('status-history-prune', '* * * * *', 'SELECT status_history.prune(2)')});
like($jobid, qr/^\d+$/, 'the job is scheduled');

# The recipe of docs/REFERENCE.md for leases without the background worker ("Leases: detecting dead
# reporters"), in another database: a reporter that went silent, and
# expire() scheduled there; it runs in the same minute as prune().
q1('CREATE DATABASE leases');
$node->safe_psql('leases', 'CREATE EXTENSION status_history');
$node->safe_psql('leases', q{SELECT count(*) FROM status_history.report('silent', 'running', replica_id => 'r1', lease => '1 second')});
my $expire_job = q1(q{SELECT cron.schedule_in_database('status-history-expire', '* * * * *',
                                                       'SELECT status_history.expire()', 'leases')});
like($expire_job, qr/^\d+$/, 'the expire() job is scheduled');

# pg_cron runs it at the next minute: wait for a finished run (at most 90 s).
my $status = '';
for my $i (1 .. 90)
{
	$status = q1("SELECT string_agg(status, ',') FROM cron.job_run_details"
		  . " WHERE jobid = $jobid AND status IN ('succeeded', 'failed')");
	last if $status ne '';
	sleep 1;
}
is($status, 'succeeded', 'the job ran and succeeded')
  or diag(q1("SELECT string_agg(return_message, '; ') FROM cron.job_run_details WHERE jobid = $jobid"));
is( q1("SELECT command || ' -> ' || return_message FROM cron.job_run_details"
		  . " WHERE jobid = $jobid AND status = 'succeeded' LIMIT 1"),
	'SELECT status_history.prune(2) -> SELECT 1', 'the job ran SELECT status_history.prune(2)');

# The history shrank exactly as promised.
is( q1(q{
		SELECT (SELECT count(*) FROM (SELECT occurred_at FROM status_history.history
		                              EXCEPT SELECT occurred_at FROM expected) AS a)
		     + (SELECT count(*) FROM (SELECT occurred_at FROM expected
		                              EXCEPT SELECT occurred_at FROM status_history.history) AS b)}),
	'0', 'the history is exactly what prune(2) keeps');
is( q1(q{
		SELECT count(*) FROM (
			SELECT object_id, replica_id, count(*) AS n, bool_or(NOT stale) AS live
			  FROM status_history.history GROUP BY object_id, replica_id) AS k
		 WHERE n > 3 OR (n = 3 AND NOT live)}),
	'0', 'per key at most 2 reports, 3 only when the newest non-stale one is further back');
is( q1(q{
		SELECT count(*) FROM (
			SELECT object_id, replica_id FROM status_history.history GROUP BY object_id, replica_id
			HAVING count(*) FILTER (WHERE NOT stale) = 0) AS k}),
	'0', 'every key kept a non-stale report (none was stale throughout)');
is( q1(q{
		SELECT (SELECT count(*) FROM (SELECT * FROM status_history.objects EXCEPT SELECT * FROM objects_before) AS a)
		     + (SELECT count(*) FROM (SELECT * FROM objects_before EXCEPT SELECT * FROM status_history.objects) AS b)
		     + (SELECT count(*) FROM status_history.objects AS o
		         WHERE o.occurred_at IS NOT NULL
		           AND NOT EXISTS (SELECT FROM status_history.history AS h WHERE h.occurred_at = o.occurred_at))}),
	'0', 'the per-object state is unchanged and every current report is still in the history');
is(q1(q{SELECT stale FROM status_history.report('obj-2', 'running', replica_id => 'r1', generation => 1)}),
	't', 'the dropped object stays dropped');

# The expire() job recorded the lapse readers showed.
my $lapse = '';
for my $i (1 .. 90)
{
	$lapse = $node->safe_psql('leases', q{SELECT status FROM status_history.history
	                                       WHERE object_id = 'silent' AND error LIKE 'lease expired: %'});
	last if $lapse ne '';
	sleep 1;
}
is($lapse, 'stalled', 'the scheduled expire() recorded the lapse')
  or diag(q1("SELECT string_agg(return_message, '; ') FROM cron.job_run_details WHERE jobid = $expire_job"));
is($node->safe_psql('leases', q{SELECT status FROM status_history.statuses WHERE object_id = 'silent'}),
	'stalled', 'and the object shows it');

q1(q{SELECT cron.unschedule('status-history-expire')});
q1(q{SELECT cron.unschedule('status-history-prune')});
$node->stop;
done_testing();
