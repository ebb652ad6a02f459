#!/usr/bin/env bash
# GPU checks and numbers for docs/reference/benchmarks.md, as one script for a machine with one CUDA GPU (sized for an H200).
#
#   bash benchmarks/gpu.sh fetch   # here, with network: wheels for a python3.12 GPU box that has torch but not
#                                  # machina's other requirements, into .whl/ (git-ignored)
#   bash benchmarks/gpu.sh run     # there: install .whl/ if present, run tests/test_gpu.py, then the benchmarks
#
# `run` writes every result to ${OUT:-gpu_results}/: pytest's log and one JSON line per benchmark (bench.jsonl).
# Sized for about 9 minutes on an H200 (a guess: it has never run): the no-sync tests (every loss, both samplers,
# with and without CUDA graphs) and the graph-equals-eager tests, then end-to-end training SPS of policy=fast at
# three batch sizes (the issue asks for the one that maximises agent-steps/s) and policy=vit, the pairs
# system.cuda_graphs (rollout step and update as graphs), system.compile, emit_full_log_probs at 157 actions,
# torch_deterministic and learner.compact_tokens, the launch-overhead table on the GPU, and (with the mettagrid
# wheels) MettaGrid's env-only and end-to-end agent-steps/s at env.workers 1, 2, 4, 8, 16, overlap off and on.
set -euo pipefail
cd "$(dirname "$0")/.."

# Versions that work beside torch 2.11+ (tensordict 0.15 needs torch >= 2.11); wandb for the tests' reader.
WHEELS=(tensordict==0.15.3 pyvers==0.2.2 orjson==3.11.4 cloudpickle==3.1.2 importlib_metadata==8.7.0 zipp==3.23.0
  hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3 wandb==0.31.0)

case "${1:-}" in
fetch)
  mkdir -p .whl
  for wheel in "${WHEELS[@]}"; do
    python3 -m pip download -q --no-deps --python-version 3.12 --implementation cp --only-binary=:all: \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d .whl "$wheel" ||
      python3 -m pip download -q --no-deps -d .whl "$wheel" # pure-Python packages ship as sdists only
  done
  # The mettagrid extra with its dependencies, for the MettaGrid block (installed from this folder only). Its wheel
  # is tagged manylinux_2_34. With every dependency this is about 92 MB (scipy 35, mettagrid 18, botocore 16, numpy
  # 15), more than a device run carries (64 MiB): numpy and scipy are left out, so the box must have them (a torch
  # box usually has numpy; without scipy the block is skipped with a message).
  python3 -m pip download -q --python-version 3.12 --implementation cp --only-binary=:all: \
    --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl/mettagrid mettagrid==0.26.21 ||
    echo "mettagrid wheels not fetched: the MettaGrid block will be skipped"
  rm -f .whl/mettagrid/numpy-*.whl .whl/mettagrid/scipy-*.whl
  du -sh .whl .whl/mettagrid
  ;;
run)
  out="${OUT:-gpu_results}"
  mkdir -p "$out"
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site \
      $(find .whl -maxdepth 1 -type f) # not .whl/mettagrid/
    export PYTHONPATH="/tmp/site:$PWD"
  fi
  if [ -d .whl/mettagrid ]; then # after /tmp/site on the path, so machina's pinned versions win
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-mettagrid .whl/mettagrid/*.whl &&
      export PYTHONPATH="$PYTHONPATH:/tmp/site-mettagrid"
  fi
  export PYTHONUNBUFFERED=1 WANDB_MODE=disabled
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" | tee -a "$out/gpu.txt"
  python3 -m pytest -q -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/test_gpu.log" || true

  bench() { timeout 300 python3 -m machina.bench --json "$@" 2>&1 | tee -a "$out/bench.log" | grep '^{' >>"$out/bench.jsonl" || true; }
  fast=(system.device=cuda policy=fast env.num_envs=16384 experience.batch_size=2097152 experience.minibatch_size=262144)
  vit=(system.device=cuda policy=vit env.num_envs=4096 experience.batch_size=524288 experience.minibatch_size=65536)
  bench --epochs 3 "${fast[@]}"
  bench --epochs 2 system.device=cuda env.num_envs=4096 experience.batch_size=524288 experience.minibatch_size=65536
  bench --epochs 2 system.device=cuda env.num_envs=65536 experience.batch_size=8388608 experience.minibatch_size=1048576
  bench --epochs 3 --compare system.cuda_graphs=false,true "${fast[@]}"
  bench --epochs 2 --compare policy.action_probs.emit_full_log_probs=false,true env.num_vibes=152 "${fast[@]}"
  bench --epochs 2 --compare system.torch_deterministic=false,true "${fast[@]}"
  bench --epochs 3 "${vit[@]}"
  bench --epochs 3 --compare system.cuda_graphs=false,true "${vit[@]}"
  bench --epochs 2 --compare system.compile=false,true "${vit[@]}"
  bench --epochs 2 --compare system.compile=false,true "${fast[@]}"  # the policy and the learner's whole update
  bench --epochs 2 --compare learner.compact_tokens=false,true "${fast[@]}"
  # Launch overhead at a tiny batch: aten ops (kernel launches) and host time per rollout step and per minibatch.
  for graphs in false true; do
    timeout 300 python3 -m machina.bench overhead --json system.device=cuda system.cuda_graphs=$graphs 2>&1 |
      tee -a "$out/bench.log" | grep '^{' >>"$out/overhead.jsonl" || true
  done
  # MettaGrid (issue 33): the env alone (random actions; with --overlap, two groups in flight) into mettagrid.jsonl,
  # then end-to-end training SPS with overlap off and on, per worker count, into bench.jsonl.
  if python3 -c "from mettagrid.simulator.simulator import Simulation" 2>/dev/null; then
    timeout 300 python3 -m machina.bench mettagrid --json --workers 0 1 2 4 8 16 --overlap --envs 512 --steps 100 \
      2>&1 | tee -a "$out/bench.log" | grep '^{' >>"$out/mettagrid.jsonl" || true
    mettagrid=(system.device=cuda policy=fast env=mettagrid_arena env.num_envs=512 experience.batch_size=131072
      experience.minibatch_size=16384)
    for workers in 1 2 4 8 16; do
      bench --epochs 2 --compare env.overlap=false,true "${mettagrid[@]}" env.workers=$workers
    done
  else
    echo "mettagrid (or its numpy / scipy) is not installed (bash benchmarks/gpu.sh fetch): MettaGrid block skipped" | tee -a "$out/bench.log"
  fi
  ;;
*)
  echo "usage: bash benchmarks/gpu.sh fetch|run" >&2
  exit 2
  ;;
esac
