#!/usr/bin/env bash
# Makes .venv-torchrl/ at the repo root: the virtual environment of benchmarks/torchrl_ppo.py (a stock TorchRL PPO
# loop on machina's machina_1 env). TorchRL 0.14.1 needs tensordict < 0.15 while machina pins tensordict 0.15, so
# the two cannot share machina's .venv. torch comes first, pinned: a bare torch requirement (torchrl's own) would
# pull a CUDA build of several GB; torch==2.13.0 resolves to the CPU wheel kept on this machine's disk (pip's
# find-links), the one machina's .ci/run installs.
# torchrl's C++ extension (segment trees for prioritized replay) was built against another torch and does not load
# with 2.13.0 (undefined symbol); torchrl imports it lazily and the PPO loop never uses it.
# machina itself is not installed here: torchrl_ppo.py puts the repo root on sys.path and imports only
# machina.env.machina_1, which needs torch and tensordict alone.
#
#   bash benchmarks/torchrl_env.sh          # idempotent; rerun to repair
#   .venv-torchrl/bin/python benchmarks/torchrl_ppo.py --help
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv-torchrl
. .venv-torchrl/bin/activate
pip install -q --upgrade pip
pip install -q torch==2.13.0
pip install -q torchrl==0.14.1 'tensordict>=0.14.3,<0.15'
python -c "import torch, tensordict, torchrl; print('torch', torch.__version__, 'tensordict', tensordict.__version__, \
'torchrl', torchrl.__version__)"
