# One image for every role: syncer, learner, and our Toxiproxy-compatible server.
#
#   docker build -t islands:latest .                                   # from PyPI
#   docker build --build-arg BASE_IMAGE=islands-base:bookworm-fuse3 -t islands:latest .
#                                                                      # offline, from ./wheelhouse
# With wheels in ./wheelhouse (see docker/build-image.sh) nothing is downloaded during the
# build: pip runs with --no-index. Without them, pip installs from PyPI and torch's CPU index.
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/islands \
    PATH=/opt/islands/bin:$PATH \
    PYTHONPATH=/app \
    OMP_NUM_THREADS=1

# Dependencies first, in their own layer: source edits do not reinstall torch.
# `wheelhouse*` matches nothing when there is no wheelhouse; pyproject.toml keeps COPY valid.
COPY pyproject.toml wheelhouse* /tmp/build/
RUN set -eu; \
    python3 -m venv "$VIRTUAL_ENV"; \
    python3 -c 'import tomllib; p = tomllib.load(open("/tmp/build/pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"] + p["optional-dependencies"]["examples"]))' > /tmp/build/requirements.txt; \
    if ls /tmp/build/*.whl >/dev/null 2>&1; then \
        pip install --no-index --find-links /tmp/build -r /tmp/build/requirements.txt; \
    else \
        pip install --extra-index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" -r /tmp/build/requirements.txt; \
    fi; \
    rm -rf /tmp/build; \
    python3 -c 'import torch, safetensors, tenacity, yaml; print("torch", torch.__version__)'

WORKDIR /app
COPY trainer /app/trainer
COPY faults /app/faults
COPY chaos /app/chaos
COPY docker/entrypoint.sh /usr/local/bin/islands-entrypoint
RUN chmod 0755 /usr/local/bin/islands-entrypoint && python3 -m compileall -q /app

# exec'd, so signals reach Python directly; compose adds `init: true` as PID 1 so
# SIGTERM is forwarded and zombies are reaped.
ENTRYPOINT ["islands-entrypoint"]
CMD ["trainer", "--help"]
