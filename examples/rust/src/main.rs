//! status_history from Rust, with tokio-postgres (Debian: librust-tokio-postgres-dev).
//!
//! ```text
//! SH_DSN='host=db1,db2 port=5432,5432 user=app dbname=app target_session_attrs=read-write' \
//! ./run.sh reporter OBJECT_ID REPLICA_ID GENERATION COUNT
//! ./run.sh controller GENERATION [REPLICA_ID]
//! ./run.sh consumer AFTER COUNT
//! ```
//!
//! Every value printed comes from the database in its text format (`occurred_at::text`,
//! `stale::text`), so every language's example prints the same lines for the same rows.
//! Progress and retries go to stderr.

use futures_util::future::poll_fn;
use std::collections::HashMap;
use std::env;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Row, Statement};

const USAGE: &str = "usage: SH_DSN=... status-history-example reporter OBJECT_ID REPLICA_ID GENERATION COUNT
       SH_DSN=... status-history-example controller GENERATION [REPLICA_ID]
       SH_DSN=... status-history-example consumer AFTER COUNT";

/// Between heartbeats. A real reporter sends one every third of its lease or so; the lease
/// itself (30 seconds) is in the reporter's statement.
const PERIOD: Duration = Duration::from_millis(50);
/// How long to keep retrying one call across an outage (a failover).
const RETRY_FOR: Duration = Duration::from_secs(60);
/// Longest wait for any one reply; a server that does not answer is treated as gone.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Per host tried, unless SH_DSN sets connect_timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Consumer: poll this often when no notification wakes it.
const POLL: Duration = Duration::from_secs(1);
/// Consumer: rows per changes() call.
const PAGE: i32 = 1000;

