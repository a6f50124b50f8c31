#!/usr/bin/env bash
# Starts a throwaway Kubernetes API server for custom resources (etcd and
# apiextensions-apiserver, prebuilt: ../shared/k8s/README.md) on 127.0.0.1,
# in a temporary directory, and installs the CRDs of tests/k8s/crds and deploy/kubernetes/crds.yaml. Prints
# shell assignments to eval:
#   export ROLLGATE_K8S_URL=https://127.0.0.1:PORT
#   export ROLLGATE_K8S_CA=DIR/certs/apiserver.crt   (its self-signed certificate)
#   export ROLLGATE_K8S_DIR=DIR   (stop it with: tests/k8s/ctl.sh stop DIR)
#   export ROLLGATE_K8S_BIN_DIR=BIN
# The binaries come from $ROLLGATE_K8S_BIN_DIR, else ../shared/k8s/bin beside
# the repository; where they are absent it says how to get them and fails.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${ROLLGATE_K8S_BIN_DIR:-$here/../../../shared/k8s/bin}"
for b in etcd crd-apiserver; do
  if [ ! -x "$bin/$b" ]; then
    echo "no $b in $bin: set ROLLGATE_K8S_BIN_DIR to the directory holding the prebuilt etcd and" >&2
    echo "crd-apiserver (../shared/k8s/bin; ../shared/k8s/README.md says how they are built)" >&2
    exit 1
  fi
done
bin="$(cd "$bin" && pwd)"
dir="$(mktemp -d /tmp/rollgate-k8s.XXXX)"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_port="$(free_port)"; peer_port="$(free_port)"; api_port="$(free_port)"
cat >"$dir/env" <<ENV
bin=$bin
etcd_port=$etcd_port
peer_port=$peer_port
api_port=$api_port
ENV
"$here/ctl.sh" start "$dir" >&2
url="https://127.0.0.1:$api_port"
# The routing kinds the adapters write (tests/k8s/crds) and rollgate's own
# (deploy/kubernetes/crds.yaml, as users apply them).
for crd in "$here"/crds/*.yaml "$here/../../deploy/kubernetes/crds.yaml"; do
  # One CRD per document.
  awk -v out="$dir/crd-$(basename "$crd" .yaml)" 'BEGIN{n=0} /^---/{n++; next} {print > (out "-" n ".yaml")}' "$crd"
done
for doc in "$dir"/crd-*.yaml; do
  grep -q '^kind: CustomResourceDefinition' "$doc" || continue
  code="$(curl -sS --max-time 10 -o "$dir/crd.out" -w '%{http_code}' --cacert "$dir/certs/apiserver.crt" -X POST \
    -H 'Content-Type: application/yaml' --data-binary @"$doc" \
    "$url/apis/apiextensions.k8s.io/v1/customresourcedefinitions")"
  if [ "$code" != 201 ]; then
    echo "installing $doc answered $code:" >&2; cat "$dir/crd.out" >&2
    "$here/ctl.sh" stop "$dir"; exit 1
  fi
done
# Established before any test writes one.
for doc in "$dir"/crd-*.yaml; do
  name="$(awk '/^metadata:/{m=1} m && /^  name:/{print $2; exit}' "$doc")"
  [ -n "$name" ] || continue
  established=no
  for _ in $(seq 100); do
    crd="$(curl -sS --max-time 2 --cacert "$dir/certs/apiserver.crt" \
      "$url/apis/apiextensions.k8s.io/v1/customresourcedefinitions/$name" || true)"
    if grep -q '"type": "Established",' <<<"$crd"; then established=yes; break; fi
    sleep 0.1
  done
  if [ "$established" != yes ]; then
    echo "the CRD $name was not established within 10 s" >&2
    "$here/ctl.sh" stop "$dir"; exit 1
  fi
done
# The resources answer (not only their definitions).
sleep 0.5
echo "export ROLLGATE_K8S_URL=$url"
echo "export ROLLGATE_K8S_CA=$dir/certs/apiserver.crt"
echo "export ROLLGATE_K8S_DIR=$dir"
echo "export ROLLGATE_K8S_BIN_DIR=$bin"
