-- Leases: a report that holds for a while only unless its key reports again.
-- Readers show a lapse as stalled at once; expire() records it.  Stamps are
-- compared, never printed.  A lease of one microsecond has run out by the
-- next statement (each statement here is its own transaction, whose now()
-- is later), one of an hour never runs out during the test.
CREATE EXTENSION status_history;
\i sql/oracle.psql

-- Bad leases: each refused with 22023 (or 22008 past the last timestamp).
\set VERBOSITY sqlstate
SELECT status_history.report('bad', 'running', lease => '-1 second');
SELECT status_history.report('bad', 'running', lease => '0');
SELECT status_history.report('bad', 'running', lease => '1 month');
SELECT status_history.report('bad', 'running', lease => '1 day -25 hours');
SELECT status_history.report('bad', 'dropped', lease => '1 hour');
SELECT status_history.report('bad', 'running', lease => '2562000000 hours');
SELECT status_history.report('bad', 'running', lease => '106751992 days');
INSERT INTO status_history.history (object_id, status, lease) VALUES ('bad', 'running', '-1 hour');
SELECT count(*) FROM status_history.report_many(ARRAY['bad'], ARRAY['running'], leases => ARRAY['0'::interval]);
SELECT count(*) FROM status_history.report_many(ARRAY['bad'], ARRAY['running'], leases => ARRAY['1 hour'::interval, NULL]);
\set VERBOSITY default
SELECT status_history.report('bad', 'running', lease => '-1 second');
SELECT status_history.report('bad', 'running', lease => '2 months');
SELECT count(*) AS nothing_recorded FROM status_history.history;

-- A day is 24 hours, stored so (every session computes the same expiry).
SELECT lease, lease = '26 hours' AS day_is_24_hours
  FROM status_history.report('d', 'running', lease => '1 day 2 hours');

-- A lease counts from the stamp (the database clock), not from reported_at
-- -- or from the time of day, when that is earlier: after an import stamped
-- ahead (history.sql imports one 10 hours ahead), stamps run ahead of the
-- time of day, and readers compare with now().  t0 and t1 bound the time
-- of day of each report below.
SELECT clock_timestamp() AS t0 \gset
SELECT occurred_at AS d2_at FROM status_history.report('d2', 'running', lease => '1 hour',
       reported_at => '2001-01-01 00:00:00+00') \gset
SELECT clock_timestamp() AS t1 \gset
SELECT expires_at - interval '1 hour' BETWEEN least(:'d2_at'::timestamptz, :'t0') AND least(:'d2_at'::timestamptz, :'t1')
       AS from_the_stamp
  FROM status_history.statuses WHERE object_id = 'd2';

-- Readers see a lapse at once.
SELECT clock_timestamp() AS t0 \gset
SELECT occurred_at AS a_at FROM status_history.report('a', 'running', replica_id => 'r1',
       details => '{"x": 1}', lease => '1 microsecond') \gset
SELECT clock_timestamp() AS t1 \gset
SELECT pg_sleep(0.01);
SELECT expires_at AS a_expires FROM status_history.statuses WHERE object_id = 'a' \gset
SELECT status, error LIKE 'lease expired: no report from replica r1 since %+00' AS lapse_error,
       error = status_history.lapse_error('r1', expires_at - interval '1 microsecond') AS since_the_report,
       details IS NULL AS no_details, occurred_at = :'a_at'::timestamptz AS its_report,
       status_since = expires_at AS stalled_since_it_ran_out, reported_at = expires_at AS reported_then,
       expires_at - interval '1 microsecond' BETWEEN least(:'a_at'::timestamptz, :'t0') AND least(:'a_at'::timestamptz, :'t1')
         AS expires_at
  FROM status_history.statuses WHERE object_id = 'a';
SELECT status, error = (SELECT error FROM status_history.statuses WHERE object_id = 'a') AS same_error,
       lease IS NULL AS no_lease, stale
  FROM status_history.latest(ARRAY['a']);
SELECT status, status_since = expires_at AS since_it_ran_out
  FROM status_history.replica_statuses WHERE object_id = 'a';
