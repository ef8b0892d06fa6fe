#!/usr/bin/env bash
# Set up verl and SkyRL (their record classes only, no GPU extras) in a virtual environment of their own.
#
#   scripts/trainers.sh        # creates $TRAJLAKE_TRAINERS_VENV (default ~/.cache/trajlake/trainers-venv)
#
# It reuses the torch and transformers of the vLLM venv (scripts/vllm.sh, run first) through a .pth file,
# then installs verl and skyrl-train without their dependencies (skyrl-train declares Python 3.12 only; its
# record classes run on 3.11) and only the packages their record and dataset modules import; and Harbor's
# package without its dependencies (it declares Python 3.12; its ATIF models need only pydantic). The export
# tests (tests/pipelines/test_export_trainers.py) load exports with verl's RLHFDataset, SkyRL's PromptDataset,
# build AgentLoopOutput and TrajectoryOutput from the rows and validate ATIF with Harbor's Trajectory; they
# skip without this venv.
set -euo pipefail
VLLM_VENV="${TRAJLAKE_VLLM_VENV:-$HOME/.cache/trajlake/vllm-venv}"
VENV="${TRAJLAKE_TRAINERS_VENV:-$HOME/.cache/trajlake/trainers-venv}"
PY="${PYTHON:-python3}"
[ -x "$VLLM_VENV/bin/python" ] || { echo "no vLLM venv at $VLLM_VENV: run scripts/vllm.sh first" >&2; exit 1; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$SITE/trajlake_vllm_venv.pth"
PIP=("$VENV/bin/pip" install --disable-pip-version-check -q)
"${PIP[@]}" --no-deps --ignore-requires-python "verl==0.9.1" "skyrl-train==0.3.1" skyrl-gym "harbor==0.25.0"
# what verl.experimental.agent_loop.agent_loop and skyrl_train.generators.skyrl_gym_generator import
# (and RLHFDataset / PromptDataset), with the versions the trainers pin where they read an export: SkyRL pins
# datasets 4.0.0 (its PromptDataset loads an export directory, card and all), verl pins transformers <5.11
"${PIP[@]}" pandas omegaconf "ray==2.51.1" tensordict hydra-core codetiming orjson "datasets==4.0.0" func_timeout \
    loguru pillow "transformers>=5.5.3,<5.11,!=5.6.0"
"$VENV/bin/python" -c "
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.utils.dataset.rl_dataset import RLHFDataset
from skyrl_train.generators.skyrl_gym_generator import TrajectoryOutput
from skyrl_train.dataset.dataset import PromptDataset
from harbor.models.trajectories import Trajectory
print('verl AgentLoopOutput, RLHFDataset; SkyRL TrajectoryOutput, PromptDataset; Harbor Trajectory import')"
echo "$VENV"
