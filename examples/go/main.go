// status_history from Go, with pgx v4 (Debian: golang-github-jackc-pgx-v4-dev).
//
//	SH_DSN='host=db1,db2 port=5432,5432 dbname=app target_session_attrs=read-write' \
//	./run.sh reporter OBJECT_ID REPLICA_ID GENERATION COUNT
//	./run.sh controller GENERATION [REPLICA_ID]
//	./run.sh consumer AFTER COUNT
//
// Every value printed comes from the database in its text format
// (occurred_at::text, stale::text), so every language's example prints the
// same lines for the same rows. Progress and retries go to stderr.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgconn"
	"github.com/jackc/pgx/v4"
)

const (
	lease    = "30 seconds"          // how long a report holds unless the reporter reports again
	period   = 50 * time.Millisecond // between heartbeats; a real reporter sends one every lease/3 or so
	retryFor = 60 * time.Second      // how long to keep retrying one call across an outage (a failover)
	poll     = time.Second           // consumer: poll this often when no notification wakes it
	page     = 1000                  // consumer: rows per changes() call
)

// connect opens a connection to SH_DSN. With several hosts and
// target_session_attrs=read-write, pgconn tries them in turn and keeps the
// first that accepts writes. Without an explicit transaction every statement
// commits when it returns, so a reply means "stored" (on the synchronous
// standby too, where the server is set up so).
func connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return pgx.Connect(cctx, os.Getenv("SH_DSN"))
}

// retryable says whether the same call may succeed on a new connection: the
// connection broke or could not be made (any error that is not the server's,
// or the server's classes 08 and 57: a shutdown or a kill), or we reached a
// server that no longer takes writes (25006, a demoted primary). Anything
// else (a bad argument, a fenced controller) would fail again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true
	}
	return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57") || pgErr.Code == "25006"
}

// client holds the connection the retries replace.
type client struct {
	conn      *pgx.Conn
	onConnect func(context.Context, *pgx.Conn) error
}

// withRetries runs call on the client's connection, reconnecting and calling
// again on a retryable error, with backoff, for up to retryFor.
func (c *client) withRetries(ctx context.Context, what string, call func(*pgx.Conn) error) error {
	deadline := time.Now().Add(retryFor)
	delay := 50 * time.Millisecond
	for {
		err := c.try(ctx, call)
		if err == nil || !retryable(err) || time.Now().Add(delay).After(deadline) {
			return err
		}
		// SafeToRetry: the error came before anything was sent. Otherwise
		// the call was on the wire and the server may have committed it with
		// the reply lost: the outcome is in doubt, and the call must be safe
		// to repeat.
		doubt := "in doubt"
		if pgconn.SafeToRetry(err) {
			doubt = "not sent"
		}
		log.Printf("%s: %s (%v); retrying in %v", what, doubt, err, delay)
		if c.conn != nil {
			c.conn.Close(ctx)
			c.conn = nil
		}
		time.Sleep(delay)
		if delay *= 2; delay > time.Second {
			delay = time.Second
		}
	}
}

func (c *client) try(ctx context.Context, call func(*pgx.Conn) error) error {
	if c.conn == nil {
		conn, err := connect(ctx)
		if err != nil {
			return err
		}
		c.conn = conn
		if c.onConnect != nil {
			if err := c.onConnect(ctx, conn); err != nil {
				return err
			}
		}
	}
	return call(c.conn)
}

func reporter(ctx context.Context, objectID, replicaID string, generation int64, count int) error {
	c := &client{}
	for seq := 1; seq <= count; seq++ {
		// The first report says the object is starting; every later one is
		// a heartbeat, "still running", which renews the lease.
		status := "running"
		if seq == 1 {
			status = "starting"
		}
		var stamp string
		// Why re-sending a report in doubt is safe: if the lost reply was for
		// a committed report, the same report sent again repeats its key's
		// newest row (same status, error, details, generation and lease), and
		// status_history.deduplicate (on by default) turns a repeat into a
		// renewal -- it appends no row, moves last_seen_at and renews the
		// lease from the repeat's stamp (docs/REFERENCE.md, "Heartbeats without
		// growth"). If it was not committed, this is the report. Either way
		// the history ends up with the report exactly once. report() returns
		// the stored row, for a repeat the row it renews, so the stamp
		// printed is always one the history holds.
		err := c.withRetries(ctx, fmt.Sprintf("report %d", seq), func(conn *pgx.Conn) error {
			return conn.QueryRow(ctx,
				`SELECT occurred_at::text FROM status_history.report(
				   $1, $2, replica_id => $3, generation => $4, lease => $5::interval)`,
				objectID, status, replicaID, generation, lease).Scan(&stamp)
		})
		if err != nil {
			return err
		}
		fmt.Printf("ack %d %s\n", seq, stamp)
		if seq < count {
			time.Sleep(period)
		}
	}
	return nil
}

