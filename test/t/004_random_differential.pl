# A randomized differential test of the per-object state: random statements
# of many shapes (single and multi-row INSERT, INSERT ... SELECT, COPY, CTEs
# with several INSERTs, INSERTs from triggers on other tables, savepoints,
# exception blocks failing on chosen rows, ON CONFLICT DO NOTHING with an
# extra unique index, an SPI-limited INSERT ... RETURNING from PL/Perl,
# report() and reconnect() inside INSERTs, prepared transactions, explicit
# transactions that commit or roll back) over a handful of objects, and after
# every statement status_history.objects, latest(), the stale flags and the
# rows reconnect() returned are compared with a brute-force answer computed
# from the history and a shadow of the fences (ShRandom.pm has the oracle,
# the generator and the driver).
#
# SH_SEED=n reproduces a run (the seed is printed; the normal run uses a fixed
# one, SH_STRESS=1 a new one each time); SH_EPOCH=e runs only that
# epoch of it.  Sizes: SH_EPOCHS, SH_STATEMENTS (per epoch), SH_MAX_FAILURES
# (each failure ends its epoch; the run goes on with the next one until this
# many); SH_STRESS=1 runs many more statements.  SH_SKIP=shape,shape leaves
# shapes out (to look past a known defect; the names are in ShRandom.pm).
# SH_INSTALL_PATH=dir runs it on another installation (dir has bin/ and lib/,
# e.g. a copy of /usr/lib/postgresql/15 with an older build of the extension).
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes ();
use ShTest;
use ShRandom;

my $stress = $ShTest::STRESS;
# The suite's run replays one seed, so that it gives the same verdict on
# every machine; make stress explores with a new seed every time.
my $seed = $ENV{SH_SEED} // ($stress ? int(Time::HiRes::time() * 1000) % 1_000_000_000 : 20261130);
my $epochs = $ENV{SH_EPOCHS} // ($stress ? 20 : 8);
my $per_epoch = $ENV{SH_STATEMENTS} // ($stress ? 1000 : 350);
my $max_failures = $ENV{SH_MAX_FAILURES} // 3;
my @epochs = defined $ENV{SH_EPOCH} ? ($ENV{SH_EPOCH}) : (1 .. $epochs);
my %skip = map { $_ => 1 } split /,/, $ENV{SH_SKIP} // '';
for my $name (sort keys %skip)
{
	BAIL_OUT("SH_SKIP: no shape $name (shapes: " . join(' ', ShRandom::Gen::shape_names()) . ')')
	  unless grep { $_ eq $name } ShRandom::Gen::shape_names();
}
diag("seed $seed (SH_SEED=$seed reproduces this run): "
	  . scalar(@epochs) . " epochs of $per_epoch statements"
	  . (%skip ? ', without ' . join(', ', sort keys %skip) : ''));

my $t_start = Time::HiRes::time();
my $node = PostgreSQL::Test::Cluster->new('random',
	$ENV{SH_INSTALL_PATH} ? (install_path => $ENV{SH_INSTALL_PATH}) : ());
$node->init;
$node->append_conf('postgresql.conf',
	"max_prepared_transactions = 4\nrestart_after_crash = on\nlog_min_messages = fatal\n");
$node->start;

# Every epoch starts from a copy of this database: the extension, PL/Perl and
# the harness, and an empty history.
$node->safe_psql('postgres', 'CREATE DATABASE sh_template');
$node->safe_psql('sh_template', ShRandom::harness_sql());

my $report_many = $node->safe_psql('sh_template',
	q{SELECT to_regproc('status_history.report_many') IS NOT NULL}) eq 't';
note(sprintf('node and template ready after %.1f s', Time::HiRes::time() - $t_start));

