# The dashboards of the compose stack: the MLflow tracking server and
# optuna-dashboard, in one small image (two services run it with different
# commands). Same BASE_IMAGE rule as backend/Dockerfile: python3 >= 3.11 + venv.
#
#   docker build -f docker/tools.Dockerfile -t fusion-tuner/tools:local docker/
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false \
    PATH=/opt/venv/bin:$PATH

# build-ca.crt: optional CA bundle for a TLS-intercepting proxy (see backend/Dockerfile).
COPY tools-requirements.txt build-ca.cr[t] /src/
RUN set -eu; \
    python3 -m venv /opt/venv; \
    if [ -f /src/build-ca.crt ]; then export PIP_CERT=/src/build-ca.crt; fi; \
    pip install --no-cache-dir -r /src/tools-requirements.txt; \
    rm -rf /src

WORKDIR /data

# Last, so the layers above stay cached; .ci prunes older untagged builds by it.
LABEL fusion-tuner.image=tools
