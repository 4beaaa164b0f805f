#!/usr/bin/env bash
# Installs Chromium from Debian's packages for the headless-browser test of `detcheck check
# --report-dir`'s HTML pages (tests/reports.rs); used by .ci/run. Idempotent: nothing is done
# when a chromium binary is already on the PATH. Without Chromium that test skips with a message
# (unless DETCHECK_REQUIRE_CHROMIUM is set, as CI sets it).
#
#   bash scripts/install-chromium.sh          # then: cargo test --test reports
set -euo pipefail

for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        echo "install-chromium.sh: $("$name" --version 2>/dev/null || echo "$name") is installed"
        exit 0
    fi
done

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo=sudo; fi
echo "== apt-get install chromium (headless use: no recommended packages)"
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium
chromium --version
