# The two commands a new user runs: `make demo` and `make test`.
# `make check` is the quick tier for the edit loop: lint, types, and the unit and
# conformance tests on SQLite with fewer hypothesis examples (no PostgreSQL, no browser).
# `make test` needs PostgreSQL's server binaries, pgbouncer and Chromium from the
# machine's packages (the scripts/ensure-*.sh install them when run as root): the tests
# start their own PostgreSQL, and their own PgBouncer in transaction mode in front of it
# (tests/pgbouncer.py), never the packages' services.
.PHONY: demo test check lint bench ab clean

# pytest-xdist workers. Each starts its own throwaway PostgreSQL (tests/pg.py); a test
# module stays on one worker (--dist loadscope), so a module's server starts once, and
# modules go in the order collected (acceptance first: few tests, but the longest), not
# most tests first, which left the longest to the end. Four on two cores: most of a
# test's time is spent waiting for processes, servers and the network of loopback, and
# the extra workers fill it (pytest alone, a core kept busy beside: 7:39 with three,
# 6:59 with four, every test green).
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL = -n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder

demo:
	@scripts/venv.sh
	@.venv/bin/ferryq demo

test:
	@scripts/venv.sh test
	@scripts/ensure-postgres.sh
	@scripts/ensure-pgbouncer.sh
	@scripts/ensure-chromium.sh
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -q $(PYTEST_PARALLEL)

check:
	@scripts/venv.sh test
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -q $(PYTEST_PARALLEL) --hypothesis-profile=check \
		-m "not slow and not postgres" tests/unit tests/conformance

lint:
	@scripts/venv.sh test
	.venv/bin/ruff check .
	.venv/bin/mypy

bench:
	@scripts/venv.sh test,bench
	@scripts/ensure-postgres.sh
	@scripts/ensure-pgbouncer.sh
	.venv/bin/python -m bench.sqlite_throughput
	.venv/bin/python -m bench.postgres_throughput
	.venv/bin/python -m bench.enqueue
	.venv/bin/python -m bench.producers
	.venv/bin/python -m bench.lanes
	.venv/bin/python -m bench.processes
	.venv/bin/python -m bench.pooled
	.venv/bin/python -m bench.http
	.venv/bin/python -m bench.dashboard
	.venv/bin/python -m bench.soak
	.venv/bin/python -m bench.transactional

# The working tree against REF, alternated in one run: make ab REF=main AB_ARGS="--pin"
ab:
	@test -n "$(REF)" || { echo "usage: make ab REF=<git ref> [AB_ARGS=...]" >&2; exit 2; }
	@scripts/venv.sh test,bench
	@scripts/ensure-postgres.sh
	.venv/bin/python -m bench.ab $(REF) $(AB_ARGS)

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
