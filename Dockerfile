# syntax=docker/dockerfile:1.7
# fencedlease operator image: `fencedlease run` (role from --role / FENCEDLEASE_ROLE).
# Multi-stage: the builder makes a wheel (and the wheels of every dependency); the final stage
# installs only those wheels into a venv, with no compiler, no pip cache and no source tree.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Build tools live only in this stage (for any dependency without a binary wheel).
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential=12.9 \
 && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY operator ./operator
# operator/fencedlease/crds links to ../../crds: the CRDs become package data of the wheel.
COPY crds ./crds
# The operator depends on fencedlease-client (the same version): both wheels from this tree.
COPY client ./client
# The kopf extra: the image also runs examples/fenced-controller (a Kopf operator).
RUN python -m pip wheel --wheel-dir /wheels ./client '.[kopf]'
# The examples' worker, handed to the final stage like the wheels.
COPY examples/report-writer/report_writer.py /app/report_writer.py
# The license and notice, handed to the final stage the same way.
COPY LICENSE NOTICE /licenses/

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="fencedlease" \
      org.opencontainers.image.description="Kubernetes operator: leases with etcd-revision fencing tokens, enforced at the resource by an admission webhook" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/fencedlease/fencedlease" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.14-slim-bookworm"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/fencedlease \
    PATH=/opt/fencedlease/bin:$PATH \
    HOME=/tmp \
    TMPDIR=/tmp
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    python -m venv /opt/fencedlease \
 && /opt/fencedlease/bin/pip install --no-index --find-links=/wheels 'fencedlease[kopf]' \
 && /opt/fencedlease/bin/pip uninstall -y pip \
 && groupadd --system --gid 65532 fencedlease \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin fencedlease
# The examples' worker: docs/examples/worker-pod.yaml and examples/report-writer run
# `python /app/report_writer.py work` in this image (the client is installed above).
COPY --from=builder /app/report_writer.py /app/report_writer.py
# The license (Apache-2.0) and notice, where an image scanner and a reader look for them; the
# installed wheels carry them too (.dist-info/licenses/).
COPY --from=builder /licenses/ /usr/share/doc/fencedlease/
# Only /tmp needs to be writable (the chart mounts an emptyDir there, root filesystem read-only).
USER 65532:65532
WORKDIR /tmp
EXPOSE 8080 8081 9443
ENTRYPOINT ["fencedlease"]
CMD ["run"]
