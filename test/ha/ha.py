#!/usr/bin/python3
"""status_history under pg_auto_failover: the test driver (run by test/ha/run.sh).

A monitor and two data nodes on 127.0.0.1, made and run by pg_autoctl as the
user running this (postgres) in the scratch directory $HA_SCRATCH.  Reporters
and a controller (client.py) load the primary through a multi-host connection
string; the primary node dies (kill -9) twice; after each failover, and after
each rejoin, every guarantee is checked against what the clients logged as
acknowledged.  Prints "N passed, M failed" last; exits 1 if anything failed.

HA_SYNC=0 runs the same with asynchronous replication (both nodes created
with --replication-quorum false, so synchronous_standby_names stays ''), to
show what the checks catch then.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psycopg

SCRATCH = os.environ['HA_SCRATCH']
SYNC = os.environ.get('HA_SYNC', '1') != '0'
REPORTERS = int(os.environ.get('HA_REPORTERS', '3'))
OBJECTS = int(os.environ.get('HA_OBJECTS', '200'))
# Preloading the library (optional for the extension) loads it once per
# postmaster, so a `make install` elsewhere during the run cannot mix two
# builds in one server.  HA_PRELOAD=0 loads it on first use instead.
PRELOAD = os.environ.get('HA_PRELOAD', '1') != '0'
# HA_IMPORT=0: no import of a row stamped an hour ahead before the first kill
# (the clock then runs at wall time, and lost stamps are not reused in practice).
IMPORT = os.environ.get('HA_IMPORT', '1') != '0'
BIN = '/usr/lib/postgresql/15/bin'
ENV = {
    'PATH': f'{BIN}:/usr/bin:/bin',
    'HOME': SCRATCH,
    'XDG_CONFIG_HOME': f'{SCRATCH}/config',
    'XDG_DATA_HOME': f'{SCRATCH}/share',
    'XDG_RUNTIME_DIR': f'{SCRATCH}/run',
    'LANG': 'C.UTF-8',
}
STAMP_US = "(extract(epoch FROM {}) * 1000000)::bigint"
T0 = time.time()


def say(msg):
    print(f'[{time.time() - T0:6.1f}s] {msg}', flush=True)


# ---------------------------------------------------------------- checks

class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.failures = []

    def ok(self, cond, label, detail=''):
        if cond:
            self.passed += 1
            print(f'ok {self.passed + self.failed} - {label}' + (f'  ({detail})' if detail else ''), flush=True)
        else:
            self.failed += 1
            self.failures.append(label)
            print(f'not ok {self.passed + self.failed} - {label}' + (f'  ({detail})' if detail else ''), flush=True)
        return cond


CHECKS = Checks()


# ---------------------------------------------------------------- cluster

def free_ports(n):
    """n ports free on 127.0.0.1, below the ephemeral range (a killed node's
    port must not be taken by a client's outgoing connection meanwhile)."""
    import random
    ports = []
    while len(ports) < n:
        p = random.randint(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(('127.0.0.1', p))
            except OSError:
                continue
        if p not in ports:
            ports.append(p)
    return ports


def autoctl(*args, check=True):
    with open(f'{SCRATCH}/autoctl.log', 'a') as log:
        log.write(f'\n$ pg_autoctl {" ".join(args)}\n')
        log.flush()
        r = subprocess.run(['pg_autoctl', *args], env=ENV, stdout=subprocess.PIPE,
                           stderr=log, text=True, timeout=120)
        log.write(r.stdout)
    if check and r.returncode != 0:
        raise RuntimeError(f'pg_autoctl {" ".join(args)} failed ({r.returncode}); see {SCRATCH}/autoctl.log')
    return r.stdout


def dsn(port, db='postgres'):
    return (f"host=127.0.0.1 port={port} dbname={db} user=postgres connect_timeout=3 "
            "options='-c TimeZone=UTC'")


def connect(port, db='postgres', autocommit=True):
    return psycopg.connect(dsn(port, db), autocommit=autocommit)


def one(port, query, params=None, db='postgres'):
    with connect(port, db) as c:
        return c.execute(query, params).fetchone()[0]


class Node:
    def __init__(self, name, port):
        self.name = name
        self.port = port
        self.pgdata = f'{SCRATCH}/{name}'
        self.proc = None

    def start(self):
        """pg_autoctl run, in its own process group (the postmaster joins it)."""
        log = open(f'{SCRATCH}/{self.name}.log', 'a')
        self.proc = subprocess.Popen(['pg_autoctl', 'run', '--pgdata', self.pgdata], env=ENV,
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def postmaster_pid(self):
        try:
            with open(f'{self.pgdata}/postmaster.pid') as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def kill9(self, extra=()):
        """The node dies: SIGKILL to its pg_autoctl processes and its postmaster
        at once (and to extra pids of the node, e.g. a stopped walsender).  The
        postmaster's children exit by themselves when they see it gone."""
        pm = self.postmaster_pid()
        pids = [p for p in [pm, *extra] if p]
        os.killpg(self.proc.pid, signal.SIGKILL)
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        t = time.time()
        self.proc.wait()
        return t, pm

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # pg_autoctl stops Postgres (fast)
                self.proc.wait(timeout=20)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        pm = self.postmaster_pid()
        try:
            if pm and self.pgdata in open(f'/proc/{pm}/cmdline').read():
                os.kill(pm, signal.SIGQUIT)  # left without its pg_autoctl: immediate shutdown
        except OSError:
            pass


def append_conf(node, lines):
    with open(f'{node.pgdata}/postgresql.conf', 'a') as f:
        f.write('\n# status_history HA test (after the include, so it wins)\n')
        f.write(''.join(l + '\n' for l in lines))


def keeper_timeouts(node):
    # Fail over in seconds, not tens of seconds.  A primary that can reach
    # neither the monitor nor its standby for network_partition_timeout
    # demotes itself; the monitor's primary_demote_timeout (4s) is longer, so
    # such a primary has stopped taking writes before the standby takes any.
    for k, v in [('network_partition_timeout', '2'), ('prepare_promotion_walreceiver', '1'),
                 ('prepare_promotion_catchup', '5'), ('postgresql_restart_failure_timeout', '5')]:
        autoctl('config', 'set', '--pgdata', node.pgdata, f'timeout.{k}', v)


def monitor_states(monitor):
    with connect(monitor.port, 'pg_auto_failover') as c:
        return {r[0]: (r[1], r[2]) for r in c.execute(
            'SELECT nodename, reportedstate::text, goalstate::text FROM pgautofailover.node')}


def wait_states(monitor, want, timeout=90):
    deadline = time.time() + timeout
    seen = None
    while time.time() < deadline:
        try:
            seen = monitor_states(monitor)
            if all(seen.get(n) == (s, s) for n, s in want.items()):
                return True
        except psycopg.Error:
            pass
        time.sleep(0.3)
    say(f'states not reached: wanted {want}, monitor has {seen}')
    return False


def wait_ready(port, timeout=60, writable=False):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if not writable or one(port, 'SELECT NOT pg_is_in_recovery()') is True:
                one(port, 'SELECT 1')
                return True
        except psycopg.Error:
            pass
        time.sleep(0.2)
    raise RuntimeError(f'the server on port {port} did not come up')


def show_state(monitor):
    print(autoctl('show', 'state', '--pgdata', monitor.pgdata, check=False).rstrip(), flush=True)


# ---------------------------------------------------------------- clients

class Logs:
    """Incremental reader of the clients' logs."""

    def __init__(self):
        self.offsets = {}
        # (client, seq, t_send, t_ack, port, stamp, obj, status, gen, stale, warned, replica, seen):
        # stamp is the returned row's; seen the key's last_seen_at after the
        # report, = stamp when it appended that row, later when it was a repeat.
        self.acks = []
        self.fences = []      # (client, seq, t_send, t_ack, port, generation, rows)
        self.restamps = []    # (generation, obj, stamp)
        self.doubts = 0
        self.errors = []

    def read(self):
        for fn in sorted(os.listdir(f'{SCRATCH}/clients')):
            if not fn.endswith('.log'):
                continue
            client = fn[:-4]
            path = f'{SCRATCH}/clients/{fn}'
            with open(path, 'rb') as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b'\n') + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].decode().splitlines():
                x = line.split('\t')
                if x[0] == 'ack':
                    self.acks.append((client, int(x[1]), float(x[2]), float(x[3]), int(x[4]), int(x[5]),
                                      x[6], x[7], int(x[8]), x[9] == '1', x[10] == '1', x[11],
                                      int(x[12]) if x[12] else None))
                elif x[0] == 'fence':
                    self.fences.append((client, int(x[1]), float(x[2]), float(x[3]), int(x[4]),
                                        int(x[5]), int(x[6])))
                elif x[0] == 'restamp':
                    self.restamps.append((int(x[1]), x[2], int(x[3])))
                elif x[0] == 'doubt':
                    self.doubts += 1
                elif x[0] == 'err':
                    self.errors.append((client, line))
        return self


class Clients:
    def __init__(self, ports):
        self.dir = f'{SCRATCH}/clients'
        os.makedirs(self.dir, exist_ok=True)
        # Both nodes; libpq tries them in order and keeps the one that is
        # read-write (pg_auto_failover keeps a promoted standby read-only
        # until the old primary is known to be down).
        self.dsn = (f"host={','.join('127.0.0.1' for _ in ports)} port={','.join(map(str, ports))} "
                    "dbname=postgres user=postgres target_session_attrs=read-write connect_timeout=2")
        self.procs = []

    def start(self):
        specs = [('reporter', f'r{i}', '0') for i in range(1, REPORTERS + 1)]
        specs.append(('controller', 'c1', '0.3'))
        for i, (role, name, period) in enumerate(specs):
            self.procs.append(subprocess.Popen(
                ['/usr/bin/python3', f'{SCRATCH}/client.py', '--role', role, '--name', name,
                 '--dsn', self.dsn, '--dir', self.dir, '--objects', str(OBJECTS),
                 '--period', period, '--seed', str(1000 + i)],
                env=ENV, stdin=subprocess.DEVNULL,
                stdout=open(f'{self.dir}/{name}.out', 'w'), stderr=subprocess.STDOUT))

    def names(self):
        return [f'r{i}' for i in range(1, REPORTERS + 1)] + ['c1']

    def pause(self, timeout=30):
        open(f'{self.dir}/pause', 'w').close()
        deadline = time.time() + timeout
        while time.time() < deadline:
            if all(os.path.exists(f'{self.dir}/{n}.paused') for n in self.names()):
                return True
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError('a client exited; see ' + self.dir)
            time.sleep(0.05)
        raise RuntimeError('the clients did not pause')

    def resume(self):
        os.unlink(f'{self.dir}/pause')

    def stop(self):
        open(f'{self.dir}/stop', 'w').close()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def wait_first_ack(logs, port, after, timeout=120):
    """The first report acknowledged by the node on port after time `after`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        logs.read()
        t = [a[3] for a in logs.acks if a[4] == port and a[3] > after]
        if t:
            return min(t)
        time.sleep(0.1)
    return None


# ---------------------------------------------------------------- the checks

class Handed:
    """Stamps the driver itself got acknowledged (an import, a bare monotonic_now())."""

    def __init__(self):
        self.rows = []        # like Logs.acks, client 'driver'
        self.bare = []        # (label, t_send, t_ack, stamp)


HANDED = Handed()
STOPPED = []   # walsenders stopped with SIGSTOP: SIGCONT on the way out


def in_background(fn, timeout):
    """Run fn in a thread; its result, or None if it has not returned in time."""
    out = {}

    def run():
        try:
            out['r'] = fn()
        except Exception as e:  # noqa: BLE001 - recorded, judged by the caller
            out['e'] = e
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(timeout)
    return out, th


def check_replication_mode(primary, label):
    with connect(primary.port) as c:
        names = c.execute('SHOW synchronous_standby_names').fetchone()[0]
        reps = c.execute('SELECT application_name, sync_state FROM pg_stat_replication').fetchall()
    states = ', '.join(f'{a}: {s}' for a, s in reps) or 'no standby connected'
    if SYNC:
        CHECKS.ok(names != '' and any(s in ('sync', 'quorum') for _, s in reps),
                  f'{label}: synchronous replication is on',
                  f"synchronous_standby_names = '{names}'; {states}")
    else:
        CHECKS.ok(names == '' and all(s == 'async' for _, s in reps),
                  f'{label}: replication is asynchronous (HA_SYNC=0)',
                  f"synchronous_standby_names = '{names}'; {states}")


def run_checks(label, primary, standby, logs, bare_after=None, t_kill=None):
    """Every guarantee, on the data as it stands, with the clients paused."""
    logs.read()
    acks = logs.acks + HANDED.rows
    fences = logs.fences
    restamps = logs.restamps
    stale = sum(1 for a in acks if a[9])
    warned = sum(1 for a in acks if a[10])
    say(f'checks {label}: primary {primary.name}, {len(acks)} acknowledged reports '
        f'({stale} stale, {warned} with a replication warning), {len(fences)} acknowledged '
        f'reconnects, {logs.doubts} in doubt')
    maxg = max((f[5] for f in fences), default=0)
    fence_t = {f[5]: (f[2], f[3], f'{f[0]}#{f[1]}') for f in fences}

    if t_kill is not None:
        # Fences acknowledged by the old primary (before the kill, or just
        # after it by a backend that had not noticed yet) are in force on the
        # new one: its reports with a generation below them, committed before
        # the controller's first reconnect() on it, are stale.
        t_next = min((f[2] for f in fences if f[4] == primary.port and f[2] > t_kill), default=float('inf'))
        g_pre = max((f[5] for f in fences if f[4] != primary.port and f[3] < t_next), default=0)
        tested = [a for a in acks if a[4] == primary.port and a[2] > t_kill and a[3] < t_next and a[8] < g_pre]
        wrong = [a for a in tested if not a[9]]
        CHECKS.ok(tested and not wrong,
                  f'{label}: the fence the old primary acknowledged ({g_pre}) holds on {primary.name}',
                  f'{len(tested)} reports below it before the next reconnect(): {len(wrong)} not stale')

    with connect(primary.port) as c:
        # Fences raised before are still in force: every report below them is stale.
        if maxg > 0:
            r = c.execute(
                "SELECT count(*), count(*) FILTER (WHERE NOT r.stale)"
                "  FROM status_history.objects AS o,"
                "       LATERAL status_history.report(o.object_id, 'stalled', NULL, NULL, 'probe', %s) AS r"
                " WHERE o.object_id LIKE 'obj-%%'", (maxg - 1,)).fetchone()
            CHECKS.ok(r[0] == OBJECTS and r[1] == 0,
                      f'{label}: a report below the newest acknowledged fence ({maxg}) is stale',
                      f'{r[0]} objects probed with generation {maxg - 1}, {r[1]} not stale')
            low = c.execute("SELECT count(*) FROM status_history.objects"
                            " WHERE object_id LIKE 'obj-%%' AND fence < %s", (maxg,)).fetchone()[0]
            CHECKS.ok(low == 0, f'{label}: every object keeps a fence >= {maxg}',
                      f'{low} objects below it')

    with connect(primary.port, autocommit=False) as c:
        c.execute('SET TRANSACTION ISOLATION LEVEL REPEATABLE READ')
        c.execute('CREATE TEMP TABLE acked (client text, seq int, t_send float8, t_ack float8, port int,'
                  ' stamp bigint, object_id text, status text, generation bigint, stale bool, warned bool,'
                  ' replica text, seen bigint) ON COMMIT DROP')
        c.execute('CREATE TEMP TABLE restamped (generation bigint, object_id text, stamp bigint) ON COMMIT DROP')
        with c.cursor().copy('COPY acked FROM STDIN') as cp:
            for a in acks:
                cp.write_row(a)
        with c.cursor().copy('COPY restamped FROM STDIN') as cp:
            for r in restamps:
                cp.write_row(r)
        # The rows whose making was acknowledged, with when it was asked for:
        # reports that appended their row, reconnect()s' copies.
        c.execute('CREATE TEMP TABLE created (stamp bigint, t_send float8) ON COMMIT DROP')
        with c.cursor().copy('COPY created FROM STDIN') as cp:
            for a in acks:
                if a[12] == a[5]:
                    cp.write_row((a[5], a[2]))
            for g, _, st in restamps:
                if g in fence_t:
                    cp.write_row((st, fence_t[g][0]))
        c.execute('CREATE INDEX ON created (stamp)')
        c.execute('ANALYZE acked')
        c.execute('ANALYZE restamped')
        c.execute('ANALYZE created')
        h_us = STAMP_US.format('h.occurred_at')

        missing = c.execute(
            f"SELECT count(*), min(a.t_ack), max(a.t_ack), string_agg(a.client || '#' || a.seq, ' ')"
            f"  FROM acked AS a"
            f" WHERE NOT EXISTS (SELECT FROM status_history.history AS h"
            f"                    WHERE {h_us} = a.stamp AND h.object_id = a.object_id"
            f"                      AND h.status = a.status AND h.generation = a.generation"
            f"                      AND h.stale = a.stale AND h.replica_id = a.replica)").fetchone()
        detail = f'{len(acks)} acknowledged'
        if missing[0]:
            detail += (f'; {missing[0]} missing, acknowledged between {missing[1] - T0:.1f}s and '
                       f'{missing[2] - T0:.1f}s: {" ".join(missing[3].split()[:5])} ...')
        CHECKS.ok(missing[0] == 0, f'{label}: every acknowledged report is in the history', detail)

        # With deduplication on (the default), a report that repeats its
        # key's newest row appends no row, and report() returns the row it
        # repeats, with that row's older stamp; the repeat moves the key's
        # last_seen_at to a stamp of its own.  So each acknowledged report is
        # exactly one of: a new row (last_seen_at = its row's stamp), or a
        # repeat (last_seen_at later), whose row was its key's newest: no row
        # of the key (object, replica) lies between the row and the repeat's
        # own stamp, so the repeat appended none either.  Reports on an
        # object are serialized, and stamp order is commit order per object.
        # Rows asked for after the repeat was acknowledged are not in its
        # past, whatever their stamps (their stamps lie below the repeat's
        # only when the clock went back, which the clock-order check counts).
        def ts(us):
            return f"(timestamptz 'epoch' + {us} * interval '1 microsecond')"
        kinds = c.execute(f"""
            SELECT count(*) FILTER (WHERE kind = 'new'), count(*) FILTER (WHERE kind = 'repeat'),
                   count(*) FILTER (WHERE kind = 'bad'), string_agg(what, ' ') FILTER (WHERE kind = 'bad')
              FROM (SELECT a.client || '#' || a.seq AS what,
                           CASE WHEN a.seen = a.stamp THEN 'new'
                                WHEN a.seen > a.stamp AND NOT EXISTS (
                                    SELECT FROM status_history.history AS h
                                     WHERE h.object_id = a.object_id AND h.replica_id = a.replica
                                       AND h.occurred_at > {ts('a.stamp')} AND h.occurred_at <= {ts('a.seen')}
                                       AND {h_us} > a.stamp AND {h_us} <= a.seen
                                       AND NOT EXISTS (SELECT FROM created AS k
                                                        WHERE k.stamp = {h_us} AND k.t_send > a.t_ack))
                                    THEN 'repeat'
                                ELSE 'bad' END AS kind
                      FROM acked AS a) AS k""").fetchone()
        CHECKS.ok(kinds[2] == 0,
                  f'{label}: every acknowledged report appended its row or repeated its key\'s newest row',
                  f'{kinds[0]} new rows, {kinds[1]} repeats, {kinds[2]} neither'
                  + (f': {" ".join(kinds[3].split()[:5])} ...' if kinds[2] else ''))

        lost_re = c.execute(
            f"SELECT count(*) FROM restamped AS r"
            f" WHERE NOT EXISTS (SELECT FROM status_history.history AS h"
            f"                    WHERE {h_us} = r.stamp AND h.object_id = r.object_id"
            f"                      AND h.generation = r.generation)").fetchone()[0]
        CHECKS.ok(lost_re == 0, f'{label}: every re-stamp of an acknowledged reconnect() is in the history',
                  f'{len(restamps)} re-stamps from {len(fences)} reconnects; {lost_re} missing')

        rows, dup = c.execute('SELECT count(*), count(*) - count(DISTINCT occurred_at)'
                              '  FROM status_history.history').fetchone()
        CHECKS.ok(dup == 0, f'{label}: stamps are unique', f'{rows} rows, {dup} duplicates')

        below = c.execute(f"""
            SELECT count(*) FROM (
                SELECT kind, stale, generation,
                       max(generation) FILTER (WHERE kind = 'fence')
                           OVER (PARTITION BY object_id ORDER BY stamp, kind
                                 ROWS UNBOUNDED PRECEDING) AS fence
                  FROM (SELECT 'row' AS kind, h.object_id, {h_us} AS stamp, h.generation, h.stale
                          FROM status_history.history AS h
                        UNION ALL
                        SELECT 'fence', object_id, stamp, generation, false FROM restamped) AS u) AS x
             WHERE kind = 'row' AND NOT stale AND generation < fence""").fetchone()[0]
        CHECKS.ok(below == 0, f'{label}: no non-stale report below a fence raised before it',
                  f'{below} found')

        brute = ("SELECT DISTINCT ON (object_id) * FROM status_history.history"
                 " WHERE NOT stale ORDER BY object_id, occurred_at DESC")
        for incl, filt, what in [(False, "WHERE status <> 'dropped'", 'latest()'),
                                 (True, '', 'latest(include_dropped => true)')]:
            n, diff = c.execute(f"""
                WITH b AS (SELECT * FROM ({brute}) AS x {filt}),
                     l AS (SELECT * FROM status_history.latest(include_dropped => {incl}))
                SELECT (SELECT count(*) FROM l),
                       (SELECT count(*) FROM (SELECT * FROM l EXCEPT ALL SELECT * FROM b) AS d1)
                     + (SELECT count(*) FROM (SELECT * FROM b EXCEPT ALL SELECT * FROM l) AS d2)""").fetchone()
            CHECKS.ok(diff == 0, f'{label}: {what} equals the brute-force DISTINCT ON',
                      f'{n} objects, {diff} rows differ')
        diff = c.execute("""
            SELECT count(*) FROM status_history.statuses AS s
              FULL JOIN status_history.latest() AS l USING (object_id)
             WHERE s.occurred_at IS DISTINCT FROM l.occurred_at""").fetchone()[0]
        CHECKS.ok(diff == 0, f'{label}: statuses agrees with latest()', f'{diff} differ')
        c.rollback()

    # Stamps increase in real time across the failovers: a stamp acknowledged
    # before another request was sent is below the stamp that request took.
    # A report's own stamp is its key's last_seen_at: its row's stamp, or a
    # repeat's later one (the row a repeat returns was stamped before, by the
    # report that appended it; last_seen_at is missing only where the check
    # above failed).
    events = [(a[2], a[3], a[12] if a[12] is not None else a[5], f'{a[0]}#{a[1]}') for a in acks]
    events += [(*fence_t[g][:2], s, fence_t[g][2] + f' {o}') for g, o, s in restamps if g in fence_t]
    bad, worst = clock_order(events)
    repeats = sum(1 for a in acks if a[12] is not None and a[12] > a[5])
    CHECKS.ok(bad == 0, f'{label}: every stamp is above every stamp acknowledged before it was asked for',
              f'{len(events)} stamps, {repeats} of them taken by repeats; '
              f'{bad} below an earlier acknowledged one{worst}')

    with connect(primary.port) as c:
        new, top = c.execute(f"SELECT {STAMP_US.format('status_history.monotonic_now()')},"
                             f"       {STAMP_US.format('max(occurred_at)')} FROM status_history.history").fetchone()
    known = max([e[2] for e in events], default=0)
    CHECKS.ok(new > top, f'{label}: a new stamp is above every row in the table', f'by {(new - top) / 1e6:.6f}s')
    CHECKS.ok(new > known, f'{label}: a new stamp is above every stamp ever acknowledged',
              f'by {(new - known) / 1e6:.6f}s')
    if bare_after is not None and HANDED.bare:
        for what, _, _, stamp in HANDED.bare:
            CHECKS.ok(new > stamp and bare_after > stamp,
                      f'{label}: the new primary stamps above what {what} handed out on the old primary',
                      f'first new stamp {"above" if bare_after > stamp else "BELOW"} it by '
                      f'{abs(bare_after - stamp) / 1e6:.6f}s')

    if standby is not None:
        compare_standby(label, primary, standby)


def clock_order(events):
    """events: (t_send, t_ack, stamp, name).  Count those whose stamp is not
    above every stamp acknowledged before they were sent."""
    by_ack = sorted(events, key=lambda e: e[1])
    acks = [e[1] for e in by_ack]
    prefix = []
    best = None
    for e in by_ack:
        best = e if best is None or e[2] > best[2] else best
        prefix.append(best)
    import bisect
    bad, worst = 0, ''
    worst_gap = 0
    for e in events:
        i = bisect.bisect_left(acks, e[0]) - 1
        if i >= 0 and prefix[i][2] >= e[2]:
            bad += 1
            gap = prefix[i][2] - e[2]
            if gap >= worst_gap:
                worst_gap = gap
                worst = (f'; e.g. {e[3]} sent at {e[0] - T0:.3f}s got a stamp {gap / 1e6:.6f}s below '
                         f'{prefix[i][3]} acknowledged at {prefix[i][1] - T0:.3f}s')
    return bad, worst


def compare_standby(label, primary, standby):
    lsn = one(primary.port, 'SELECT pg_current_wal_lsn()::text')
    deadline = time.time() + 60
    caught = False
    while time.time() < deadline:
        try:
            if one(standby.port, 'SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn', (lsn,)):
                caught = True
                break
        except psycopg.Error:
            pass
        time.sleep(0.2)
    CHECKS.ok(caught, f'{label}: the standby {standby.name} replayed up to the primary ({lsn})')
    reads = [
        ('latest()', "SELECT count(*), md5(string_agg(l::text, '|' ORDER BY object_id))"
                     "  FROM status_history.latest(include_dropped => true) AS l"),
        ('statuses', "SELECT count(*), md5(string_agg(s::text, '|' ORDER BY object_id))"
                     "  FROM status_history.statuses AS s"),
        ('history', "SELECT count(*), md5(string_agg(h::text, '|' ORDER BY occurred_at))"
                    "  FROM status_history.history AS h"),
    ]
    for what, q in reads:
        with connect(primary.port) as c:
            p = c.execute(q).fetchone()
        with connect(standby.port) as c:
            s = c.execute(q).fetchone()
        CHECKS.ok(p == s, f'{label}: {what} on the standby equals the primary',
                  f'{p[0]} rows on the primary, {s[0]} on the standby')
    try:
        one(standby.port, 'SELECT status_history.monotonic_now()')
        CHECKS.ok(False, f'{label}: the standby refuses to hand out stamps')
    except psycopg.Error as e:
        CHECKS.ok(e.sqlstate == '25006', f'{label}: the standby refuses to hand out stamps', e.sqlstate)


# ---------------------------------------------------------------- the run

def stall_then_kill(primary, standby, logs):
    """The standby falls behind, the primary goes on acknowledging what it can,
    then dies.  The primary's walsender is stopped (SIGSTOP): nothing written
    after that leaves the primary.  With synchronous replication, commits now
    wait; with asynchronous replication they are acknowledged and will be
    lost.  Meanwhile the owner imports a row stamped an hour ahead (the clock
    goes on above it) and a bare SELECT monotonic_now() -- a transaction that
    writes no row, only, perhaps, the clock's bound -- takes a stamp."""
    with connect(primary.port) as c:
        ws = c.execute("SELECT pid FROM pg_stat_replication"
                       " WHERE application_name LIKE 'pgautofailover_standby_%'").fetchall()
    walsenders = [r[0] for r in ws]
    STOPPED.extend(walsenders)
    # Sessions opened beforehand, so that only the statements are timed.
    imp_conn, now_conn = connect(primary.port), connect(primary.port)
    # An import this far ahead needs the owner's consent (22008 otherwise).
    imp_conn.execute('SET status_history.max_import_lead = -1')
    for p in walsenders:
        os.kill(p, signal.SIGSTOP)
    t_stall = time.time()
    say(f'{standby.name} falls behind: walsender {walsenders} of {primary.name} stopped')
    time.sleep(0.5)

    def importer():
        t_send = time.time()
        r = imp_conn.execute(
            f"INSERT INTO status_history.history (occurred_at, object_id, status, replica_id)"
            f" VALUES (now() + interval '1 hour', 'import-1', 'running', 'importer')"
            f" RETURNING {STAMP_US.format('occurred_at')}, object_id, status, generation, stale, replica_id"
            ).fetchone()
        return t_send, time.time(), r
    imp, imp_thread = in_background(importer, 1.0) if IMPORT else ({}, None)

    def bare_now():
        t_send = time.time()
        s = now_conn.execute(f"SELECT {STAMP_US.format('status_history.monotonic_now()')}").fetchone()[0]
        return t_send, time.time(), s
    now, now_thread = in_background(bare_now, 1.0)
    time.sleep(1.0)
    t_kill, pm = primary.kill9(extra=walsenders)
    STOPPED.clear()
    say(f'KILL -9 {primary.name}: pg_autoctl (pgid {primary.proc.pid}), postmaster {pm}, walsender {walsenders}')
    if imp_thread is not None:
        imp_thread.join(10)
    now_thread.join(10)
    for c in (imp_conn, now_conn):
        c.close()

    if 'r' in imp:   # answered (by the old primary, whenever): acknowledged
        t_send, t_ack, r = imp['r']
        # An import is always a row: seen = its stamp.
        HANDED.rows.append(('driver', 1, t_send, t_ack, primary.port, r[0], r[1], r[2], r[3], r[4], False,
                            r[5], r[0]))
        say(f'the import of a row stamped 1 hour ahead was acknowledged by {primary.name}')
    elif not IMPORT:
        pass
    elif 'e' in imp and not isinstance(imp['e'], psycopg.OperationalError):
        CHECKS.ok(False, f'the import of a row stamped 1 hour ahead on {primary.name} went through',
                  ' '.join(str(imp['e']).split()))
    else:
        say(f'the import of a row stamped 1 hour ahead was not acknowledged (it waited for the standby)')
    if 'r' in now:
        t_send, t_ack, st = now['r']
        HANDED.bare.append(('a bare SELECT monotonic_now()', t_send, t_ack, st))
        say(f'SELECT status_history.monotonic_now() on {primary.name} was answered with a stamp '
            f'{(st / 1e6) - t_ack:+.3f}s from the time it was answered')
    else:
        say('SELECT status_history.monotonic_now() was not answered before the kill: '
            + (' '.join(str(now['e']).split())
               if 'e' in now and not isinstance(now['e'], psycopg.OperationalError) else 'it waited'))

    logs.read()
    n = sum(1 for a in logs.acks if a[4] == primary.port and a[2] > t_stall)
    if SYNC:
        CHECKS.ok(n == 0, f'while {standby.name} received nothing, {primary.name} acknowledged no report '
                  '(commits wait for the synchronous standby)', f'{n} acknowledged')
    else:
        say(f'while {standby.name} received nothing, {primary.name} acknowledged {n} reports')
    return t_kill


def failover(monitor, old, new, logs, t_kill, label):
    fa = wait_first_ack(logs, new.port, t_kill)
    ok = CHECKS.ok(fa is not None, f'{label}: reports are acknowledged by {new.name} after {old.name} died',
                   f'{fa - t_kill:.2f}s from the kill to the first acknowledged report on {new.name}'
                   if fa else 'none within 120s')
    if ok:
        say(f'FAILOVER {label}: {fa - t_kill:.2f}s from kill -9 to the first acknowledged report on {new.name}')
    show_state(monitor)
    return fa - t_kill if fa else None


def rejoin(monitor, node, primary, times):
    """Start the killed node's pg_autoctl again: it rejoins as the standby."""
    t = time.time()
    node.start()
    ok = wait_states(monitor, {node.name: 'secondary', primary.name: 'primary'}, timeout=120)
    times[f'rejoin {node.name}'] = time.time() - t
    CHECKS.ok(ok, f'{node.name} rejoined as a standby', f'{times[f"rejoin {node.name}"]:.1f}s')
    show_state(monitor)


def on_sigterm(signum, frame):
    raise RuntimeError('terminated (time limit reached)')


def main():
    signal.signal(signal.SIGTERM, on_sigterm)
    os.makedirs(f'{SCRATCH}/run', mode=0o700, exist_ok=True)
    ports = free_ports(3)
    monitor = Node('monitor', ports[0])
    n1, n2 = Node('node1', ports[1]), Node('node2', ports[2])
    nodes = [monitor, n1, n2]
    clients = None
    times = {}
    say(f'replication: {"synchronous" if SYNC else "ASYNCHRONOUS (HA_SYNC=0)"}; ports: monitor {monitor.port}, '
        f'node1 {n1.port}, node2 {n2.port}; scratch {SCRATCH}')
    try:
        autoctl('create', 'monitor', '--pgdata', monitor.pgdata, '--pgport', str(monitor.port),
                '--hostname', '127.0.0.1', '--listen', '127.0.0.1', '--auth', 'trust', '--no-ssl')
        append_conf(monitor, [
            "shared_buffers = '32MB'",
            # Decide on a failover within about 3 seconds of the last sign of life.
            'pgautofailover.health_check_period = 1000',
            'pgautofailover.health_check_timeout = 1000',
            'pgautofailover.health_check_max_retries = 1',
            'pgautofailover.health_check_retry_delay = 500',
            'pgautofailover.node_considered_unhealthy_timeout = 3000',
            # The standby takes writes only this long after the old primary was
            # told to demote: it must exceed the keepers' network_partition_timeout
            # (2s, see keeper_timeouts) so that a primary that is alive but cut
            # off has stopped taking writes by then.
            'pgautofailover.primary_demote_timeout = 4000',
        ])
        monitor.start()
        wait_ready(monitor.port)
        uri = f'postgres://autoctl_node@127.0.0.1:{monitor.port}/pg_auto_failover?sslmode=disable'
        quorum = 'true' if SYNC else 'false'
        for node in (n1, n2):
            if node is n2:
                # pg_basebackup waits for a spread checkpoint; make it short.
                with connect(n1.port) as c:
                    c.execute('CHECKPOINT')
            t = time.time()
            autoctl('create', 'postgres', '--pgdata', node.pgdata, '--pgport', str(node.port),
                    '--listen', '127.0.0.1', '--hostname', '127.0.0.1', '--name', node.name,
                    '--auth', 'trust', '--no-ssl', '--dbname', 'postgres', '--monitor', uri,
                    '--replication-quorum', quorum)
            if node is n1:
                append_conf(n1, ["shared_buffers = '64MB'", 'max_connections = 40'] +
                            (["shared_preload_libraries = 'pg_stat_statements,status_history'"]
                             if PRELOAD else []))
            keeper_timeouts(node)
            node.start()
            if node is n1:
                if not wait_states(monitor, {'node1': 'single'}):
                    raise RuntimeError('node1 did not start')
                wait_ready(n1.port, writable=True)
                with connect(n1.port) as c:
                    c.execute('CREATE EXTENSION status_history')
                    # The reporters call it in their report's statement, after
                    # report(): VOLATILE, so it reads with a new snapshot and
                    # sees what report() wrote.  A key's last_seen_at is the
                    # stamp of its newest row, or later when the report
                    # repeated that row (README: status_history.deduplicate).
                    c.execute("CREATE FUNCTION public.ha_last_seen(o text, r text) RETURNS timestamptz"
                              " LANGUAGE sql VOLATILE AS $$SELECT last_seen_at FROM status_history.replica_state"
                              " WHERE object_id = o AND replica_id = r$$")
                    c.execute("SELECT status_history.report('obj-' || i, 'starting')"
                              "  FROM generate_series(1, %s) AS i", (OBJECTS,))
            say(f'{node.name} created ({time.time() - t:.1f}s)')
        if not wait_states(monitor, {'node1': 'primary', 'node2': 'secondary'}):
            raise RuntimeError('the formation did not reach primary/secondary')
        show_state(monitor)
        print(autoctl('get', 'formation', 'settings', '--pgdata', monitor.pgdata).rstrip(), flush=True)

        logs = Logs()
        clients = Clients([n1.port, n2.port])
        clients.start()
        say(f'load: {REPORTERS} reporters, 1 controller (reconnect() every 0.3s), {OBJECTS} objects')
        time.sleep(5)
        clients.pause()
        run_checks('before any failover', n1, n2, logs)
        check_replication_mode(n1, 'before failover 1')
        clients.resume()

        # Failover 1: the standby lags, the primary dies.
        time.sleep(2)
        t_kill = stall_then_kill(n1, n2, logs)
        times['failover 1'] = failover(monitor, n1, n2, logs, t_kill, 'failover 1')
        time.sleep(3)
        clients.pause()
        # The first stamp node2 handed out: the smallest acknowledged after the
        # kill (a repeat's own stamp is its key's last_seen_at, not the row's).
        logs.read()
        first_new = min((a[12] for a in logs.acks if a[4] == n2.port and a[3] > t_kill and a[12] is not None),
                        default=None)
        run_checks('after failover 1', n2, None, logs, bare_after=first_new, t_kill=t_kill)
        clients.resume()

        # node1 comes back and rejoins as a standby.
        rejoin(monitor, n1, n2, times)
        time.sleep(3)
        clients.pause()
        run_checks('after node1 rejoined', n2, n1, logs)
        check_replication_mode(n2, 'before failover 2')
        clients.resume()

        # Failover 2: the new primary dies under load.
        time.sleep(3)
        t_kill, pm = n2.kill9()
        say(f'KILL -9 node2: pg_autoctl (pgid {n2.proc.pid}), postmaster {pm}')
        times['failover 2'] = failover(monitor, n2, n1, logs, t_kill, 'failover 2')
        time.sleep(3)
        clients.pause()
        run_checks('after failover 2', n1, None, logs, t_kill=t_kill)
        clients.resume()

        rejoin(monitor, n2, n1, times)
        time.sleep(2)
        clients.stop()
        clients = None
        run_checks('at the end', n1, n2, logs)
        logs.read()
        kinds = {}
        for _, line in logs.errors:
            k = line.split('\t')[2][:60]
            kinds[k] = kinds.get(k, 0) + 1
        say('client errors (all retried): ' + '; '.join(f'{n} x {k}' for k, n in
                                                       sorted(kinds.items(), key=lambda x: -x[1])[:6]))
    except Exception as e:  # noqa: BLE001 - reported as a failed check, then cleaned up
        import traceback
        traceback.print_exc()
        CHECKS.ok(False, f'the run completed: {type(e).__name__}: {" ".join(str(e).split())}')
    finally:
        for p in STOPPED:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if clients is not None:
            clients.stop()
        for node in reversed(nodes):
            node.stop()
    say('times: ' + ', '.join(f'{k} {v:.2f}s' for k, v in times.items() if v is not None))
    if CHECKS.failures:
        print('failed:\n  ' + '\n  '.join(CHECKS.failures))
    print(f'{CHECKS.passed} passed, {CHECKS.failed} failed')
    sys.exit(1 if CHECKS.failed else 0)


if __name__ == '__main__':
    main()
