#!/bin/sh
# examples/rust/run.sh COMMAND ARGS... -- see README.md here.
# Builds the example offline with Debian's Rust (cargo, rustc) from Debian's crates
# (librust-tokio-postgres-dev, librust-tokio-dev, under /usr/share/cargo/registry), then runs it.
# The build happens in a directory of its own (SH_RUST_BUILD, default ~/.cache/status_history/
# examples-rust): the checkout may be read-only and gets no Cargo.lock or target/.
# Cargo's messages go to stderr; stdout is the program's alone.
set -eu
src=$(cd "$(dirname "$0")" && pwd)
build=${SH_RUST_BUILD:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/status_history/examples-rust}
mkdir -p "$build/cargo-home" "$build/project/src"
cat >"$build/cargo-home/config.toml" <<CONFIG
[source.crates-io]
replace-with = "debian"
[source.debian]
directory = "/usr/share/cargo/registry"
[net]
offline = true
CONFIG
# Debian's cargo and rustc by name: a rustup toolchain earlier on PATH has other versions and
# would not match Debian's crates. One build at a time (the harness starts several commands
# at once); the copy keeps modification times, so an unchanged source builds nothing.
flock "$build/lock" env CARGO_HOME="$build/cargo-home" RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc \
    sh -c 'cp -p "$1/Cargo.toml" "$2/project/" && cp -p "$1"/src/*.rs "$2/project/src/" &&
           exec /usr/bin/cargo build --quiet --manifest-path "$2/project/Cargo.toml" --target-dir "$2/target"' \
    sh "$src" "$build" >&2
exec "$build/target/debug/status-history-example" "$@"
