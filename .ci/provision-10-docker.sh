#!/usr/bin/env bash
# CI provisioning for tests/docker and the compose stack, on a machine with no
# engine and no registry: Debian's docker.io, a background dockerd, a debootstrapped
# base image, then the project's images built FROM it (backend, tools, postgres).
# Idempotent; each step is skipped when its result exists (a few seconds then).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/apt.sh
source .ci/lib/apt.sh
# shellcheck source=lib/dockerd.sh
source .ci/lib/dockerd.sh
# shellcheck source=lib/base-image.sh
source .ci/lib/base-image.sh

step() {  # step NAME COMMAND...: run and print its duration (CI cost accounting)
    local name="$1" t0=$SECONDS
    shift
    "$@"
    echo "docker: $name took $((SECONDS - t0)) s" >&2
}

build_images() {
    export BASE_IMAGE
    .ci/lib/build-image.sh backend/Dockerfile backend fusion-tuner/backend:local >/dev/null
    .ci/lib/build-image.sh docker/tools.Dockerfile docker fusion-tuner/tools:local >/dev/null
    .ci/lib/build-image.sh docker/postgres.Dockerfile docker fusion-tuner/postgres:local >/dev/null
    # Older builds of these images, untagged by the new ones: reclaim their disk.
    docker image prune -f --filter label=fusion-tuner.image >/dev/null
}

step "apt (docker.io, debootstrap)" apt_install docker.io debootstrap
step "dockerd" start_dockerd
step "base image" make_base_image
step "images (backend, tools, postgres)" build_images
