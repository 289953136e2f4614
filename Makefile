# The two commands a new user runs: `make demo` and `make test`.
.PHONY: demo test lint bench clean

demo:
	@scripts/venv.sh
	@.venv/bin/ferryq demo

test:
	@scripts/venv.sh test
	@scripts/ensure-postgres.sh
	@scripts/ensure-chromium.sh
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/python -m pytest -q

lint:
	@scripts/venv.sh test
	.venv/bin/ruff check .
	.venv/bin/mypy

bench:
	@scripts/venv.sh test,bench
	@scripts/ensure-postgres.sh
	.venv/bin/python -m bench.sqlite_throughput
	.venv/bin/python -m bench.postgres_throughput
	.venv/bin/python -m bench.enqueue
	.venv/bin/python -m bench.lanes
	.venv/bin/python -m bench.processes
	.venv/bin/python -m bench.http
	.venv/bin/python -m bench.dashboard

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
