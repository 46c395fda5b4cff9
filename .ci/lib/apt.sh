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
    local log
    log="$(mktemp /tmp/fusion-tuner-apt.XXXXXX.log)"
    echo "apt: installing $missing (log: $log)" >&2
    if [[ -z "${_APT_UPDATED:-}" ]]; then
        apt-get update -qq >>"$log" 2>&1 || { tail -n 20 "$log" >&2; return 1; }
        _APT_UPDATED=1
    fi
    # shellcheck disable=SC2086  # word splitting of the package list is intended
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >>"$log" 2>&1; then
        echo "error: apt-get install $missing failed; last log lines:" >&2
        tail -n 20 "$log" >&2
        return 1
    fi
    rm -f "$log"
}