SELECT status FROM status_history.statuses_by_precedence WHERE object_id = 'a';
SELECT status, lease IS NULL AS no_lease FROM status_history.latest_by_precedence(ARRAY['a']);
-- The error is the same text whatever the session's time zone.
SET TimeZone = 'Asia/Kolkata';
SELECT error = status_history.lapse_error('r1', :'a_expires'::timestamptz - interval '1 microsecond') AS same_text,
       error LIKE '% since ' || to_char((:'a_expires'::timestamptz - interval '1 microsecond') AT TIME ZONE 'UTC',
                                        'YYYY-MM-DD HH24:MI:SS.US') || '+00' AS in_utc
  FROM status_history.statuses WHERE object_id = 'a';
RESET TimeZone;
-- Without a lease, nothing lapses; an hour's lease has not run out.
SELECT object_id, status, expires_at IS NULL AS no_lease
  FROM status_history.statuses WHERE object_id IN ('d', 'd2') ORDER BY object_id;

-- A repeat (heartbeat) renews the lease and appends nothing.
SELECT occurred_at AS h_at FROM status_history.report('h', 'running', replica_id => 'r1', lease => '1 hour') \gset
SELECT clock_timestamp() AS t0 \gset
SELECT occurred_at = :'h_at'::timestamptz AS repeat_returns_the_row
  FROM status_history.report('h', 'running', replica_id => 'r1', lease => '1 hour');
SELECT clock_timestamp() AS t1 \gset
SELECT count(*) AS rows_of_h FROM status_history.history WHERE object_id = 'h';
SELECT k.expires_at - interval '1 hour' BETWEEN least(k.last_seen_at, :'t0') AND least(k.last_seen_at, :'t1')
         AS renewed_from_the_repeat,
       k.last_seen_at > :'h_at'::timestamptz AS seen_later,
       o.expires_at = k.expires_at AS object_too
  FROM status_history.replica_state AS k JOIN status_history.objects AS o USING (object_id)
 WHERE k.object_id = 'h';
-- A lapsed report's repeat renews it too (and it runs out again at once).
SELECT occurred_at = :'a_at'::timestamptz AS repeated
  FROM status_history.report('a', 'running', replica_id => 'r1', details => '{"x": 1}',
                             lease => '1 microsecond');
SELECT expires_at > :'a_expires'::timestamptz AS renewed
  FROM status_history.statuses WHERE object_id = 'a';
-- A restarted reporter's next report is current: running again.
SELECT status FROM status_history.report('a', 'running', replica_id => 'r1', lease => '1 hour');
SELECT status, expires_at > now() AS holds FROM status_history.statuses WHERE object_id = 'a';
SELECT count(*) AS a_rows FROM status_history.history WHERE object_id = 'a';
-- Another lease is another report (a row), as another error would be.
SELECT occurred_at > :'h_at'::timestamptz AS appended
  FROM status_history.report('h', 'running', replica_id => 'r1', lease => '2 hours');
SELECT lease AS lease_now, expires_at > now() + '1 hour 59 minutes' AS two_hours
  FROM status_history.objects WHERE object_id = 'h';
-- A report without a lease ends it.
SELECT count(*) FROM status_history.report('h', 'stalled', replica_id => 'r1');
SELECT expires_at IS NULL AS no_lease FROM status_history.statuses WHERE object_id = 'h';

-- A fence: reconnect()'s copy carries the lease on as it was (a copy is no
-- sighting of the reporter); the superseded writer's reports are stale and
-- renew nothing, before or after the lapse.
SELECT count(*) FROM status_history.report('f', 'running', replica_id => 'r1', lease => '1 second');
SELECT expires_at AS f_expires FROM status_history.statuses WHERE object_id = 'f' \gset
SELECT status, generation, lease FROM status_history.reconnect(3, object_ids => ARRAY['f']);
SELECT expires_at = :'f_expires'::timestamptz AS not_renewed_by_the_copy
  FROM status_history.statuses WHERE object_id = 'f';
SELECT stale FROM status_history.report('f', 'running', replica_id => 'r1', lease => '1 hour');
SELECT expires_at = :'f_expires'::timestamptz AS not_renewed_by_a_stale_report
  FROM status_history.statuses WHERE object_id = 'f';
SELECT pg_sleep(1.05);
SELECT status, generation FROM status_history.statuses WHERE object_id = 'f';
SELECT stale FROM status_history.report('f', 'running', replica_id => 'r1', lease => '1 hour');
SELECT status FROM status_history.statuses WHERE object_id = 'f';

