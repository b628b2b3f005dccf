# The two commands of the README: `make demo` and `make test`.
VENV := .venv

.PHONY: setup demo test lint bench
setup:
	@scripts/setup.sh

demo: setup
	$(VENV)/bin/splitroom simulate scenarios/gb10_m5.yaml --plot gb10_m5.png

test: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q

bench: setup
	$(VENV)/bin/python -m pytest -q tests/benchmark --benchmark-enable --benchmark-only
