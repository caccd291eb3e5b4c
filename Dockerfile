# syntax=docker/dockerfile:1
# Image of the trainjob-scraper service (the `trainjob-scraper run` command).
#
#   docker build -t trainjob-scraper:0.1.0 .
#   buildah bud --layers -t trainjob-scraper:0.1.0 .
#   scripts/image            the same with buildah on a base made locally from
#                            Debian packages (no registry needed), then run checks
#
# Two stages: the builder installs the project with its `scraper` extra into a
# virtual environment; the runtime stage copies only that environment, so no
# compiler, pip cache or source tree ships.  The process runs as UID/GID 65532
# (no shell login, no home), which the Helm chart's securityContext also sets,
# and needs nothing writable: the chart mounts a read-only root filesystem.
#
# Base image: pinned by an exact tag.  At release, also pin the digest
# (`python:3.11.13-slim-bookworm@sha256:...`, resolved with `docker buildx
# imagetools inspect`) so rebuilds are reproducible; it is not pinned here
# because the digest cannot be resolved from the development environment.
# Any base works that has `python` (3.11+) on PATH whose `python -m venv` gives
# a venv with pip: `--build-arg PYTHON_IMAGE=<image>`; scripts/image passes a
# debootstrapped Debian bookworm with python3, python3-venv and python-is-python3.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
WORKDIR /src
# Dependencies first, so a source-only change reuses this layer.
COPY pyproject.toml README.md constraints.txt ./
COPY exporter_lib/__init__.py exporter_lib/status.py exporter_lib/
COPY scraper/__init__.py scraper/
RUN /opt/venv/bin/pip install --upgrade pip setuptools wheel \
    && /opt/venv/bin/pip install -c constraints.txt ".[scraper]" \
    && /opt/venv/bin/pip uninstall -y trainjob-progress
# Then the project itself (not editable, no tests, no tools).
COPY exporter_lib/ exporter_lib/
COPY scraper/ scraper/
RUN /opt/venv/bin/pip install --no-deps . \
    && /opt/venv/bin/python -m compileall -q /opt/venv/lib \
    && /opt/venv/bin/trainjob-scraper --help >/dev/null

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="trainjob-scraper" \
      org.opencontainers.image.description="Scrapes Kubeflow TrainJob progress into status.trainerStatus" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
COPY --from=builder /opt/venv /opt/venv
USER 65532:65532
# /metrics, /healthz, /readyz (the chart's metrics.port).
EXPOSE 8080
ENTRYPOINT ["trainjob-scraper"]
CMD ["run"]