-- Precedence: a lapsed key counts as stalled, so a dead replica's leftover
-- running no longer outranks a live replica's stalled.
SELECT count(*) FROM status_history.report('p', 'running', replica_id => 'dead', lease => '1 microsecond');
SELECT count(*) FROM status_history.report('p', 'stalled', replica_id => 'live', error => 'disk full');
SELECT pg_sleep(0.01);
SELECT replica_id, status, error FROM status_history.statuses_by_precedence WHERE object_id = 'p';
SELECT replica_id, status, error FROM status_history.latest_by_precedence(ARRAY['p']);
SELECT replica_id, status FROM status_history.replica_statuses WHERE object_id = 'p' ORDER BY replica_id;
SELECT state_mismatches() AS before_expire;

-- expire() records the lapse readers show, once, for each object whose
-- current report's lease ran out: here f.  (p's dead replica is not p's
-- current report: its lapse stays one that readers derive.)
SELECT object_id, status, error LIKE 'lease expired: no report from replica r1 since %' AS lapse
  FROM status_history.statuses WHERE expires_at <= now() ORDER BY object_id;
CREATE TEMP TABLE shown AS
    SELECT object_id, status, error, details, replica_id, generation, reported_at
      FROM status_history.statuses;
SELECT status_history.expire() AS recorded;
SELECT status_history.expire() AS recorded_again;
SELECT object_id, status, error LIKE 'lease expired: %' AS lapse, replica_id, generation,
       lease IS NULL AS no_lease, stale
  FROM status_history.history
 WHERE occurred_at > :'f_expires'::timestamptz AND error LIKE 'lease expired: %'
 ORDER BY occurred_at;
-- What readers show did not change when the lapse was recorded.
SELECT count(*) AS changed
  FROM (SELECT object_id, status, error, details, replica_id, generation, reported_at
          FROM status_history.statuses
        EXCEPT
        SELECT * FROM shown) AS c;
SELECT expires_at IS NULL AS no_lease_now FROM status_history.statuses WHERE object_id = 'f';
SELECT replica_id, status FROM status_history.replica_statuses WHERE object_id = 'p' ORDER BY replica_id;
SELECT state_mismatches() AS after_expire;

-- Coming back: the next report of the key becomes current as usual.
SELECT status, stale FROM status_history.report('f', 'running', replica_id => 'r1', generation => 3,
                                                lease => '1 hour');
SELECT status FROM status_history.statuses WHERE object_id = 'f';

-- Two replicas that say the same: the newest one's report is current, and
-- the other's heartbeat (a repeat of it) holds the object too.
SELECT count(*) FROM status_history.report('two', 'running', replica_id => 'r1', lease => '1 hour');
SELECT count(*) FROM status_history.report('two', 'running', replica_id => 'r2', lease => '1 hour');
SELECT pg_sleep(0.01);
SELECT count(*) FROM status_history.report('two', 'running', replica_id => 'r1', lease => '1 hour');
SELECT count(*) AS rows_of_two FROM status_history.history WHERE object_id = 'two';
SELECT o.replica_id AS current_from, o.expires_at = k1.expires_at AS held_by_r1, o.expires_at > k2.expires_at AS past_r2s
  FROM status_history.objects AS o
  JOIN status_history.replica_state AS k1 ON k1.object_id = o.object_id AND k1.replica_id = 'r1'
  JOIN status_history.replica_state AS k2 ON k2.object_id = o.object_id AND k2.replica_id = 'r2'
 WHERE o.object_id = 'two';

-- expire() called from inside a statement whose earlier row reported on a
-- lapsed object (stored, not folded yet): that report renewed the lease,
-- so no lapse is recorded over it.
SELECT count(*) FROM status_history.report('n', 'running', replica_id => 'r1', lease => '1 microsecond');
SELECT pg_sleep(0.01);
INSERT INTO status_history.history (object_id, status, replica_id, lease)
VALUES ('n', 'paused', 'r1', '1 hour'), ('n-' || status_history.expire(), 'running', NULL, NULL);
SELECT string_agg(status || coalesce(' ' || lease, ''), ', ' ORDER BY occurred_at) AS n_history
  FROM status_history.history WHERE object_id = 'n';
SELECT status, expires_at > now() AS holds FROM status_history.statuses WHERE object_id = 'n';

