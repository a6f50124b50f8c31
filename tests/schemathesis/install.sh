#!/usr/bin/env bash
# Installs schemathesis (from PyPI, pinned in requirements.txt) into
# target/schemathesis-venv, reused while its pins match, and prints
#   export ROLLGATE_SCHEMATHESIS=PATH
# for crates/rollgate/tests/openapi.rs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/schemathesis-venv"
# shellcheck source=../support/venv.sh
. "$root/tests/support/venv.sh"
ensure_venv "$here/requirements.txt" "$venv"
"$venv/bin/schemathesis" --version >&2
echo "export ROLLGATE_SCHEMATHESIS=$venv/bin/schemathesis"
