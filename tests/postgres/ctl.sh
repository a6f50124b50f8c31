#!/usr/bin/env bash
# Stops, starts, restarts or crashes the PostgreSQL that start.sh made:
#   tests/postgres/ctl.sh stop|start|restart|crash [DIR]   (DIR: $ROLLGATE_POSTGRES_DIR)
# `stop` also removes its directory; `crash` stops it in immediate mode (no
# shutdown checkpoint, clients cut: what a killed server leaves, recovered
# from its WAL) and starts it again.
set -euo pipefail
cmd="${1:?stop|start|restart}"
dir="${2:-${ROLLGATE_POSTGRES_DIR:?}}"
# shellcheck disable=SC1091
source "$dir/env"
opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200"
case "$cmd" in
  stop) "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true; rm -rf "$dir" ;;
  start|restart) "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -m fast -w -t 60 -o "$opts" "$cmd" >&2 ;;
  crash)
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >&2
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 -o "$opts" start >&2 ;;
  *) echo "usage: $0 stop|start|restart|crash [DIR]" >&2; exit 2 ;;
esac
