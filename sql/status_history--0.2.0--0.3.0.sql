-- status_history upgrade script, 0.2.0 to 0.3.0.
--
-- Brings a 0.2.0 installation to exactly what sql/status_history.sql installs
-- as 0.3.0 (test/t/005_upgrade.pl compares the two catalogs and checks that the
-- data and per-object state survive).  Same rules as the install script:
-- schema-qualify every name and operator, pin search_path on every function,
-- and back-fill any new per-object state from the history.

\echo Use "ALTER EXTENSION status_history UPDATE TO '0.3.0'" to load this file. \quit

-- @@ per-key state (keys)

-- @@ retention (prune)

-- @@ history questions

