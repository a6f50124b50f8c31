#!/usr/bin/env bash
# Builds rollgate's image from a built binary with buildah, pulling nothing:
#   deploy/image/build.sh BINARY TAG [OCI_ARCHIVE]
# BINARY: e.g. target/release/rollgate (copied stripped); TAG: the image's
# name (e.g. rollgate:0.1.0); OCI_ARCHIVE: also write the image there
# (`buildah push … oci-archive:FILE`), for a registry push elsewhere.
# The image holds the binary, the shared libraries `ldd` says it links (and
# the dynamic loader), /etc/passwd and /etc/group naming user 65532, and a
# writable /tmp and home. buildah with vfs storage and chroot isolation
# ($BUILDAH_STORAGE_DRIVER, default vfs): no daemon, no privileged runtime.
set -euo pipefail
binary="$1"; tag="$2"; archive="${3:-}"
here="$(cd "$(dirname "$0")" && pwd)"
driver="${BUILDAH_STORAGE_DRIVER:-vfs}"
command -v buildah >/dev/null || { echo "buildah is missing: apt-get install buildah" >&2; exit 1; }
[ -x "$binary" ] || { echo "no binary at $binary (cargo build --release -p rollgate)" >&2; exit 1; }
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp" "$ctx/home"
echo "rollgate writes here" >"$ctx/home/.keep"
cp "$binary" "$root/usr/local/bin/rollgate"
strip "$root/usr/local/bin/rollgate"
# The shared libraries it links, at the paths the loader looks for them
# (a static binary needs none; a library ldd cannot find is an error).
if libs="$(ldd "$binary" 2>&1)"; then
  if grep -q "not found" <<<"$libs"; then
    echo "$binary links a library this machine lacks:" >&2; grep "not found" <<<"$libs" >&2; exit 1
  fi
  awk '/=> \//{print $3} /^\t\/lib/{print $1}' <<<"$libs" | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
elif ! grep -q "not a dynamic executable\|statically linked" <<<"$libs"; then
  echo "ldd $binary: $libs" >&2; exit 1
fi
echo "rollgate:x:65532:65532:rollgate:/home/rollgate:/nonexistent" >"$root/etc/passwd"
echo "rollgate:x:65532:" >"$root/etc/group"
chmod 1777 "$root/tmp"
cp "$here/Containerfile" "$ctx/Containerfile"
buildah --storage-driver "$driver" bud --isolation chroot --quiet -f "$ctx/Containerfile" -t "$tag" "$ctx" >/dev/null
if [ -n "$archive" ]; then
  buildah --storage-driver "$driver" push --quiet "$tag" "oci-archive:$archive:$tag"
fi
echo "$tag"
