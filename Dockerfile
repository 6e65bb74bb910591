# The headcount router image: a virtualenv with headcount and its runtime
# dependencies, pinned by requirements.lock, on python:3.11-slim, run as an
# unprivileged numeric user so `runAsNonRoot` can verify it.
#
# Both stages use the same base so the venv's interpreter symlinks resolve.
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# A C compiler for the data plane's mypyc build (setup.py); only this stage has it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/headcount
WORKDIR /src
COPY requirements.lock pyproject.toml setup.py README.md LICENSE ./
COPY src/ ./src/
# The lock pins every dependency, dev tools included; used as constraints it
# pins versions while only headcount's runtime dependencies get installed.
RUN /opt/headcount/bin/pip install --constraint requirements.lock . \
    && /opt/headcount/bin/pip check

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="headcount" \
      org.opencontainers.image.description="OpenAI-compatible router for fleets of LLM inference engines on Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 headcount \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --home-dir /nonexistent --shell /usr/sbin/nologin headcount
COPY --from=builder /opt/headcount /opt/headcount
# Bytecode was compiled at install time; the root filesystem is read-only.
ENV PATH=/opt/headcount/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 8080
# Kubernetes probes /livez, /readyz and /health; an image health check would
# only duplicate them with different timing.
HEALTHCHECK NONE
ENTRYPOINT ["headcount"]
CMD ["serve"]
