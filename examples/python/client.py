#!/usr/bin/python3
"""status_history from Python, with psycopg 3 (Debian: python3-psycopg).

    SH_DSN='host=db1,db2 port=5432,5432 dbname=app target_session_attrs=read-write' \
    ./run.sh reporter OBJECT_ID REPLICA_ID GENERATION COUNT
    ./run.sh controller GENERATION [REPLICA_ID]
    ./run.sh consumer AFTER COUNT

Every value printed comes from the database in its text format
(occurred_at::text, stale::text), so every language's example prints the same
lines for the same rows.  Progress and retries go to stderr.
"""
import os
import select
import sys
import time

import psycopg
from psycopg import errors

LEASE = '30 seconds'   # how long a report holds unless the reporter reports again
PERIOD = 0.05          # between heartbeats; a real reporter sends one every lease/3 or so
RETRY_FOR = 60.0       # how long to keep retrying one call across an outage (a failover)
POLL = 1.0             # consumer: poll this often when no notification wakes it
PAGE = 1000            # consumer: rows per changes() call

# Errors after which the same call may succeed on a new connection: the
# connection broke or could not be made (OperationalError: libpq's errors and
# the server's classes 08, 53, 57 -- a shutdown or a kill), or we reached a
# server that no longer takes writes (a demoted primary).
RETRYABLE = (psycopg.OperationalError, errors.ReadOnlySqlTransaction)


def log(msg):
    print(f'{os.path.basename(sys.argv[0])}: {msg}', file=sys.stderr, flush=True)


def one_line(e):
    return ' '.join(str(e).split())


def connect():
    # With several hosts in SH_DSN and target_session_attrs=read-write, libpq
    # tries them in turn and keeps the first that accepts writes.  Autocommit:
    # every call below is its own transaction, committed when it returns, so
    # a reply means "stored" (on the synchronous standby too, where the
    # server is set up so).
    return psycopg.connect(os.environ['SH_DSN'], autocommit=True, connect_timeout=5)


def with_retries(what, call, state):
    """call(conn) on state['conn'], reconnecting and calling again on a
    retryable error, with backoff, for up to RETRY_FOR seconds."""
    deadline = time.monotonic() + RETRY_FOR
    delay = 0.05
    while True:
        sent = False
        try:
            if state.get('conn') is None:
                state['conn'] = connect()
                if 'on_connect' in state:
                    state['on_connect'](state['conn'])
            sent = True
            return call(state['conn'])
        except RETRYABLE as e:
            # Failed while connecting: nothing was sent.  Failed with the
            # call on the wire: the server may have committed it and the
            # reply was lost -- the outcome is in doubt.  The caller's call
            # must be safe to repeat either way.
            if state.get('conn') is not None:
                state['conn'].close()
                state['conn'] = None
            if time.monotonic() + delay > deadline:
                raise
            log(f'{what}: {"in doubt" if sent else "not sent"} ({one_line(e)}); retrying in {delay:.2f} s')
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def reporter(object_id, replica_id, generation, count):
    state = {}
    for seq in range(1, count + 1):
        # The first report says the object is starting; every later one is a
        # heartbeat, "still running", which renews the lease.
        status = 'starting' if seq == 1 else 'running'

        def send(conn):
            # Why re-sending a report in doubt is safe: if the lost reply was
            # for a committed report, the same report sent again repeats its
            # key's newest row (same status, error, details, generation and
            # lease), and status_history.deduplicate (on by default) turns a
            # repeat into a renewal -- it appends no row, moves last_seen_at
            # and renews the lease from the repeat's stamp (docs/REFERENCE.md, "Heartbeats
            # without growth").  If it was not committed, this is the report.
            # Either way the history ends up with the report exactly once.
            # report() returns the stored row, for a repeat the row it renews,
            # so the stamp printed is always one the history holds.
            return conn.execute(
                "SELECT occurred_at::text FROM status_history.report("
                "  %s, %s, replica_id => %s, generation => %s::bigint, lease => %s::interval)",
                (object_id, status, replica_id, generation, LEASE)).fetchone()[0]

        stamp = with_retries(f'report {seq}', send, state)
        print(f'ack {seq} {stamp}', flush=True)
        if seq < count:
            time.sleep(PERIOD)


def controller(generation, replica_id=None):
    # reconnect() raises the fence of every object replica_id reported on (of
    # every object, without one) to `generation` and re-stamps their current
    # reports, so they sort after anything an older generation still sends.
    # No retry once sent: a reconnect() in doubt may have raised the fences,
    # and a controller then retries with a higher generation (docs/OPERATIONS.md, "High
    # availability"); this one was given its generation, so it fails and lets
    # whoever gave it pick the next one.
    with connect() as conn:
        n = conn.execute("SELECT count(*) FROM status_history.reconnect(%s::bigint, %s::text)",
                         (generation, replica_id)).fetchone()[0]
    print(f'reconnected {n}', flush=True)


def consumer(after, count):
    woken = False

    def on_notify(notify):
        # A notification is only a wake-up (anyone may NOTIFY the channel, and
        # one is sent only when a status changes): the rows come from
        # changes().  psycopg calls this while it reads a reply, i.e. during
        # the changes() call after select() saw the notification arrive.
        nonlocal woken
        if not woken:
            woken = True
            print('woken', flush=True)

    def on_connect(conn):
        conn.add_notify_handler(on_notify)
        # LISTEN before reading: a change committed after this line wakes us,
        # one committed before it is in the next changes() anyway.
        conn.execute('LISTEN status_history')

    state = {'on_connect': on_connect}
    last = after      # the position: the last occurred_at we got, as text
    printed = 0
    while printed < count:
        want = min(PAGE, count - printed)

        def page(conn):
            # changes() returns committed rows after `last` below the stable
            # horizon, in stamp order: looping from the last stamp returned
            # sees every committed row exactly once (docs/REFERENCE.md, "Reading changes
            # as they happen").  The position goes back as the text it came
            # in, so no precision is lost on the way.
            return conn.execute(
                "SELECT occurred_at::text, object_id, status, generation, stale::text"
                "  FROM status_history.changes(after => %s::timestamptz, max_rows => %s)",
                (last, want)).fetchall()

        rows = with_retries('changes', page, state)
        for occurred_at, object_id, status, generation, stale in rows:
            print(f'row {occurred_at} {object_id} {status} {generation} {stale}', flush=True)
            last = occurred_at
        printed += len(rows)
        if len(rows) < want:
            # Nothing more below the horizon now: wait until the server sends
            # something (a notification) or POLL passes.  Notifications are
            # off unless status_history.notify is on for the writers, and are
            # sent only for status changes, so the poll is what guarantees
            # progress; a notification only makes it prompt.
            select.select([state['conn'].fileno()], [], [], POLL)
    state['conn'].close()


def main(argv):
    try:
        if argv[:1] == ['reporter'] and len(argv) == 5:
            reporter(argv[1], argv[2], int(argv[3]), int(argv[4]))
        elif argv[:1] == ['controller'] and len(argv) in (2, 3):
            controller(int(argv[1]), argv[2] if len(argv) == 3 else None)
        elif argv[:1] == ['consumer'] and len(argv) == 3:
            consumer(argv[1], int(argv[2]))
        else:
            sys.exit(__doc__)
    except psycopg.Error as e:
        log(f'{argv[0]} failed: {e.sqlstate or ""} {one_line(e)}')
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
