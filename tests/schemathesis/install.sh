#!/usr/bin/env bash
# Installs schemathesis (from PyPI, pinned in requirements.txt) into
# target/schemathesis-venv, reused while its pins match, and prints
#   export ROLLGATE_SCHEMATHESIS=PATH
# for crates/rollgate/tests/openapi.rs.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="$root/target/schemathesis-venv"
python="${PYTHON:-python3}"
if ! cmp -s "$here/requirements.txt" "$venv/requirements.txt" 2>/dev/null; then
  rm -rf "$venv"
  "$python" -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt" >&2
  cp "$here/requirements.txt" "$venv/requirements.txt"
fi
"$venv/bin/schemathesis" --version >&2
echo "export ROLLGATE_SCHEMATHESIS=$venv/bin/schemathesis"
