#!/usr/bin/env bash
# Build one of the project's images from the local base image (CI, tests, bench).
#
#   .ci/lib/build-image.sh DOCKERFILE CONTEXT_DIR TAG
#
# Builds run with --network host and the machine's CA bundle copied into a
# temporary copy of the context as build-ca.crt: the Dockerfiles pip install from
# the public index, and this machine reaches it only through a TLS-intercepting
# proxy. The repo itself is never written to. Layer caching makes a rebuild of an
# unchanged tree take a second or two.
set -euo pipefail

if [[ $# -ne 3 ]]; then
    echo "usage: $0 DOCKERFILE CONTEXT_DIR TAG" >&2
    exit 2
fi
dockerfile="$(realpath "$1")"
context="$(realpath "$2")"
tag="$3"
base="${BASE_IMAGE:-fusion-tuner/base:bookworm}"
ca="${BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp" "$tmp.log"' EXIT
# Leave out what never goes into an image (data sets, caches) before copying; the
# context's .dockerignore filters the rest when it is sent.
tar -C "$context" -c --exclude=./data --exclude=./.cache --exclude='*.egg-info' \
    --exclude=__pycache__ . | tar -C "$tmp" -x
if [[ -f "$ca" ]]; then cp "$ca" "$tmp/build-ca.crt"; fi

# The legacy builder: buildx is not installed, and BuildKit would try to pull its
# frontend image from a registry this machine cannot reach.
if ! DOCKER_BUILDKIT=0 docker build --network host --build-arg "BASE_IMAGE=$base" \
        -f "$dockerfile" -t "$tag" "$tmp" >"$tmp.log" 2>&1; then
    echo "error: docker build of $tag ($dockerfile) failed; last lines of the build log:" >&2
    tail -n 30 "$tmp.log" >&2
    rm -f "$tmp.log"
    exit 1
fi
rm -f "$tmp.log"
echo "$tag"
