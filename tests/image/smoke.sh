#!/usr/bin/env bash
# The image's smoke test: builds rollgate's image from BINARY with
# deploy/image/build.sh (buildah, nothing pulled), then runs the image's own
# binary (`rollgate --version`, `rollgate demo --simulated`) and checks what
# the image is: its user (65532, not root), its entrypoint, no shell, its
# size, an OCI archive written. Removes what it built.
#   tests/image/smoke.sh [BINARY]     (default target/debug/rollgate)
set -euo pipefail
cd "$(dirname "$0")/../.."
binary="${1:-target/debug/rollgate}"
driver="${BUILDAH_STORAGE_DRIVER:-vfs}"
tag="localhost/rollgate:smoke-$$"
work="$(mktemp -d)"
b() { buildah --storage-driver "$driver" "$@"; }
ctr=""
cleanup() {
  [ -n "$ctr" ] && b rm "$ctr" >/dev/null 2>&1 || true
  b rmi "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "image smoke test: $*" >&2; exit 1; }

deploy/image/build.sh "$binary" "$tag" "$work/rollgate.oci.tar" >/dev/null
[ -s "$work/rollgate.oci.tar" ] || fail "no OCI archive written"

user="$(b inspect --format '{{.OCIv1.Config.User}}' "$tag")"
[ "$user" = "65532:65532" ] || fail "runs as '$user', not 65532:65532"
entrypoint="$(b inspect --format '{{.OCIv1.Config.Entrypoint}}' "$tag")"
[ "$entrypoint" = '[/usr/local/bin/rollgate]' ] || fail "entrypoint $entrypoint"
bytes="$(du -sb "$work/rollgate.oci.tar" | cut -f1)"
# The stripped binary and a few libraries: compressed, well under 32 MB.
[ "$bytes" -lt $((32 * 1024 * 1024)) ] || fail "the image is $bytes bytes compressed"

ctr="$(b from --quiet "$tag")"
run() { timeout 120 buildah --storage-driver "$driver" run --isolation chroot "$ctr" -- "$@"; }
version="$(run /usr/local/bin/rollgate --version)"
[[ "$version" == "rollgate "* ]] || fail "--version printed '$version'"
demo="$(run /usr/local/bin/rollgate demo --simulated 2>&1)" || fail "demo --simulated failed: $demo"
grep -q "PROMOTED" <<<"$demo" || fail "the demo promoted nothing: $demo"
[ "$(grep -c "ROLLED BACK" <<<"$demo")" = 2 ] || fail "the demo did not roll back two: $demo"
# What it writes belongs to its user, not root: train the demo's models
# into its home and read the files' owner from the container's filesystem.
run /usr/local/bin/rollgate train --out /home/rollgate/models >/dev/null
rootfs="$(b mount "$ctr")"
uid="$(stat -c %u "$rootfs/home/rollgate/models/champion.json")"
tmp_mode="$(stat -c %a "$rootfs/tmp")"
shells="$(find "$rootfs" -name sh -o -name bash -o -name busybox | wc -l)"
b umount "$ctr" >/dev/null
[ "$tmp_mode" = 1777 ] || fail "/tmp has mode $tmp_mode, not 1777"
[ "$shells" = 0 ] || fail "the image has a shell"
[ "$uid" = 65532 ] || fail "the binary wrote as uid $uid, not 65532"
echo "image: $version, user $user, $bytes bytes compressed (OCI archive); files written by uid $uid; demo: PROMOTED 1, ROLLED BACK 2; no shell"
