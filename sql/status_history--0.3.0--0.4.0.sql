\echo Use "ALTER EXTENSION status_history UPDATE TO '0.4.0'" to load this file. \quit
