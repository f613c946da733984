# The two commands of the README:
#   make run    set up (idempotent) and run the main job on the embedded default
#   make test   set up (idempotent), install the browser/desktop Debian packages, start
#               MariaDB if needed, lint, and run the tests (then the vLLM tier in .venv-vllm:
#               `make test-vllm`; TEST_VLLM=0 skips it)
#
# torch is installed first and pinned to 2.13.0: on machines like ours pip takes the CPU build
# from local disk, and an unpinned torch would pull a multi-GB CUDA build. Set TORCH_SPEC to
# change it (e.g. TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu").

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip -qq --disable-pip-version-check
STAMP := $(VENV)/.installed-stamp
TORCH_SPEC ?= torch==2.13.0
# `learning` (docs/LEARNING.md: the default run's +10 points and the four rungs of the ladder;
# about two hours) does not fit CI's time with the rest: `make test-learning` runs it.
# `schedule` (the fault tour, the session and node kills, the seeded 50-fault schedule; about
# 30 minutes) neither: `make test-fault-schedule`.
# `bench` (the benchmark scripts at their test size: timing mode, load, publish; about 6
# minutes) neither, since CI's run reached 44 minutes with them: `make test-bench`.
# Empty: scripts/test-tiers.sh runs the tiers (parallel, ray, cluster, vLLM) and times each; set it
# to run one plain pytest instead (e.g. PYTEST_ARGS="-x tests/store").
PYTEST_ARGS ?=
ARGS ?=
# The vLLM engine and its tests run in a second venv (scripts/setup-vllm-venv.sh says why).
# TEST_VLLM=0 skips that tier. Only the folders holding `vllm` tests are collected there, so a
# test module needing something only the main venv has cannot break that run.
VLLM_VENV ?= .venv-vllm
TEST_VLLM ?= 1
VLLM_PYTEST_ARGS ?= -m vllm tests/engines tests/serve_apps
# OSWorld's own evaluators (PyPI desktop-env) run in a third venv (scripts/setup-osworld-venv.sh
# says why). Their tests (marker `osworld`) skip without it; `make test-osworld` builds it first.
OSWORLD_VENV ?= .venv-osworld
OSWORLD_PYTEST_ARGS ?= -m osworld tests/envs

.PHONY: run test test-learning test-fault-schedule test-bench test-vllm vllm-venv gpu-check lint install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "== setting up $(VENV): pip, $(TORCH_SPEC), dart-ray and its dependencies (a few minutes)"
	@test -x $(PY) || python3 -m venv $(VENV)
	@# -qq: errors only; a healthy install prints nothing (pip's warnings about this
	@# machine's find-links folders and setuptools' build chatter are not the user's business)
	@$(PIP) install --upgrade pip
	@$(PIP) install $(TORCH_SPEC)
	@$(PIP) install -e '.[dev,browser,desktop]'
	@touch $(STAMP)
	@echo "== $(VENV) is ready"

run: $(STAMP)
	$(VENV)/bin/dart-ray train $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(STAMP) lint
	bash scripts/install-test-deps.sh
	bash scripts/start-mariadb.sh
	VENV=$(VENV) TEST_VLLM=$(TEST_VLLM) bash scripts/test-tiers.sh $(PYTEST_ARGS)

test-learning: $(STAMP)
	$(VENV)/bin/pytest -m learning -s tests/test_experiment.py tests/test_learning.py

gpu-check: $(STAMP)
	bash scripts/gpu-check.sh

test-fault-schedule: $(STAMP)
	bash scripts/install-test-deps.sh
	$(VENV)/bin/pytest -m schedule -s tests/test_faults.py tests/test_fault_schedule.py \
		tests/cluster/test_node_loss.py

vllm-venv:
	bash scripts/setup-vllm-venv.sh $(VLLM_VENV)

test-bench: $(STAMP)
	bash scripts/install-test-deps.sh
	bash scripts/start-mariadb.sh
	@# the one on the session's Ray first, then the ones that start their own (as the tiers do)
	$(VENV)/bin/pytest -m 'bench and ray' --durations=0 tests
	$(VENV)/bin/pytest -m 'bench and not ray' --durations=0 tests

test-vllm: vllm-venv
	$(VLLM_VENV)/bin/python -m pytest $(VLLM_PYTEST_ARGS)

.PHONY: osworld-venv test-osworld test-osworld-apps osworld-desktop osworld-eval
osworld-venv:
	bash scripts/setup-osworld-venv.sh $(OSWORLD_VENV)

# the tests run in the main venv; OSWorld's code runs in $(OSWORLD_VENV) as their child
test-osworld: $(STAMP) osworld-venv
	bash scripts/install-test-deps.sh
	DART_OSWORLD_VENV=$(OSWORLD_VENV) $(VENV)/bin/pytest $(OSWORLD_PYTEST_ARGS)

# the OSWorld desktop profile (apps, the `user` account, sudo; needs root) and the tier that
# solves our OSWorld-format tasks on it (marker `osworld_apps`; LibreOffice makes it slow, so
# `make test` leaves it out)
osworld-desktop:
	bash scripts/install-osworld-desktop.sh

test-osworld-apps: $(STAMP) osworld-venv osworld-desktop
	DART_OSWORLD_VENV=$(abspath $(OSWORLD_VENV)) $(VENV)/bin/pytest -m osworld_apps tests/envs

# OSWorld's tasks that run offline here, played by our solutions through Ray, EnvSession and
# OSWorld's evaluator on the profile (docs/QUICKSTART.md); SCRIPTS=empty.jsonl plays none
OSWORLD ?= ../OSWorld
SCRIPTS ?= scripts.jsonl
osworld-eval: $(STAMP) osworld-venv
	$(VENV)/bin/python -m dart_ray.envs.osworld.solutions --osworld $(OSWORLD) --out runs/osworld-local
	$(VENV)/bin/dart-ray eval --ray -c configs/osworld-local.toml \
	  --checkpoint runs/osworld-local/$(SCRIPTS) --suite runs/osworld-local/tasks.jsonl \
	  --json runs/osworld-local/eval-$(basename $(SCRIPTS)).json policy.engine=script

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OSWORLD_VENV) runs .pytest_cache .ruff_cache
