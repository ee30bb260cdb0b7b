#!/usr/bin/python3
"""A reporter or a controller of the status_history HA test (test/ha/run.sh).

Connects with a multi-host connection string (target_session_attrs=read-write),
so after a failover libpq finds the new primary by itself; on any error it
reconnects and goes on.  It logs, one tab-separated line each, only what the
server acknowledged:

  ack     seq t_send t_ack port stamp_us object_id status generation stale warned replica_id seen_us
  fence   seq t_send t_ack port generation rows
  restamp generation object_id stamp_us
  doubt   seq t_send t_err what      (the connection broke before the answer)
  err     t what

t_send/t_ack are this machine's clock (time.time()) just before sending and
just after the answer; stamp_us is occurred_at in microseconds since the Unix
epoch, as the server returned it.  seen_us is the key's last_seen_at, read in
the report's own statement right after report() (public.ha_last_seen(), made
by the driver): the stamp of the row the report appended, or, when the report
was a repeat (status_history.deduplicate: no row appended, report() returns
the row it repeats, with that row's older stamp), the later stamp the repeat
took.  "warned" is 1 when the server sent a
warning with the answer (PostgreSQL says "the transaction has already
committed locally, but might not have been replicated" when a wait for the
synchronous standby is cancelled): the report was acknowledged all the same.

The test driver steers the clients with files in --dir: "pause" (each client
then writes <name>.paused and waits), "stop" (exit).  The controller writes the
newest generation it raised to "generation"; reporters report with it, or one
below it now and then, so that some reports are stale.
"""
import argparse
import os
import random
import sys
import time

import psycopg

STATUSES = ['starting', 'running', 'paused', 'stalled', 'ceased']
STAMP_US = "(extract(epoch FROM {}) * 1000000)::bigint"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--role', choices=['reporter', 'controller'], required=True)
    ap.add_argument('--name', required=True)
    ap.add_argument('--dsn', required=True)
    ap.add_argument('--dir', required=True)
    ap.add_argument('--objects', type=int, default=200)
    ap.add_argument('--period', type=float, default=0.0, help='seconds between operations')
    ap.add_argument('--seed', type=int, default=None)
    a = ap.parse_args()
    Client(a).run()


class Client:
    def __init__(self, a):
        self.a = a
        self.rng = random.Random(a.seed)
        self.conn = None
        self.seq = 0
        self.warned = False
        self.generation = 0
        self.log = open(os.path.join(a.dir, a.name + '.log'), 'a', buffering=1)
        self.pause_file = os.path.join(a.dir, 'pause')
        self.stop_file = os.path.join(a.dir, 'stop')
        self.paused_file = os.path.join(a.dir, a.name + '.paused')
        self.gen_file = os.path.join(a.dir, 'generation')

    def write(self, *fields):
        self.log.write('\t'.join(str(f) for f in fields) + '\n')

    def on_notice(self, diag):
        if diag.severity_nonlocalized in ('WARNING',) or 'synchronous replication' in (diag.message_primary or ''):
            self.warned = True
            self.write('err', f'{time.time():.6f}', 'notice: ' + (diag.message_primary or ''))

    def connect(self):
        while True:
            self.check_control()
            try:
                self.conn = psycopg.connect(self.a.dsn, autocommit=True,
                                            application_name=self.a.name)
                self.conn.add_notice_handler(self.on_notice)
                return
            except psycopg.Error as e:
                self.write('err', f'{time.time():.6f}', 'connect: ' + one_line(e))
                time.sleep(0.1)

    def drop_connection(self):
        try:
            self.conn.close()
        except Exception:
            pass
        self.conn = None

    def check_control(self):
        if os.path.exists(self.stop_file):
            self.log.close()
            sys.exit(0)
        if os.path.exists(self.pause_file):
            open(self.paused_file, 'w').close()
            while os.path.exists(self.pause_file) and not os.path.exists(self.stop_file):
                time.sleep(0.02)
            os.unlink(self.paused_file)

    def run(self):
        step = self.reporter_step if self.a.role == 'reporter' else self.controller_step
        while True:
            self.check_control()
            if self.conn is None:
                self.connect()
                if self.a.role == 'controller' and self.seq > 0:
                    # After a failover, leave the reporters a second on the
                    # new primary before fencing again: the test checks that
                    # the fences raised before it still hold there.
                    time.sleep(1.0)
            self.seq += 1
            self.warned = False
            t_send = time.time()
            try:
                step(t_send)
            except psycopg.OperationalError as e:
                # The connection broke: the outcome is unknown (in doubt).
                self.write('doubt', self.seq, f'{t_send:.6f}', f'{time.time():.6f}', one_line(e))
                self.drop_connection()
                time.sleep(0.05)
            except psycopg.Error as e:
                self.write('err', f'{time.time():.6f}', f'{e.sqlstate} ' + one_line(e))
                if self.conn is not None and self.conn.closed:
                    self.conn = None
                time.sleep(0.05)
            if self.a.period:
                time.sleep(self.a.period)

    def current_generation(self):
        try:
            with open(self.gen_file) as f:
                return int(f.read().strip() or 0)
        except (OSError, ValueError):
            return 0

    def reporter_step(self, t_send):
        obj = 'obj-%d' % self.rng.randint(1, self.a.objects)
        status = 'dropped' if self.rng.random() < 0.002 else self.rng.choice(STATUSES)
        gen = self.current_generation()
        if self.rng.random() < 0.2:
            gen = max(gen - 1, 0)
        # ha_last_seen() is VOLATILE: it reads replica_state with a snapshot
        # taken after report() ran, in the same statement and transaction.
        row = self.conn.execute(
            f"SELECT {STAMP_US.format('r.occurred_at')}, r.object_id, r.status, r.generation, r.stale,"
            f"       r.replica_id, {STAMP_US.format('public.ha_last_seen(r.object_id, r.replica_id)')}"
            "  FROM status_history.report(%s, %s, NULL, NULL, %s, %s) AS r",
            (obj, status, self.a.name, gen)).fetchone()
        t_ack = time.time()
        self.write('ack', self.seq, f'{t_send:.6f}', f'{t_ack:.6f}', self.conn.info.port,
                   row[0], row[1], row[2], row[3], int(row[4]), int(self.warned), row[5],
                   '' if row[6] is None else row[6])

    def controller_step(self, t_send):
        # A fresh generation for every attempt: an attempt whose outcome is in
        # doubt may have raised the fences to its generation.
        self.generation += 1
        g = self.generation
        rows = self.conn.execute(
            f"SELECT object_id, {STAMP_US.format('occurred_at')} FROM status_history.reconnect(%s)",
            (g,)).fetchall()
        t_ack = time.time()
        self.write('fence', self.seq, f'{t_send:.6f}', f'{t_ack:.6f}', self.conn.info.port, g, len(rows))
        for obj, stamp in rows:
            self.write('restamp', g, obj, stamp)
        tmp = self.gen_file + '.tmp'
        with open(tmp, 'w') as f:
            f.write(str(g))
        os.replace(tmp, self.gen_file)


def one_line(e):
    return ' '.join(str(e).split())[:200]


if __name__ == '__main__':
    main()
