# The two commands of the README: `make demo` and `make test`.
VENV := .venv

.PHONY: setup demo test lint bench validate mutate
setup:
	@scripts/setup.sh

demo: setup
	$(VENV)/bin/splitroom simulate scenarios/gb10_m5.yaml --plot gb10_m5.png

test: setup
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q

bench: setup
	$(VENV)/bin/python -m pytest -q tests/benchmark --benchmark-enable --benchmark-only

# Reproduce docs/' figures (held-out study, published table, long fuzzing run) and exit 1
# when a documented goal is missed; not CI (about half an hour; run it alone). QUICK=1: small.
validate: setup
	$(VENV)/bin/python scripts/validate.py $(if $(QUICK),--quick)

# Mutation testing of planner/ ([tool.mutmut] in pyproject.toml) and the score per module
# (docs/testing.md); not CI: it runs the unit and property tests once per mutant.
# MODULE=planner.cost: that module's mutants only (planner.scheduler: the scheduler
# package); CHILDREN=N mutants at once (default 1). Hypothesis tests run few examples
# (SPLITROOM_MUTATION, tests/conftest.py). Results add up in mutants/ across runs.
mutate: setup
	SPLITROOM_MUTATION=1 nice -n 19 $(VENV)/bin/mutmut run --max-children $(or $(CHILDREN),1) \
		$(if $(MODULE),"$(MODULE).*")
	$(VENV)/bin/python scripts/mutation_report.py --out docs/mutation-$$(date -u +%F).json
