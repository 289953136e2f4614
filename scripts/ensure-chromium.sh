#!/usr/bin/env bash
# Makes a headless Chromium available for the dashboard's browser tests:
# scripts/ensure-chromium.sh
# The tests drive the system browser through Playwright (tests/dashboard/); Playwright's
# own browser downloads are never used. With FERRYQ_TEST_CHROMIUM naming an executable, or
# with /usr/bin/chromium installed, this does nothing. Otherwise, as root on Debian or
# Ubuntu, it installs the `chromium` and `chromium-driver` packages.
set -euo pipefail

browser="${FERRYQ_TEST_CHROMIUM:-/usr/bin/chromium}"

if [ -x "$browser" ]; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: $browser not found; installing the chromium packages" >&2
  if apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
    && [ -x "$browser" ]; then
    echo "ensure-chromium: $("$browser" --version 2>/dev/null || echo chromium) installed" >&2
    exit 0
  fi
  echo "ensure-chromium: installing Chromium with apt-get failed" >&2
else
  echo "ensure-chromium: no Chromium at $browser." >&2
  echo "  Install it (Debian/Ubuntu: sudo apt-get install chromium chromium-driver), run" >&2
  echo "  'make test' as root to have it installed, or set FERRYQ_TEST_CHROMIUM to a" >&2
  echo "  Chromium executable." >&2
fi
case "${CI:-}" in
  [Tt][Rr][Uu][Ee] | 1)
    echo "ensure-chromium: CI=$CI, so the dashboard's browser tests cannot be skipped" >&2
    exit 1
    ;;
esac
echo "ensure-chromium: the dashboard's browser tests will be skipped" >&2
exit 0
