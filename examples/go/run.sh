#!/bin/sh
# examples/go/run.sh COMMAND ARGS... -- see examples/README.md.
# Built offline from Debian's packages (golang-go, golang-github-jackc-pgx-v4-dev
# under /usr/share/gocode) in GOPATH mode, into a cache directory outside the
# source tree; go's build cache makes every build after the first quick.
set -eu
src=$(cd "$(dirname "$0")" && pwd)
cache=${SH_EXAMPLES_CACHE:-${TMPDIR:-/tmp}/status_history-examples-$(id -u)}/go
mkdir -p "$cache"
GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS="" GOCACHE="$cache/gocache" \
    go build -o "$cache/client" "$src/main.go"
exec "$cache/client" "$@"