-- reconnect() re-stamps what readers show: a lapsed report's lapse.
SELECT count(*) FROM status_history.report('rc', 'running', replica_id => 'r1', lease => '1 microsecond');
SELECT pg_sleep(0.01);
SELECT status, error LIKE 'lease expired: no report from replica r1 since %' AS lapse, lease IS NULL AS no_lease
  FROM status_history.reconnect(4, object_ids => ARRAY['rc']);
SELECT status, expires_at IS NULL AS no_lease FROM status_history.statuses WHERE object_id = 'rc';

-- report_many() takes leases too.
SELECT object_id, lease FROM status_history.report_many(ARRAY['m1', 'm2'], ARRAY['running', 'running'],
                                                        leases => ARRAY['1 hour', NULL]::interval[]);

-- expire() is for controllers and admins: not executable by PUBLIC.
CREATE ROLE sh_lease_nobody;
SET ROLE sh_lease_nobody;
\set VERBOSITY sqlstate
SELECT status_history.expire();
\set VERBOSITY default
RESET ROLE;
DROP ROLE sh_lease_nobody;

-- A random workload: leases of none, a microsecond or an hour, repeats,
-- fences and retirements; the kept state, latest() and the views equal brute
-- force over the history after each round.
CREATE FUNCTION lease_workload(n integer, top bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    st text;
BEGIN
    FOR i IN 1..n LOOP
        IF random() < 0.04 THEN
            top := top + 1;
            PERFORM count(*) FROM status_history.reconnect(top,
                (ARRAY['w0', 'w1'])[1 + floor(random() * 2)::int],   -- (w2 is retired later)
                ARRAY['l' || floor(random() * 10)::int]);
        ELSIF random() < 0.03 THEN
            PERFORM status_history.expire();
        ELSE
            st := (ARRAY['starting', 'running', 'running', 'stalled', 'paused'])[1 + floor(random() * 5)::int];
            PERFORM status_history.report('l' || floor(random() * 10)::int, st,
                replica_id => (ARRAY['w0', 'w1', 'w2', NULL])[1 + floor(random() * 4)::int],
                generation => top - floor(random() * 2)::int,
                lease => (ARRAY[NULL, '1 microsecond', '1 hour'])[1 + floor(random() * 3)::int]::interval);
        END IF;
    END LOOP;
END $$;
CREATE FUNCTION lease_mismatches() RETURNS TABLE (state bigint, view_vs_latest bigint, lapsed bigint)
LANGUAGE sql AS $$
    SELECT state_mismatches(),
           (SELECT count(*) FROM (
               (SELECT object_id, status, error, details, replica_id, generation, occurred_at, reported_at
                  FROM status_history.statuses
                EXCEPT
                SELECT object_id, status, error, details, replica_id, generation, occurred_at, reported_at
                  FROM status_history.latest())
               UNION ALL
               (SELECT object_id, status, error, details, replica_id, generation, occurred_at, reported_at
                  FROM status_history.latest()
                EXCEPT
                SELECT object_id, status, error, details, replica_id, generation, occurred_at, reported_at
                  FROM status_history.statuses)) AS d),
           (SELECT count(*) FROM status_history.statuses WHERE expires_at <= now())
$$;
SELECT setseed(0.19);
SELECT lease_workload(300, 5);
SELECT pg_sleep(0.01);
SELECT state, view_vs_latest, lapsed > 0 AS some_lapsed FROM lease_mismatches();
-- In batches: at most max_objects a call (the worker records 1000 a transaction).
SELECT status_history.expire(1) AS one_at_most;
\set VERBOSITY sqlstate
SELECT status_history.expire(0);
\set VERBOSITY default
SELECT status_history.expire() > 0 AS recorded_some;
SELECT state, view_vs_latest, lapsed FROM lease_mismatches();
-- A replica retired between the rounds: its leased reports are replaced
-- (carrying their leases on), its later ones stale.
SELECT status_history.retire_replica('w2') >= 0 AS retired;
SELECT state, view_vs_latest FROM lease_mismatches();
SELECT lease_workload(300, 20);
SELECT pg_sleep(0.01);
SELECT state, view_vs_latest FROM lease_mismatches();
SELECT count(*) > 0 AS has_lapses FROM status_history.history WHERE error LIKE 'lease expired: %';

DROP EXTENSION status_history;