fn log(message: &str) {
    eprintln!("status-history-example: {}", message);
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a call failed.
struct Failure {
    message: String,
    /// The server's SQLSTATE, when it answered with an error.
    code: Option<SqlState>,
    /// Whether the statement had gone out for execution when it failed.
    sent: bool,
}

impl Failure {
    fn from_pg(e: tokio_postgres::Error, sent: bool) -> Failure {
        Failure { message: one_line(&e.to_string()), code: e.code().cloned(), sent }
    }

    fn timed_out(sent: bool) -> Failure {
        let message = format!("no reply within {} s", CALL_TIMEOUT.as_secs());
        Failure { message, code: None, sent }
    }

    /// The statement went out and no answer came back (the connection broke, or the server
    /// went silent): the server may have committed it and the reply was lost. An error the
    /// server did answer with means it rolled the statement back.
    fn in_doubt(&self) -> bool {
        self.sent && self.code.is_none()
    }

    /// Whether the same call may succeed on a new connection: the connection broke or could
    /// not be made (no SQLSTATE, or classes 08, 53, 57 -- a shutdown, a kill, too many
    /// connections), or we reached a server that no longer takes writes (a demoted primary).
    fn retryable(&self) -> bool {
        match &self.code {
            None => true,
            Some(code) => {
                ["08", "53", "57"].iter().any(|class| code.code().starts_with(class))
                    || *code == SqlState::READ_ONLY_SQL_TRANSACTION
            }
        }
    }

    fn describe(&self) -> String {
        match &self.code {
            Some(code) => format!("{} {}", code.code(), self.message),
            None => self.message.clone(),
        }
    }
}

/// One open connection.
struct Conn {
    client: Client,
    /// Statements prepared on this connection, by their text.
    statements: HashMap<String, Statement>,
    /// One message per notification received (the consumer LISTENs; nobody else gets any).
    notifications: mpsc::UnboundedReceiver<()>,
}

/// A connection that is made again, from the same configuration, after it broke.
struct Session {
    config: Config,
    /// LISTEN status_history on every new connection.
    listen: bool,
    conn: Option<Conn>,
}

impl Session {
    fn new(config: Config, listen: bool) -> Session {
        Session { config, listen, conn: None }
    }

    async fn connect(&self) -> Result<Conn, Failure> {
        // With several hosts in SH_DSN and target_session_attrs=read-write, tokio-postgres
        // tries them in turn and keeps the first that accepts writes. No transaction is
        // opened: every statement is its own, committed when its reply arrives, so a reply
        // means "stored" (on the synchronous standby too, where the servers are set up so).
        let (client, mut connection) = timeout(CALL_TIMEOUT, self.config.connect(NoTls))
            .await
            .map_err(|_| Failure::timed_out(false))?
            .map_err(|e| Failure::from_pg(e, false))?;
        let (wake, notifications) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            // The connection object does the socket's I/O. Polling its messages ourselves,
            // rather than only awaiting it, is how tokio-postgres hands over notifications.
            while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
                match message {
                    // Only a wake-up: any role may NOTIFY the channel, and the rows come
                    // from changes() anyway. The payload is not needed.
                    Ok(AsyncMessage::Notification(_)) => {
                        let _ = wake.send(());
                    }
                    Ok(AsyncMessage::Notice(notice)) => {
                        log(&format!("server: {}: {}", notice.severity(), notice.message()));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        log(&format!("connection lost: {}", one_line(&e.to_string())));
                        break;
                    }
                }
            }
        });
        if self.listen {
            // LISTEN before reading: a change committed after this wakes us, one committed
            // before it is in the next changes() anyway.
            timeout(CALL_TIMEOUT, client.batch_execute("LISTEN status_history"))
                .await
                .map_err(|_| Failure::timed_out(false))?
                .map_err(|e| Failure::from_pg(e, false))?;
        }
        Ok(Conn { client, statements: HashMap::new(), notifications })
    }

    /// Runs `sql` once, on the open connection or a new one.
    async fn try_call(&mut self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, Failure> {
        if self.conn.is_none() {
            self.conn = Some(self.connect().await?);
        }
        let conn = self.conn.as_mut().unwrap();
        // Prepared once per connection, in a round trip of its own: a failure up to here
        // is before the statement went out, and leaves nothing in doubt.
        let statement = match conn.statements.get(sql) {
            Some(statement) => statement.clone(),
            None => {
                let statement = timeout(CALL_TIMEOUT, conn.client.prepare(sql))
                    .await
                    .map_err(|_| Failure::timed_out(false))?
                    .map_err(|e| Failure::from_pg(e, false))?;
                conn.statements.insert(sql.to_owned(), statement.clone());
                statement
            }
        };
        timeout(CALL_TIMEOUT, conn.client.query(&statement, params))
            .await
            .map_err(|_| Failure::timed_out(true))?
            .map_err(|e| Failure::from_pg(e, true))
    }

    /// Runs `sql`, reconnecting and running it again on a retryable error, with backoff,
    /// for up to RETRY_FOR. A call in doubt is run again only if `repeat_in_doubt`: the
    /// caller says that running it twice does no harm.
    async fn call(
        &mut self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        repeat_in_doubt: bool,
    ) -> Result<Vec<Row>, Failure> {
        let deadline = Instant::now() + RETRY_FOR;
        let mut delay = Duration::from_millis(50);
        loop {
            let failure = match self.try_call(sql, params).await {
                Ok(rows) => return Ok(rows),
                Err(failure) => failure,
            };
            // Start again on a new connection: with target_session_attrs=read-write, on
            // whichever host takes writes by then.
            self.conn = None;
            let outcome = if failure.in_doubt() {
                "in doubt"
            } else if failure.sent {
                "failed"
            } else {
                "not sent"
            };
            if !failure.retryable()
                || (failure.in_doubt() && !repeat_in_doubt)
                || Instant::now() + delay > deadline
            {
                log(&format!("{}: {} ({}); giving up", what, outcome, failure.describe()));
                return Err(failure);
            }
            log(&format!("{}: {} ({}); retrying in {} ms", what, outcome, failure.describe(), delay.as_millis()));
            sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// Waits until a notification arrives or `period` passes; true if a notification came.
    async fn wait(&mut self, period: Duration) -> bool {
        let conn = match self.conn.as_mut() {
            Some(conn) => conn,
            None => {
                sleep(period).await;
                return false;
            }
        };
        match timeout(period, conn.notifications.recv()).await {
            Ok(Some(())) => {
                // One read serves every notification that has arrived.
                while conn.notifications.try_recv().is_ok() {}
                true
            }
            // The connection ended (the next call makes a new one), or the period passed.
            Ok(None) | Err(_) => false,
        }
    }
}

/// Reports COUNT statuses for OBJECT_ID: `starting`, then `running` heartbeats, each with a
/// 30-second lease, and prints `ack <seq> <occurred_at>` for each one the server acknowledged.
async fn reporter(config: Config, object_id: &str, replica_id: &str, generation: i64, count: u64) -> Result<(), Failure> {
    // report() returns the stored row -- for a repeat the row it renews -- so the stamp
    // printed is always one the history holds.
    const REPORT: &str = "SELECT occurred_at::text FROM status_history.report($1, $2, \
                          replica_id => $3, generation => $4, lease => interval '30 seconds')";
    let mut session = Session::new(config, false);
    for seq in 1..=count {
        // The first report says the object is starting; every later one is a heartbeat,
        // "still running", which renews the lease.
        let status = if seq == 1 { "starting" } else { "running" };
        // Why re-sending a report in doubt is safe: if the lost reply was for a committed
        // report, the same report sent again repeats its key's newest row (same status,
        // error, details, generation and lease), and with status_history.deduplicate on (the
        // default) a repeat appends no row: it renews the lease from the repeat's stamp and
        // moves the key's last_seen_at (docs/REFERENCE.md, "Heartbeats without growth"). If it was not
        // committed, the re-sent one is the report. Either way the history holds it once.
        // (Had another replica's report become current in between, the re-sent one is a
        // row of its own, with the same content: harmless.)
        let rows = session
            .call(&format!("report {}", seq), REPORT, &[&object_id, &status, &replica_id, &generation], true)
            .await?;
        let stamp: Option<String> = rows.first().and_then(|row| row.get(0));
        match stamp {
            Some(stamp) => println!("ack {} {}", seq, stamp),
            // NULL: a BEFORE trigger of the database's own skipped the row.
            None => {
                return Err(Failure { message: "report() stored no row".to_owned(), code: None, sent: true })
            }
        }
        if seq < count {
            sleep(PERIOD).await;
        }
    }
    Ok(())
}

/// Takes over: raises the fence of every object REPLICA_ID reported on (every object, without
/// one) to GENERATION and re-stamps their current reports, so that they sort after anything
/// an older generation still sends. Prints `reconnected <rows re-stamped>`.
async fn controller(config: Config, generation: i64, replica_id: Option<&str>) -> Result<(), Failure> {
    let mut session = Session::new(config, false);
    // Retried while it certainly did not run (not sent, or refused by the server), never
    // once in doubt: it may have raised the fences, and a controller then retries with a
    // higher generation (docs/OPERATIONS.md, "High availability"). This one was given its generation,
    // so it fails and lets whoever gave it pick the next one.
    let rows = session
        .call(
            "reconnect",
            "SELECT count(*) FROM status_history.reconnect($1, $2)",
            &[&generation, &replica_id],
            false,
        )
        .await?;
    let n: i64 = rows[0].get(0);
    println!("reconnected {}", n);
    Ok(())
}

/// Follows changes() from stamp AFTER until it has printed COUNT rows, woken by LISTEN
/// status_history where notifications are on and polling every second otherwise.
async fn consumer(config: Config, after: &str, count: u64) -> Result<(), Failure> {
    // changes() returns the committed rows after `after` below the stable horizon, in stamp
    // order: looping from the last stamp returned sees every committed row exactly once
    // (docs/REFERENCE.md, "Reading changes as they happen"). The position goes back as the text it
    // came in, so no precision is lost on the way.
    const CHANGES: &str = "SELECT occurred_at::text, object_id, status, generation::text, stale::text \
                           FROM status_history.changes(after => $1::text::timestamptz, max_rows => $2)";
    let mut session = Session::new(config, true);
    let mut last = after.to_owned();
    let mut printed = 0;
    let mut woken = false;
    while printed < count {
        let want = (count - printed).min(PAGE as u64) as i32;
        // A read: running it again is always safe.
        let rows = session.call("changes", CHANGES, &[&last, &want], true).await?;
        for row in &rows {
            let occurred_at: String = row.get(0);
            let object_id: String = row.get(1);
            let status: String = row.get(2);
            let generation: String = row.get(3);
            let stale: String = row.get(4);
            println!("row {} {} {} {} {}", occurred_at, object_id, status, generation, stale);
            last = occurred_at;
        }
        printed += rows.len() as u64;
        if rows.len() < want as usize {
            // Nothing more below the horizon now: wait for a notification or POLL.
            // Notifications are off unless status_history.notify is on for the writers, and
            // are sent only when a status changes, so the poll is what guarantees progress;
            // a notification only makes it prompt.
            if session.wait(POLL).await && !woken {
                woken = true;
                println!("woken");
            }
        }
    }
    Ok(())
}

/// The connection settings, from SH_DSN (a libpq-style string or URL; tokio-postgres reads
/// no PG* environment variables and has no defaults, so the user is filled in as libpq would).
fn config_from_env() -> Result<Config, String> {
    let dsn = env::var("SH_DSN").map_err(|_| "SH_DSN is not set".to_owned())?;
    let mut config: Config = dsn.parse().map_err(|e| format!("SH_DSN: {}", e))?;
    if config.get_user().is_none() {
        match env::var("PGUSER").or_else(|_| env::var("USER")) {
            Ok(user) => config.user(&user),
            Err(_) => return Err("SH_DSN has no user, and neither PGUSER nor USER is set".to_owned()),
        };
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("status_history example (Rust)");
    }
    Ok(config)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let config = match config_from_env() {
        Ok(config) => config,
        Err(message) => {
            log(&message);
            return ExitCode::from(2);
        }
    };
    let usage = || {
        eprintln!("{}", USAGE);
        ExitCode::from(2)
    };
    let result = match args.as_slice() {
        ["reporter", object_id, replica_id, generation, count] => match (generation.parse(), count.parse()) {
            (Ok(generation), Ok(count)) => reporter(config, object_id, replica_id, generation, count).await,
            _ => return usage(),
        },
        ["controller", generation, rest @ ..] if rest.len() <= 1 => match generation.parse() {
            Ok(generation) => controller(config, generation, rest.first().copied()).await,
            _ => return usage(),
        },
        ["consumer", after, count] => match count.parse() {
            Ok(count) => consumer(config, after, count).await,
            _ => return usage(),
        },
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            log(&format!("{} failed: {}", args[0], failure.describe()));
            ExitCode::FAILURE
        }
    }
}
