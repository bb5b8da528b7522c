#!/usr/bin/env bash
# A real kube-apiserver (and etcd) for the discovery and helm install tests: Debian's
# `kubernetes` source package (1.20.2) built with Debian's Go, once; the binary is cached in
# ${FASTSERVE_CI_CACHE:-~/.cache/fastserve-ci}/bin (8-13 minutes on 2 cores the first time).
# Needs root and apt-get (../shared/INFRA.md says how it was found to work).
set -euo pipefail
BIN=${FASTSERVE_CI_CACHE:-$HOME/.cache/fastserve-ci}/bin
mkdir -p "$BIN"
if [ -x "$BIN/kube-apiserver" ] && command -v etcd >/dev/null; then
  echo "kube-apiserver cached in $BIN"; exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "deploy/kube-apiserver.sh: needs root and apt-get" >&2; exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends golang-go etcd-server etcd-client rsync jq \
  dpkg-dev >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq \
  --no-install-recommends golang-go etcd-server etcd-client rsync jq dpkg-dev >/dev/null; }
if [ -x "$BIN/kube-apiserver" ]; then exit 0; fi
src=/etc/apt/sources.list.d/fastserve-src.sources
if [ ! -f "$src" ]; then
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$src"
  apt-get update -qq
fi
work=$(mktemp -d)
cd "$work"
apt-get source --download-only kubernetes >/dev/null
tar xf kubernetes_*.orig.tar.* 
dir=$(find . -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
cd "$dir"
cat > version.env <<'VER'
KUBE_GIT_VERSION='v1.20.2'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'
KUBE_GIT_TREE_STATE='clean'
VER
echo "building kube-apiserver (8-13 minutes on 2 cores)..." >&2
KUBE_GIT_VERSION_FILE=$PWD/version.env CGO_ENABLED=0 make WHAT="cmd/kube-apiserver" >build.log 2>&1 \
  || { tail -30 build.log >&2; exit 1; }
install -m 0755 "$(find _output -type f -name kube-apiserver | head -1)" "$BIN/kube-apiserver"
cd / && rm -rf "$work"
echo "kube-apiserver built into $BIN"
