#!/bin/sh
# examples/python/run.sh COMMAND ARGS... -- see examples/README.md.
# Debian's Python with Debian's psycopg 3 (python3-psycopg), whatever python3
# comes first on PATH; -B writes no __pycache__ into the source tree.
exec /usr/bin/python3 -B "$(dirname "$0")/client.py" "$@"
