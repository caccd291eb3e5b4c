# The two commands a newcomer needs (see README.md):
#   make demo   run the main job: local control plane + training + scraper, live progress
#   make test   run every test (control plane, Prometheus, Transformers, Kubeflow SDK,
#               the scraper image built with buildah and run with podman)
#   make image  build the scraper image only, check it and run its tests
.PHONY: demo test lint bench image

demo:
	scripts/bootstrap demo
	.venv/bin/python -m localdev.demo $(ARGS)

test:
	scripts/bootstrap test
	@echo "==> scraper image (buildah; the first build debootstraps its base: several minutes; log .venv/image-build.log)"
	@scripts/image build >.venv/image-build.log 2>&1 || { tail -n 60 .venv/image-build.log; exit 1; }
	.venv/bin/ruff check exporter_lib scraper trainjob_client localdev tests benchmarks charts/trainjob-scraper/dashboards
	.venv/bin/mypy
	.venv/bin/pytest $(ARGS)

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
	.venv/bin/python -m benchmarks.vs_push

image:
	scripts/bootstrap test
	scripts/image check
	.venv/bin/pytest tests/image $(ARGS)
