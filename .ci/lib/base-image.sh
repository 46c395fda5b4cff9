# Sourced by .ci/provision-10-docker.sh: make the local base image the Dockerfiles
# build FROM in CI. No image registry is reachable here, so instead of pulling
# python:3.11-slim we debootstrap a minimal Debian with python3 + venv and
# `docker import` it. Skipped when the image already exists (about a minute otherwise).

BASE_IMAGE="${BASE_IMAGE:-fusion-tuner/base:bookworm}"
BASE_SUITE="${BASE_SUITE:-bookworm}"
BASE_MIRROR="${BASE_MIRROR:-http://deb.debian.org/debian}"

make_base_image() {
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "docker: base image $BASE_IMAGE exists" >&2
        return 0
    fi
    local root
    root="$(mktemp -d /var/tmp/fusion-tuner-base.XXXXXX)"
    echo "docker: debootstrapping $BASE_SUITE into $root (log: $root.log)" >&2
    if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            "$BASE_SUITE" "$root" "$BASE_MIRROR" >"$root.log" 2>&1; then
        echo "error: debootstrap failed; last log lines:" >&2
        tail -n 20 "$root.log" >&2
        rm -rf "$root"
        return 1
    fi
    # Trim what a runtime image never needs; keeps the import (and every build) small.
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
           "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    tar -C "$root" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        - "$BASE_IMAGE" >/dev/null
    rm -rf "$root" "$root.log"
    echo "docker: imported $BASE_IMAGE" >&2
}
