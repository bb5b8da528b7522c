#!/usr/bin/env bash
# The CPU image, built where no image registry is reachable (these machines): the base from
# Debian packages (debootstrap of bookworm with Python, cached as a tarball under
# ${FASTSERVE_CI_CACHE:-~/.cache/fastserve-ci}), torch from the local CPU wheel in
# ${TORCH_WHEELS:-/opt/wheels} when there is one, the rest from PyPI; buildah's layer cache
# makes a rebuild with unchanged sources quick. Needs root, buildah and debootstrap
# (apt-get install buildah debootstrap). Prints the image name.
set -euo pipefail
CACHE=${FASTSERVE_CI_CACHE:-$HOME/.cache/fastserve-ci}
TAG=${TAG:-localhost/fastserve:0.1.0-cpu}
BASE=localhost/fastserve-base:bookworm
WHEELS=${TORCH_WHEELS:-/opt/wheels}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=(buildah --storage-driver vfs)
mkdir -p "$CACHE"
if ! "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
  if [ ! -f "$CACHE/bookworm-python.tar" ]; then
    echo "debootstrap: a minimal bookworm with Python (a few minutes)..." >&2
    rootfs=$(mktemp -d)
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      bookworm "$rootfs" http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" -cf "$CACHE/bookworm-python.tar.tmp" .
    mv "$CACHE/bookworm-python.tar.tmp" "$CACHE/bookworm-python.tar"
    rm -rf "$rootfs"
  fi
  c=$("${B[@]}" from scratch)
  "${B[@]}" add "$c" "$CACHE/bookworm-python.tar" / >/dev/null
  "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
  "${B[@]}" commit --quiet "$c" "$BASE" >/dev/null
  "${B[@]}" rm "$c" >/dev/null
fi
args=(--build-arg "BASE=$BASE" --build-arg VARIANT=cpu)
# This machine's CA bundle for pip during the build (these machines reach PyPI through a proxy
# that re-signs TLS); not copied into the image.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  args+=(--volume /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro
         --build-arg PIP_CERT=/run/host-ca.crt)
fi
if ls "$WHEELS"/torch-*.whl >/dev/null 2>&1; then
  args+=(--volume "$WHEELS:/wheels:ro" --build-arg TORCH_FIND_LINKS=/wheels)
fi
"${B[@]}" bud --quiet --layers --isolation chroot -f "$ROOT/deploy/image/Containerfile" \
  "${args[@]}" -t "$TAG" "$ROOT" >&2
"${B[@]}" rmi --prune >/dev/null 2>&1 || true  # earlier builds' images: vfs copies are large
echo "$TAG"
