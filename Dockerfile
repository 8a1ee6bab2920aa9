# The numbakv sidecar: serves the metrics an engine's processes write to a shared directory.
# Installs prometheus-client, FastAPI and uvicorn (pinned in service/requirements.txt) and the
# project with --no-deps: its pure-Python package, without NumPy or Numba, which the sidecar
# never imports.
# Wheels found in wheelhouse/ are used first; build with --build-arg PIP_NO_INDEX=1 to use nothing else.
ARG BASE=python:3.11.11-slim-bookworm

FROM ${BASE} AS build
ARG PIP_NO_INDEX=0
ENV PIP_NO_INDEX=${PIP_NO_INDEX} \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY wheelhouse/ wheelhouse/
COPY service/requirements.txt service/requirements.txt
RUN python3 -m venv /opt/sidecar \
    && /opt/sidecar/bin/pip install --no-cache-dir --find-links wheelhouse --requirement service/requirements.txt
COPY pyproject.toml README.md ./
COPY numbakv/ numbakv/
COPY service/ service/
COPY dashboards/ dashboards/
RUN /opt/sidecar/bin/pip install --no-cache-dir --find-links wheelhouse --no-deps .

FROM ${BASE}
RUN useradd --system --user-group --uid 10001 --no-create-home --shell /usr/sbin/nologin sidecar
COPY --from=build /opt/sidecar /opt/sidecar
ENV PATH=/opt/sidecar/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NUMBAKV_SIDECAR_HOST=0.0.0.0 \
    NUMBAKV_SIDECAR_PORT=9464 \
    NUMBAKV_METRICS_DIR=/metrics
USER 10001:10001
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 CMD ["python3", "-m", "numbakv.service.healthcheck"]
ENTRYPOINT ["numbakv-sidecar"]
