#!/usr/bin/env bash
# Makes the pgbouncer binary available for the pooler tests: scripts/ensure-pgbouncer.sh
# The tests start their own PgBouncer in transaction mode in front of their throwaway
# PostgreSQL (tests/pgbouncer.py); nothing here configures or starts a pooler. With
# FERRYQ_TEST_PGBOUNCER naming an executable, or with pgbouncer already installed, this
# does nothing. Otherwise, as root on Debian or Ubuntu, it installs the `pgbouncer`
# package without letting the package start its own service.
set -euo pipefail

POLICY=/usr/sbin/policy-rc.d

find_pgbouncer() {
  local found
  if [ -n "${FERRYQ_TEST_PGBOUNCER:-}" ]; then
    [ -x "$FERRYQ_TEST_PGBOUNCER" ] && echo "$FERRYQ_TEST_PGBOUNCER" && return 0
    return 1
  fi
  found=$(command -v pgbouncer 2>/dev/null || true)
  [ -z "$found" ] && [ -x /usr/sbin/pgbouncer ] && found=/usr/sbin/pgbouncer
  [ -n "$found" ] && echo "$found" && return 0
  return 1
}

# Debian's package starts a pgbouncer service of its own on port 6432 once installed.
# The tests never use it, so a policy-rc.d that refuses it is in place for the install
# (unless the machine already has a policy of its own, which then decides), and a
# service that started all the same is stopped and disabled afterwards.
install_pgbouncer() {
  local own_policy=""
  if [ ! -e "$POLICY" ]; then
    own_policy=yes
    printf '#!/bin/sh\n[ "$1" = pgbouncer ] && exit 101\nexit 0\n' >"$POLICY"
    chmod 755 "$POLICY"
    trap 'rm -f "$POLICY"' EXIT
  fi
  local status=0
  { apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq pgbouncer >/dev/null; } || status=$?
  if [ -n "$own_policy" ]; then
    rm -f "$POLICY"
    trap - EXIT
  fi
  stop_package_service
  return $status
}

stop_package_service() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    if systemctl is-active --quiet pgbouncer 2>/dev/null; then
      echo "ensure-pgbouncer: stopping the package's own pgbouncer service (tests use their own)" >&2
    fi
    systemctl stop pgbouncer >/dev/null 2>&1 || true
    systemctl disable pgbouncer >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/pgbouncer ] && /etc/init.d/pgbouncer status >/dev/null 2>&1; then
    echo "ensure-pgbouncer: stopping the package's own pgbouncer service (tests use their own)" >&2
    /etc/init.d/pgbouncer stop >/dev/null 2>&1 || true
  fi
}

if find_pgbouncer >/dev/null; then
  exit 0
fi
if [ -n "${FERRYQ_TEST_PGBOUNCER:-}" ]; then
  echo "ensure-pgbouncer: FERRYQ_TEST_PGBOUNCER=$FERRYQ_TEST_PGBOUNCER is not an executable" >&2
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-pgbouncer: pgbouncer not found; installing the pgbouncer package" >&2
  if install_pgbouncer && find_pgbouncer >/dev/null; then
    echo "ensure-pgbouncer: $("$(find_pgbouncer)" --version 2>/dev/null | head -n 1) installed" >&2
    exit 0
  fi
  echo "ensure-pgbouncer: installing PgBouncer with apt-get failed" >&2
else
  echo "ensure-pgbouncer: pgbouncer not found." >&2
  echo "  Install it (Debian/Ubuntu: sudo apt-get install pgbouncer, then" >&2
  echo "  sudo systemctl disable --now pgbouncer: the tests start their own), run" >&2
  echo "  'make test' as root to have it installed, or set FERRYQ_TEST_PGBOUNCER to a" >&2
  echo "  pgbouncer executable." >&2
fi
case "${CI:-}" in
  [Tt][Rr][Uu][Ee] | 1)
    echo "ensure-pgbouncer: CI=$CI, so the PgBouncer tests cannot be skipped" >&2
    exit 1
    ;;
esac
echo "ensure-pgbouncer: the PgBouncer tests will be skipped" >&2
exit 0