// controller: reconnect() raises the fence of every object replicaID
// reported on (of every object, without one) to generation and re-stamps
// their current reports, so they sort after anything an older generation
// still sends. No retry once sent: a reconnect() in doubt may have raised the
// fences, and a controller then retries with a higher generation (docs/OPERATIONS.md,
// "High availability"); this one was given its generation, so it fails and
// lets whoever gave it pick the next one.
func controller(ctx context.Context, generation int64, replicaID *string) error {
	conn, err := connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT count(*) FROM status_history.reconnect($1, $2)`,
		generation, replicaID).Scan(&n)
	if err != nil {
		return err
	}
	fmt.Printf("reconnected %d\n", n)
	return nil
}

func consumer(ctx context.Context, after string, count int) error {
	c := &client{onConnect: func(ctx context.Context, conn *pgx.Conn) error {
		// LISTEN before reading: a change committed after this wakes us,
		// one committed before it is in the next changes() anyway.
		_, err := conn.Exec(ctx, "LISTEN status_history")
		return err
	}}
	last := after // the position: the last occurred_at we got, as text
	woken := false
	for printed := 0; printed < count; {
		want := count - printed
		if want > page {
			want = page
		}
		// changes() returns committed rows after last below the stable
		// horizon, in stamp order: looping from the last stamp returned sees
		// every committed row exactly once (docs/REFERENCE.md, "Reading changes as they
		// happen"). The position goes back as the text it came in, so no
		// precision is lost on the way. A page is printed only once read in
		// full, so a retry after a broken connection prints nothing twice.
		var lines []string
		err := c.withRetries(ctx, "changes", func(conn *pgx.Conn) error {
			rows, err := conn.Query(ctx,
				`SELECT occurred_at::text, object_id, status, generation, stale::text
				   FROM status_history.changes(after => $1::timestamptz, max_rows => $2)`, last, want)
			if err != nil {
				return err
			}
			defer rows.Close()
			lines = lines[:0]
			pos := last
			for rows.Next() {
				var occurredAt, objectID, status, stale string
				var generation int64
				if err := rows.Scan(&occurredAt, &objectID, &status, &generation, &stale); err != nil {
					return err
				}
				lines = append(lines, fmt.Sprintf("row %s %s %s %d %s", occurredAt, objectID, status, generation, stale))
				pos = occurredAt
			}
			if err := rows.Err(); err != nil {
				return err
			}
			last = pos
			return nil
		})
		if err != nil {
			return err
		}
		for _, l := range lines {
			fmt.Println(l)
		}
		printed += len(lines)
		if len(lines) == want {
			continue
		}
		// Nothing more below the horizon now: wait for a notification or
		// for poll to pass. Notifications are off unless
		// status_history.notify is on for the writers, and are sent only for
		// status changes, so the poll is what guarantees progress; a
		// notification (only a wake-up: anyone may NOTIFY the channel) makes
		// it prompt. pgx keeps notifications that arrived during a query and
		// returns them here at once.
		wctx, cancel := context.WithTimeout(ctx, poll)
		_, err = c.conn.WaitForNotification(wctx)
		cancel()
		switch {
		case err == nil:
			if !woken {
				woken = true
				fmt.Println("woken")
			}
		case pgconn.Timeout(err):
			// the poll
		default:
			// The connection broke: the next changes() reconnects.
			log.Printf("wait: %v", err)
			c.conn.Close(ctx)
			c.conn = nil
		}
	}
	return c.conn.Close(ctx)
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("go client: ")
	ctx := context.Background()
	a := os.Args[1:]
	var err error
	switch {
	case len(a) == 5 && a[0] == "reporter":
		err = reporter(ctx, a[1], a[2], atoi(a[3]), int(atoi(a[4])))
	case (len(a) == 2 || len(a) == 3) && a[0] == "controller":
		var replica *string // NULL: fence every object
		if len(a) == 3 {
			replica = &a[2]
		}
		err = controller(ctx, atoi(a[1]), replica)
	case len(a) == 3 && a[0] == "consumer":
		err = consumer(ctx, a[1], int(atoi(a[2])))
	default:
		log.Fatal("usage: reporter OBJECT_ID REPLICA_ID GENERATION COUNT | controller GENERATION [REPLICA_ID] | consumer AFTER COUNT")
	}
	if err != nil {
		log.Fatalf("%s failed: %v", a[0], err)
	}
}

func atoi(s string) int64 {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		log.Fatalf("not a number: %q", s)
	}
	return n
}
