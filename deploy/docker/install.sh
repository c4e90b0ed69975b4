#!/bin/sh
# Installs the stallscope agent from a source tree into a fresh virtualenv.
# The Dockerfile runs exactly this; tests/deploy/test_deploy.py runs it too, into a
# temporary directory, so the image's install steps are exercised without a container engine.
#   usage: install.sh SOURCE_DIR TARGET_VENV
set -eu
src="$1"
venv="$2"
python3 -m venv "$venv"
# gpu: NVML sampler (nvidia-ml-py); stacks: py-spy for worker stacks.
"$venv/bin/pip" install --no-cache-dir --disable-pip-version-check --quiet "$src[gpu,stacks]"
"$venv/bin/stallscope" --version
