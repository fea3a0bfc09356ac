# Two commands for a newcomer: `make lab` opens the lessons, `make test` runs every test.
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8866
# JupyterLab refuses to start as root (as in many containers) unless told to
ALLOW_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
# One thread per process: two test workers each running a kernel share the cores instead of oversubscribing them
# (measured: the notebook suite took 220 s with two workers at default threads, 59 s with one thread each).
# The suite runs on the CPU, on purpose, also on a machine with a GPU: the stored notebook outputs are the CPU's
# (a GPU's kernels give other last digits and other memory numbers), and the tests assert CPU behaviour.
# CUDA_VISIBLE_DEVICES= hides every NVIDIA GPU; ACCUMLIB_DEVICE=cpu makes the lessons' device choice
# (accumlib.lessons.devices) the CPU on an Apple GPU too. benchmarks/gpu_check.py is the GPU run.
TEST_ENV := OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= ACCUMLIB_DEVICE=cpu
WORKERS ?= 2
# The edition `make lab` and `make app` open: en (English) or hi (Hindi): make lab EDITION=hi
EDITION ?= en

.PHONY: lab app test test-fast lint format test-portable site notebooks translations bench gpu-check clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# The website's builder lives in its own venv: Sphinx, MyST-NB and the book theme are not in the lessons' stack.
SITE_VENV := .venv-site
$(SITE_VENV)/.installed: site/requirements.txt
	test -x $(SITE_VENV)/bin/python || python3 -m venv $(SITE_VENV)
	$(SITE_VENV)/bin/python -m pip install -q -r site/requirements.txt
	touch $@

# A learner works in a copy of the notebooks (my-notebooks/, ignored by git), so the tracked notebooks keep the
# outputs nbval compares. The copy is made once: a later `make lab` keeps the learner's changes (cp -n); delete a
# file there to get it back fresh (new lessons are copied in on the next run).
WORK := my-notebooks
COPY := mkdir -p $(WORK) && cp -Rn notebooks/en notebooks/hi $(WORK)/

lab: $(VENV)/.installed  ## open the lessons in JupyterLab (a working copy in my-notebooks/)
	$(COPY)
	$(VENV)/bin/jupyter lab $(ALLOW_ROOT) $(WORK)/$(EDITION)/00_in_ten_minutes.ipynb

app: $(VENV)/.installed  ## open the interactive dashboards as an app in Voila (Voila saves nothing)
	$(COPY)
	$(VENV)/bin/voila $(WORK)/$(EDITION)/dashboards.ipynb --port=$(PORT)

test: $(VENV)/.installed $(SITE_VENV)/.installed  ## every test: the library, the notebooks' stored outputs (nbval), the browser tests
	$(TEST_ENV) $(PY) -m pytest -n $(WORKERS) --dist loadfile tests --nbval notebooks \
		--nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider

# The library's tests alone, without the slow ones (several processes, torchrun, wheels): the loop of a change to
# accumlib/*.py. tests/library mirrors the library, tests/lessons the lesson helpers, tests/course the notebooks,
# the editions, the website and the browser.
test-fast: $(VENV)/.installed  ## the library's tests without the slow ones (under a minute)
	$(TEST_ENV) $(PY) -m pytest -n $(WORKERS) --dist loadfile tests/library -m "not slow" -p no:cacheprovider -q

lint: $(VENV)/.installed  ## ruff's checks and its formatter's (pyproject.toml [tool.ruff]: E, F, W, B at 120 columns; notebooks left out)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(VENV)/.installed  ## ruff format over the tree, then the string literals it left too long split (tools/format_all.py)
	$(PY) tools/format_all.py

# The notebooks' stored outputs on every kind of CPU a learner has: torch's kernels without vector extensions
# (default), with AVX2 and, where this CPU has it, with AVX-512, each at one thread and at two; every run is reported
# and any failure fails the target. `make test-portable CAPABILITIES=default THREADS=1` runs one of them.
CAPABILITIES ?= default avx2 $(if $(shell grep -qw avx512f /proc/cpuinfo 2>/dev/null && echo yes),avx512)
THREADS ?= 1 2
# Kernels x threads never exceed the cores: two kernels of two threads each on two cores spin-wait on each other's
# OpenMP barriers (measured: lesson 7's float64 experiment went from seconds to over five minutes), so a run at
# N threads uses cores / N test workers.
CORES := $(shell nproc 2>/dev/null || echo 2)
NBVAL := $(PY) -m pytest --dist loadfile --nbval notebooks --nbval-sanitize-with notebooks/sanitize.cfg \
	-p no:cacheprovider -q
test-portable: $(VENV)/.installed  ## the notebook suite (nbval, both editions) under each CPU capability, at 1 and 2 threads
	@failed=""; for cap in $(CAPABILITIES); do for threads in $(THREADS); do \
		workers=$$(( $(CORES) / threads )); [ $$workers -ge 1 ] || workers=1; \
		echo "== nbval: ATEN_CPU_CAPABILITY=$$cap OMP_NUM_THREADS=$$threads, $$workers worker(s)"; \
		ATEN_CPU_CAPABILITY=$$cap $(TEST_ENV) OMP_NUM_THREADS=$$threads $(NBVAL) -n $$workers \
			|| failed="$$failed $$cap/$$threads"; \
	done; done; \
	if [ -n "$$failed" ]; then echo "test-portable failed for:$$failed"; exit 1; fi; echo "test-portable: all passed"

# One thread per kernel here too: the stored outputs are computed as nbval recomputes them in `make test`.
notebooks: $(VENV)/.installed  ## regenerate notebooks/hi from notebooks/en + translations/lessons, run both editions in fresh kernels, store outputs and widget state
	$(TEST_ENV) $(PY) tools/editions.py update build execute --workers $(WORKERS)

translations: $(VENV)/.installed  ## accumlib's catalogues (extract, merge, compile) and the lessons' PO files; rebuild notebooks/hi's text
	$(PY) tools/catalogs.py
	$(PY) tools/editions.py update build

site: $(VENV)/.installed $(SITE_VENV)/.installed  ## the website, both editions, from the stored notebooks (offline; the quiz and dashboards computed with .venv): build/site/index.html
	$(SITE_VENV)/bin/python tools/site.py --out build/site

bench: $(VENV)/.installed  ## benchmark table (benchmarks/results.json)
	$(PY) benchmarks/run.py

gpu-check: $(VENV)/.installed  ## the GPU run (benchmarks/gpu_check.py): on a machine without one it says what it skipped
	$(PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) $(SITE_VENV) build *.egg-info
