#!/usr/bin/env bash
# Starts a throwaway PostgreSQL (Debian's `postgresql` package) on
# 127.0.0.1, in a temporary directory, as an unprivileged user, for the
# tests. Prints shell assignments to eval:
#   export ROLLGATE_TEST_POSTGRES=postgres://rollgate@127.0.0.1:PORT/postgres
#   export ROLLGATE_POSTGRES_DIR=DIR   (stop it with: tests/postgres/ctl.sh stop)
# Installs the package with apt-get when its binaries are absent and this
# runs as root (CI); otherwise says what is missing and fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bindir() {
  if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
    pg_config --bindir; return
  fi
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}
bin="$(bindir || true)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing PostgreSQL (apt-get install postgresql)" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
    bin="$(bindir)"
  else
    echo "PostgreSQL is not installed: apt-get install postgresql (or put initdb on PATH)" >&2
    exit 1
  fi
fi
dir="$(mktemp -d /tmp/rollgate-postgres.XXXX)"
# PostgreSQL refuses to run as root: run it as the package's user.
as=()
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --home-dir /nonexistent postgres
  chown postgres "$dir"
  as=(runuser -u postgres --)
fi
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"${as[@]}" "$bin/initdb" -D "$dir/data" -U rollgate --auth=trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
cat >"$dir/env" <<ENV
bin=$bin
port=$port
as=(${as[*]})
ENV
# fsync stays on: the tests restart and kill it and expect commits to survive.
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2 \
  || { cat "$dir/postgres.log" >&2; exit 1; }
echo "export ROLLGATE_TEST_POSTGRES=postgres://rollgate@127.0.0.1:$port/postgres"
echo "export ROLLGATE_POSTGRES_DIR=$dir"
