#!/usr/bin/env bash
# Installs what the dashboard's browser test needs and prints
#   export ROLLGATE_CHROMIUM=PATH
# for crates/rollgate/tests/dashboard.rs: Debian's Chromium (apt-get, when
# absent and root) and playwright-core from npm (pinned in
# package-lock.json, installed into tests/browser/node_modules).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
chromium="$(command -v chromium || true)"
if [ -z "$chromium" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium) >&2
    chromium="$(command -v chromium)"
  else
    echo "chromium is missing: apt-get install chromium" >&2; exit 1
  fi
fi
"$chromium" --version >&2
command -v npm >/dev/null || { echo "npm is missing: it comes with Node.js" >&2; exit 1; }
if [ ! -d "$here/node_modules/playwright-core" ] || [ "$here/package-lock.json" -nt "$here/node_modules/.package-lock.json" ]; then
  (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) >&2
fi
echo "export ROLLGATE_CHROMIUM=$chromium"
