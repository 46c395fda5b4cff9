# Sourced by .ci/provision-*.sh: install Debian packages only when missing.
# `apt-get update` runs at most once per provisioning run and only when something
# is actually missing, so a provisioned machine pays nothing.

apt_missing() {
    local pkg missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q '^install ok installed$' \
            || missing+=("$pkg")
    done
    echo "${missing[@]}"
}

apt_install() {
    local missing
    missing="$(apt_missing "$@")"
    [[ -z "$missing" ]] && return 0
    echo "apt: installing $missing" >&2
    if [[ -z "${_APT_UPDATED:-}" ]]; then
        apt-get update -qq >&2
        _APT_UPDATED=1
    fi
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2
}
