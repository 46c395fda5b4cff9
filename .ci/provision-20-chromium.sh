#!/usr/bin/env bash
# CI provisioning for tests/browser: Debian's chromium and its chromedriver (the
# tests drive it headless through selenium, a test extra). Never downloads a browser.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/apt.sh
source .ci/lib/apt.sh

t0=$SECONDS
apt_install chromium chromium-driver
chromedriver --version >&2
echo "chromium: took $((SECONDS - t0)) s" >&2
