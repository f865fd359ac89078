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
	touch $(STAMP)

# Until the default suite lands (issue 3): the SJD trial and the sampling-Jacobi trial on the text-conditional
# digits teacher, each measured side by side with the teacher's own AR sampler.
DEMO_ARGS := --teacher digits-ar-t2i --metric fid --n-samples 100 --param window=16
demo: $(STAMP)
	$(VENV)/bin/accelbench run --method sjd $(DEMO_ARGS)
	$(VENV)/bin/accelbench run --method jacobi $(DEMO_ARGS)

# pytest exits 5 when it collects no test; that is not a failure of the code under test.
test: $(STAMP)
	$(VENV)/bin/python -m pytest || [ $$? -eq 5 ]

clean-venv:
	rm -rf $(VENV)