# How does this build treat a reconnect() without an object list?  The
# probes run on an empty database; the oracle follows what they find.
{
	$node->safe_psql('postgres', 'CREATE DATABASE sh_probe TEMPLATE sh_template');
	my $p = ShRandom::Session->new($node, 'sh_probe');
	my $probe = sub {
		my @out;
		for my $sql (@_)
		{
			my $r = $p->run($sql);
			BAIL_OUT("probe failed: $sql: " . ($r->{dead} // '')) if $r->{dead};
			push @out, $r->{sqlstate} eq '00000' ? $r->{out} =~ s/\s+//gr : $r->{sqlstate};
		}
		return @out;
	};
	my (undef, undef, $all_stale, $new_fence) = $probe->(
		'BEGIN;', 'SELECT count(*) FROM status_history.reconnect(3);',
		q{SELECT stale FROM status_history.report('p1', 'running', generation => 1);},
		q{SELECT fence FROM status_history.objects WHERE object_id = 'p1';}, 'ROLLBACK;');
	my (undef, undef, $replica_stale) = $probe->(
		'BEGIN;', q{SELECT count(*) FROM status_history.reconnect(3, 'rp');},
		q{SELECT stale FROM status_history.report('p2', 'running', replica_id => 'rp', generation => 1);},
		'ROLLBACK;');
	my (undef, $blocks) = $probe->(
		'SELECT count(*) FROM status_history.reconnect(3);',
		'SELECT count(*) FROM status_history.reconnect(2);');
	$p->quit;
	my %settings = (
		floor_all_stale => $all_stale eq 't',
		floor_new_fence => $new_fence eq '3',
		floor_replica_stale => $replica_stale eq 't',
		floor_blocks => $blocks eq '55000');
	my $set = join(', ', map { "$_ = " . ($settings{$_} ? 'true' : 'false') } sort keys %settings);
	diag("this build, for a reconnect() without a list: $set");
	$node->safe_psql('sh_template', "UPDATE sh.settings SET $set");
}

# ---------------------------------------------------------------------------
# Every check can fail: corrupt the state (or the shadow) in ways the
# extension never should, and each must be reported.
# ---------------------------------------------------------------------------
$node->safe_psql('postgres', 'CREATE DATABASE sh_selftest TEMPLATE sh_template');
{
	my $s = ShRandom::Session->new($node, 'sh_selftest');
	my @setup = (
		q{SELECT status_history.report('a', 'running', replica_id => 'r1', generation => 1);},
		q{SELECT status_history.report('a', 'stalled', replica_id => 'r2', generation => 1);},
		q{SELECT status_history.report('b', 'running');},
		q{SELECT status_history.report('b', 'running', error => 'e');},
		q{SELECT status_history.report('c', 'running');},
		q{SELECT status_history.report('c', 'dropped');},
		q{SELECT count(*) FROM sh.reconnect(2, NULL, ARRAY['a']);});
	for my $sql (@setup)
	{
		my $r = $s->run($sql);
		BAIL_OUT("self-test setup failed: $sql: " . ($r->{dead} // $r->{err})) if ($r->{sqlstate} // '') ne '00000';
	}
	my $clean = ShRandom::check($s, '-infinity');
	is(join("\n", @{ $clean->{diffs} // [ $clean->{error} // $clean->{dead} ] }), '',
		'self-test: the oracle agrees with the extension on a small history');

	# (history_fold would refuse such a row: 27000, checked in sql/write_path.sql.)
	my $disable = 'ALTER TABLE status_history.history DISABLE TRIGGER history_insert;'
	  . ' ALTER TABLE status_history.history DISABLE TRIGGER history_fold;';
	my $row = "INSERT INTO status_history.history (occurred_at, object_id, status, generation, stale)"
	  . " VALUES (status_history.monotonic_now(), ";
	my @cases = (
		# [ what, corruption, pattern in the differences or in the failure ]
		(map { [ "objects.$_->[0]", "UPDATE status_history.objects SET $_->[0] = $_->[1] WHERE object_id = 'b';",
				qr/^objects\[b\]: $_->[0] / ] }
		  ([ 'occurred_at', "occurred_at + interval '1 second'" ], [ 'status', "'paused'" ],
			[ 'error', "'x'" ], [ 'details', q{'{"x": 1}'} ], [ 'replica_id', "'rx'" ],
			[ 'generation', 'generation + 1' ], [ 'reported_at', 'now()' ],
			[ 'status_since', "status_since - interval '1 second'" ], [ 'fence', 'fence + 1' ])),
		[ 'latest()', "UPDATE status_history.objects SET status = 'paused' WHERE object_id = 'b';",
			qr/^latest\(\): returns \(b, paused/ ],
		[ 'a missing objects row', "DELETE FROM status_history.objects WHERE object_id = 'b';",
			qr/^objects: no row for b/ ],
		[ 'an objects row of no object', "INSERT INTO status_history.objects (object_id, occurred_at, status) VALUES ('ghost', now(), 'running');",
			qr/^objects: row for unknown object ghost/ ],
		[ 'stale flag below the fence', [ $disable, "${row}'a', 'running', 1, false);" ],
			qr/^history row \(a, running.*stale = f, expected t \(fence and floors in force 2,/ ],
		[ 'stale flag after dropped', [ $disable, "${row}'c', 'running', 0, false);" ],
			qr/^history row \(c, running.*stale = f, expected t \(.*after dropped t/ ],
		[ 'stale flag set without cause', [ $disable, "${row}'b', 'running', 0, true);" ],
			qr/^history row \(b, running.*stale = t, expected f/ ],
		[ 'reconnect() rows in the history',
			q{INSERT INTO sh.restamps SELECT jsonb_populate_record(NULL::status_history.history, '{"occurred_at": "2000-01-01", "object_id": "a", "status": "running", "generation": 2, "stale": false}');},
			qr/^reconnect\(\) returned \(a, running.*not in the history/ ],
		[ 'reconnect() succeeding above the shadow fence',
			[ q{INSERT INTO sh.fence_log VALUES ('a', NULL, 9, '-infinity');},
				q{SELECT count(*) FROM sh.reconnect(3, NULL, ARRAY['a']);} ],
			qr/wrapper found a disagreement \(SHF01\)/ ],
		[ 'reconnect() re-stamping another report',
			[ q{UPDATE status_history.objects SET status = 'paused' WHERE object_id = 'b';},
				q{SELECT count(*) FROM sh.reconnect(3, NULL, ARRAY['b']);} ],
			qr/wrapper found a disagreement \(SHF02\)/ ],
		[ 'reconnect() failing below the shadow fence',
			[ q{UPDATE status_history.objects SET fence = 9 WHERE object_id = 'a';},
				q{SELECT count(*) FROM sh.reconnect(3, NULL, ARRAY['a']);} ],
			qr/failed with 55000, but the shadow fences \(and floor\)/ ],
		[ 'a controller failing below the shadow fence',
			[ q{UPDATE status_history.objects SET fence = 9 WHERE object_id = 'a';},
				q{SELECT sh.try_reconnect(3, NULL, ARRAY['a']);} ],
			qr/wrapper found a disagreement \(SHF04\)/ ],
		[ 'an unexpected error class', 'SELECT 1 / 0;', qr/unexpected error class 22012/ ],
	);
	for my $case (@cases)
	{
		my ($what, $sqls, $pattern) = @$case;
		$s->run('BEGIN;');
		my @found;
		for my $sql (ref $sqls ? @$sqls : ($sqls))
		{
			my $r = $s->run($sql);
			my $why = ShRandom::classify($r);
			push @found, $why if defined $why;
		}
		my $c = ShRandom::check($s, '-infinity');
		push @found, @{ $c->{diffs} // [] };
		$s->run('ROLLBACK;');
		ok((grep { $_ =~ $pattern } @found), "self-test: the check of $what can fail")
		  or diag("found:\n" . join("\n", @found));
	}
	$clean = ShRandom::check($s, '-infinity');
	is(join("\n", @{ $clean->{diffs} // [ $clean->{error} // $clean->{dead} ] }), '',
		'self-test: and agrees again after the corruptions rolled back');
	$s->quit;
}

note(sprintf('self-test done after %.1f s', Time::HiRes::time() - $t_start));

# ---------------------------------------------------------------------------
# The random run: epochs of statements, each epoch on a fresh copy of the
# template (the history stays small, so the oracle stays fast, and objects
# start fresh).
# ---------------------------------------------------------------------------
sub indent { my ($text) = @_; return join('', map { "    $_\n" } split /\n/, $text); }

# What a failure message says to run again: everything that steers the generator.
my $reproduce = join(' ', "SH_SEED=$seed",
	map { $ENV{$_} ? "$_=$ENV{$_}" : () } qw(SH_STATEMENTS SH_SKIP SH_STRESS SH_INSTALL_PATH));
my (@failures, %kinds, %states);
my ($statements, $checks, $since_restart, $run_time, $check_time) = (0, 0, 0, 0, 0);
my $started = Time::HiRes::time();
for my $epoch (@epochs)
{
	last if @failures >= $max_failures;
	# Each database takes one of the clock's 64 shared-memory slots until restart.
	if (++$since_restart > 50)
	{
		$node->restart;
		$since_restart = 1;
	}
	srand($seed * 1000 + $epoch);
	my $unique = rand() < 0.5;
	my $db = "sh_e$epoch";
	$node->safe_psql('postgres', "CREATE DATABASE $db TEMPLATE sh_template");
	$node->safe_psql($db,
		'CREATE UNIQUE INDEX history_idempotency ON status_history.history (object_id, reported_at)')
	  if $unique;
	my $gen = ShRandom::Gen->new(len => $per_epoch, unique_index => $unique, skip => \%skip,
		report_many => $report_many, prefix => "sh_e${epoch}_");
	my $session = ShRandom::Session->new($node, $db);
	my $other = ShRandom::Session->new($node, $db);
	my ($wm, $n, $failed, @log, @tx) = ('-infinity', 0, 0);
	while (1)
	{
		$gen->{closing} = 1 if $n >= $per_epoch;
		my $was_in_tx = $gen->in_transaction;
		my $st = $gen->next_statement;
		last unless $st;
		$n++;
		my $t0 = Time::HiRes::time();
		my $r = ($st->{other} ? $other : $session)->run($st->{sql});
		my $t1 = Time::HiRes::time();
		$run_time += $t1 - $t0;
		my $state = $r->{sqlstate} // 'none';
		$gen->result($st, $state);
		$kinds{ $st->{kind} }++;
		$states{$state}++;
		push @log, "-- $n ($st->{kind}" . ($st->{other} ? ', second session' : '') . "): $state\n$st->{sql}";
		@tx = () if ($st->{ctl} // '') eq 'begin' || !$was_in_tx;
		push @tx, "$st->{sql}  -- $state";

		my $why = ShRandom::classify($r, $st);
		my @diffs;
		if (!defined $why)
		{
			my $c = ShRandom::check($session, $wm);
			$check_time += Time::HiRes::time() - $t1;
			$checks++ unless $c->{skipped};
			if ($c->{dead}) { $why = "the session died during the check: $c->{dead}"; }
			elsif ($c->{error}) { $why = $c->{error}; }
			elsif (!$c->{skipped} && @{ $c->{diffs} })
			{
				$why = 'the per-object state disagrees with the history';
				@diffs = @{ $c->{diffs} };
			}
			elsif (!$c->{skipped} && !$gen->in_transaction)
			{
				$wm = $c->{wm};
			}
		}
		next unless defined $why;

		my $err = join("\n", grep { !/^LOCATION:/ } split /\n/, $r->{err} // '');
		my $msg = "seed $seed, epoch $epoch (database $db, "
		  . ($unique ? 'with' : 'without') . " the unique index), statement $n ($st->{kind}"
		  . ($st->{other} ? ', in the second session' : '') . "):\n"
		  . indent($st->{sql});
		$msg .= "in the transaction (or prepared transaction) that ran:\n" . indent(join("\n", @tx[ 0 .. $#tx - 1 ]))
		  if @tx > 1;
		$msg .= "SQLSTATE $state" . ($err ne '' ? ":\n" . indent($err) : "\n");
		$msg .= "problem: $why\n";
		$msg .= "differences:\n" . indent(join("\n", @diffs)) if @diffs;
		$msg .= "reproduce: $reproduce SH_EPOCH=$epoch test/tap.sh test/t/004_random_differential.pl\n";
		my $file = "$PostgreSQL::Test::Utils::log_path/004_seed${seed}_epoch$epoch.sql";
		if (open my $fh, '>', $file)
		{
			print $fh join("\n", @log), "\n";
			close $fh;
			$msg .= "statements of the epoch: $file\n";
		}
		push @failures, $msg;
		$failed = 1;
		last;
	}
	$statements += $n;
	$session->quit;
	$other->quit;
	ok(!$failed, "epoch $epoch: $n statements, the state agreed with the history after each")
	  or diag($failures[-1]);
	# After a crash, wait for the server to be back.  A failed epoch may
	# leave a prepared transaction: end it (it holds locks and a slot), and
	# keep the database to look at.
	$node->poll_query_until('postgres', 'SELECT 1', '1');
	if ($failed)
	{
		$node->safe_psql($db, "ROLLBACK PREPARED '$_'")
		  for split /\n/, $node->safe_psql($db,
			'SELECT gid FROM pg_prepared_xacts WHERE database = current_database()');
	}
	else
	{
		$node->safe_psql('postgres', "DROP DATABASE $db");
	}
}

my $elapsed = Time::HiRes::time() - $started;
note("statements by shape:\n" . join('', map { sprintf("  %-36s %6d\n", $_, $kinds{$_}) } sort keys %kinds));
diag(sprintf('%d statements (%.0f s), %d checks (%.0f s), in %.0f s; outcomes: %s',
	$statements, $run_time, $checks, $check_time, $elapsed,
	join(', ', map { "$_ x$states{$_}" } sort { $states{$b} <=> $states{$a} } keys %states)));
is(scalar(@failures), 0, 'no statement made the state disagree with the history')
  or diag(scalar(@failures) . " failure(s); seed $seed");

$node->stop;
done_testing();
