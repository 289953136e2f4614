#!/usr/bin/env bash
# Makes PostgreSQL server binaries available for the test suite: scripts/ensure-postgres.sh
# The tests start their own throwaway cluster from these binaries (tests/pg.py); nothing
# here creates, starts or configures a server. With FERRYQ_TEST_PG_URL set, or with
# initdb, pg_ctl and postgres already installed, this does nothing. Otherwise, as root on
# Debian or Ubuntu, it installs the `postgresql` package.
set -euo pipefail

has_server_bins() {
  [ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ] && [ -x "$1/postgres" ]
}

find_server_bins() {
  local dir
  if command -v pg_config >/dev/null 2>&1; then
    dir=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$dir" ] && has_server_bins "$dir"; then
      echo "$dir"
      return 0
    fi
  fi
  # Debian layout, highest major version first.
  for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5,5 -rn); do
    if has_server_bins "$dir"; then
      echo "$dir"
      return 0
    fi
  done
  return 1
}

# Debian's package creates and may start a `main` cluster of its own; the tests never use
# it, so one that this script's install brought up is stopped again.
stop_package_clusters() {
  command -v pg_lsclusters >/dev/null 2>&1 || return 0
  local ver name status
  pg_lsclusters --no-header 2>/dev/null | while read -r ver name _ status _; do
    if [ "$status" = online ]; then
      echo "ensure-postgres: stopping the package's own cluster $ver/$name (tests use their own)" >&2
      pg_ctlcluster "$ver" "$name" stop >/dev/null 2>&1 || true
    fi
  done
}

if [ -n "${FERRYQ_TEST_PG_URL:-}" ]; then
  exit 0
fi
if find_server_bins >/dev/null; then
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-postgres: PostgreSQL server binaries not found; installing the postgresql package" >&2
  if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql \
    && find_server_bins >/dev/null; then
    stop_package_clusters
    echo "ensure-postgres: PostgreSQL binaries installed in $(find_server_bins)" >&2
    exit 0
  fi
  echo "ensure-postgres: installing PostgreSQL with apt-get failed" >&2
else
  echo "ensure-postgres: PostgreSQL server binaries (initdb, pg_ctl, postgres) not found." >&2
  echo "  Install them (Debian/Ubuntu: sudo apt-get install postgresql), run 'make test' as" >&2
  echo "  root to have them installed, or set FERRYQ_TEST_PG_URL to an existing database." >&2
fi
case "${CI:-}" in
  [Tt][Rr][Uu][Ee] | 1)
    echo "ensure-postgres: CI=$CI, so the PostgreSQL tests cannot be skipped" >&2
    exit 1
    ;;
esac
echo "ensure-postgres: the PostgreSQL tests will be skipped" >&2
exit 0
