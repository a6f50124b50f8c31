#!/usr/bin/env bash
# Starts a throwaway PostgreSQL (Debian's `postgresql` package) on
# 127.0.0.1, in a temporary directory, as an unprivileged user, for the
# tests. Prints shell assignments to eval:
#   export ROLLGATE_TEST_POSTGRES=postgres://rollgate@127.0.0.1:PORT/postgres
#   export ROLLGATE_POSTGRES_DIR=DIR   (stop it with: tests/postgres/ctl.sh stop)
#   export ROLLGATE_POSTGRES_CA=DIR/tls/ca.crt   (TLS: the server's certificate, for
#     127.0.0.1 only, is signed by this throwaway CA; so is a client certificate,
#     DIR/tls/client.{crt,key}, for role rollgate_cert, which must log in with it)
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
# TLS (plain connections still work): a throwaway CA, the server's
# certificate for IP 127.0.0.1 only (so verify-full to "localhost" fails and
# verify-ca passes), and a client certificate for role rollgate_cert.
tls="$dir/tls"; mkdir -p "$tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj "/CN=rollgate test CA" -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
sign() { # name subject san
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$2" \
    -keyout "$tls/$1.key" -out "$tls/$1.csr" 2>/dev/null
  printf '%s\n' "$3" >"$tls/$1.ext"
  openssl x509 -req -in "$tls/$1.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial \
    -days 2 -extfile "$tls/$1.ext" -out "$tls/$1.crt" 2>/dev/null
}
sign server "/CN=127.0.0.1" "subjectAltName=IP:127.0.0.1"
sign client "/CN=rollgate_cert" "keyUsage=digitalSignature"
chmod 600 "$tls"/*.key
if [ ${#as[@]} -gt 0 ]; then chown postgres "$tls/server.key" "$tls/server.crt" "$tls/ca.crt"; fi
cat >>"$dir/data/postgresql.conf" <<CONF
ssl = on
ssl_cert_file = '$tls/server.crt'
ssl_key_file = '$tls/server.key'
ssl_ca_file = '$tls/ca.crt'
CONF
# rollgate_cert logs in only over TLS with its certificate; every other
# role as before.
printf 'hostssl all rollgate_cert 127.0.0.1/32 cert\nhost all rollgate_cert 127.0.0.1/32 reject\n%s\n' \
  "$(cat "$dir/data/pg_hba.conf")" >"$dir/data/pg_hba.conf"
cat >"$dir/env" <<ENV
bin=$bin
port=$port
as=(${as[*]})
ENV
# fsync stays on: the tests restart and kill it and expect commits to survive.
"${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2 \
  || { cat "$dir/postgres.log" >&2; exit 1; }
"$bin/psql" -h 127.0.0.1 -p "$port" -U rollgate -d postgres -q \
  -c "CREATE ROLE rollgate_cert LOGIN SUPERUSER" >&2
echo "export ROLLGATE_TEST_POSTGRES=postgres://rollgate@127.0.0.1:$port/postgres"
echo "export ROLLGATE_POSTGRES_DIR=$dir"
echo "export ROLLGATE_POSTGRES_CA=$tls/ca.crt"
