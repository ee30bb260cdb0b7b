# Sourced by test/poolers.sh (uses its server, srv and check): what the owner
# of a database, not a superuser, can do after a superuser ran
# CREATE EXTENSION status_history in it (docs/HOSTING.md).
srv -d postgres -c "CREATE ROLE dbowner LOGIN" -c "CREATE ROLE app LOGIN" \
    -c "CREATE DATABASE hosted OWNER dbowner"
DB=hosted srv -c "CREATE EXTENSION status_history"
own() {   # own SQL...: run as dbowner in hosted, print the SQLSTATE or ok; the
          # library is loaded first (a call), unless NOLOAD=1
    local out
    if out=$(as_pg psql -X -q -At -h 127.0.0.1 -p $PGPORT_SRV -U dbowner -d hosted -v ON_ERROR_STOP=1 \
             -v VERBOSITY=sqlstate ${NOLOAD:+-c "SELECT 1"} ${NOLOAD:--c "SELECT FROM status_history.stable_horizon()"} "$@" 2>&1 >/dev/null)
    then echo ok; else grep -o '[0-9A-Z]\{5\}' <<<"$out" | tail -1; fi
}
# Before any grant: reads (PUBLIC), user settings, ALTER DATABASE SET.
check "owner: reads statuses (PUBLIC reads by default)" ok "$(own -c "SELECT * FROM status_history.statuses")"
check "owner: report() without INSERT granted" 42501 "$(own -c "SELECT status_history.report('h1', 'running')")"
check "owner: grant_roles()" 42501 "$(own -c "SELECT status_history.grant_roles(reporter => 'app', controller => 'app', reader => 'app', admin => 'app', public_reads => true)")"
check "owner: CREATE ROLE (no CREATEROLE)" 42501 "$(own -c "CREATE ROLE sh_reporter NOLOGIN")"
own -c "GRANT INSERT ON status_history.history TO app" >/dev/null   # a WARNING, nothing granted
check "owner: GRANT INSERT on the history grants nothing" f \
    "$(DB=hosted srv -c "SELECT has_table_privilege('app', 'status_history.history', 'INSERT')")"
check "owner: reconnect()" 42501 "$(own -c "SELECT status_history.reconnect(2, NULL, ARRAY['h1'])")"
check "owner: prune()" 42501 "$(own -c "SELECT status_history.prune()")"
check "owner: ALTER DATABASE SET status_history.notify before the library is loaded" 42501 \
    "$(NOLOAD=1 own -c "ALTER DATABASE hosted SET status_history.notify = on")"
check "owner: ALTER DATABASE SET status_history.notify" ok "$(own -c "ALTER DATABASE hosted SET status_history.notify = on")"
check "owner: ALTER DATABASE SET status_history.deduplicate" ok "$(own -c "ALTER DATABASE hosted SET status_history.deduplicate = on")"
check "owner: ALTER DATABASE SET status_history.notice_stale" ok "$(own -c "ALTER DATABASE hosted SET status_history.notice_stale = on")"
check "owner: ALTER DATABASE SET status_history.max_import_lead" 42501 "$(own -c "ALTER DATABASE hosted SET status_history.max_import_lead = -1")"
check "owner: a session SET of max_import_lead before the library is loaded is dropped when it loads" 10s \
    "$(as_pg psql -X -q -At -h 127.0.0.1 -p $PGPORT_SRV -U dbowner -d hosted -c "SET status_history.max_import_lead = -1" \
       -c "SELECT current_setting('status_history.max_import_lead') FROM status_history.stable_horizon()" 2>/dev/null)"
check "owner: SET status_history.import_below_horizon" 42501 "$(own -c "SET status_history.import_below_horizon = on")"
check "owner: ALTER SYSTEM SET shared_preload_libraries" 42501 "$(own -c "ALTER SYSTEM SET shared_preload_libraries = 'status_history'")"
check "owner: DROP EXTENSION" 42501 "$(own -c "DROP EXTENSION status_history")"
check "owner: CREATE TRIGGER on the history" 42501 "$(own -c "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NEW; END'" -c "CREATE TRIGGER t BEFORE INSERT ON status_history.history FOR EACH ROW EXECUTE FUNCTION f()")"
check "owner: CREATE FUNCTION in the extension's schema" 42501 "$(own -c "CREATE FUNCTION status_history.x() RETURNS int LANGUAGE sql AS 'SELECT 1'")"
check "the settings the owner set apply to new sessions" "on" "$(DB=hosted srv -c "SELECT current_setting('status_history.notify') FROM status_history.stable_horizon()")"
# The superuser's part: the roles, grant_roles(), the groups to the owner WITH ADMIN OPTION.
srv -d postgres -c "CREATE ROLE sh_reporter NOLOGIN" -c "CREATE ROLE sh_controller NOLOGIN" \
    -c "CREATE ROLE sh_reader NOLOGIN" -c "CREATE ROLE sh_admin NOLOGIN" \
    -c "GRANT sh_reporter, sh_controller, sh_reader, sh_admin TO dbowner WITH ADMIN OPTION"
DB=hosted srv -c "SELECT status_history.grant_roles(reporter => 'sh_reporter', controller => 'sh_controller', reader => 'sh_reader', admin => 'sh_admin', public_reads => true)" >/dev/null
check "owner with ADMIN OPTION: GRANT sh_reporter TO app" ok "$(own -c "GRANT sh_reporter TO app")"
check "app (granted by the owner): report()" ok \
    "$(as_pg psql -X -q -h 127.0.0.1 -p $PGPORT_SRV -U app -d hosted -v ON_ERROR_STOP=1 -c "SELECT status_history.report('h1', 'running', generation => 1)" >/dev/null 2>&1 && echo ok || echo failed)"
check "owner (member of sh_controller): reconnect()" ok "$(own -c "SELECT status_history.reconnect(2, NULL, ARRAY['h1'])")"
check "owner (member of sh_admin): prune()" ok "$(own -c "SELECT status_history.prune()")"
check "owner (member of sh_admin): an import with occurred_at (above the horizon)" ok \
    "$(own -c "INSERT INTO status_history.history (occurred_at, object_id, status, generation) VALUES (status_history.monotonic_now() + interval '1 second', 'h2', 'running', 2)")"
check "owner (member of sh_admin): an import below the horizon (needs import_below_horizon, a superuser's)" 55000 \
    "$(own -c "INSERT INTO status_history.history (occurred_at, object_id, status, generation) VALUES (status_history.monotonic_now() - interval '1 day', 'h3', 'running', 2)")"
check "owner (member of sh_admin): max_import_lead stays superuser-only" 42501 "$(own -c "SET status_history.max_import_lead = -1")"
check "the reconnect and the import are stored" "2 1" \
    "$(DB=hosted srv -F' ' -c "SELECT (SELECT fence FROM status_history.objects WHERE object_id = 'h1'), (SELECT count(*) FROM status_history.history WHERE object_id = 'h2')")"
