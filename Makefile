# The two commands a newcomer needs (see README.md):
#   make demo   run the main job: local control plane + training + scraper, live progress
#   make test   run every test (control plane, Prometheus, Transformers, Kubeflow SDK,
#               the scraper image built with buildah and run with podman)
# and the inner loop while changing code (docs/testing.md):
#   make check  lint, types and every test that needs no cluster (a few minutes)
#   make explore  the property tests with many more, new examples each run
#   make image  build the scraper image only, check it and run its tests
#
# WORKERS: pytest-xdist workers of make test and make explore, CHECK_WORKERS of make check
# (docs/testing.md, "Workers"); 0 runs in one process.
# ARGS: more pytest arguments, e.g. ARGS="tests/scraper/test_loop.py -x".
WORKERS ?= 2
CHECK_WORKERS ?= 4
PYTEST_PARALLEL = -n $(WORKERS)
.PHONY: demo test check explore lint bench image

demo:
	scripts/bootstrap demo
	.venv/bin/python -m localdev.demo $(ARGS)

test:
	scripts/bootstrap test
	@echo "==> scraper image (buildah; the first build debootstraps its base: several minutes; log .venv/image-build.log)"
	@scripts/image build >.venv/image-build.log 2>&1 || { tail -n 60 .venv/image-build.log; exit 1; }
	.venv/bin/ruff check exporter_lib scraper trainjob_client localdev tests benchmarks charts/trainjob-scraper/dashboards
	.venv/bin/mypy
	.venv/bin/pytest $(PYTEST_PARALLEL) $(ARGS)

check:
	scripts/bootstrap test
	.venv/bin/ruff check exporter_lib scraper trainjob_client localdev tests benchmarks charts/trainjob-scraper/dashboards
	.venv/bin/mypy
	TRAINJOB_PROGRESS_NO_CLUSTER=1 .venv/bin/pytest -n $(CHECK_WORKERS) -m "not cluster" $(ARGS)

explore:
	scripts/bootstrap test
	.venv/bin/pytest $(PYTEST_PARALLEL) -m hypothesis --hypothesis-profile=explore \
		--timeout=1800 $(ARGS)

lint:
	.venv/bin/ruff check exporter_lib scraper trainjob_client localdev tests benchmarks charts/trainjob-scraper/dashboards
	.venv/bin/mypy

bench:
	scripts/bootstrap test
	.venv/bin/python -m benchmarks $(ARGS)
	.venv/bin/python -m benchmarks.waiting
	.venv/bin/python -m benchmarks.hung
	.venv/bin/python -m benchmarks.churn
	.venv/bin/python -m benchmarks.churn --api
	.venv/bin/python -m benchmarks.cluster_scale
	.venv/bin/python -m benchmarks.log_source --report
	.venv/bin/python -m benchmarks.preemption
# the push comparison's cliff (about 2 h); its main table is --plan main (about 7 h,
# splittable by --jobs): docs/performance.md, "Push vs pull on equal terms"
	.venv/bin/python -m benchmarks.vs_push --plan cliff

image:
	scripts/bootstrap test
	scripts/image check
	.venv/bin/pytest tests/image $(ARGS)
