#!/usr/bin/env bash
# Stops, starts or restarts the PostgreSQL that start.sh made:
#   tests/postgres/ctl.sh stop|start|restart [DIR]   (DIR: $ROLLGATE_POSTGRES_DIR)
# `stop` also removes its directory.
set -euo pipefail
cmd="${1:?stop|start|restart}"
dir="${2:-${ROLLGATE_POSTGRES_DIR:?}}"
# shellcheck disable=SC1091
source "$dir/env"
opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200"
case "$cmd" in
  stop) "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true; rm -rf "$dir" ;;
  start|restart) "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -m fast -w -t 60 -o "$opts" "$cmd" >&2 ;;
  *) echo "usage: $0 stop|start|restart [DIR]" >&2; exit 2 ;;
esac
