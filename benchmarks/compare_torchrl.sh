#!/usr/bin/env bash
# Issue 18's side-by-side: one series of alternating runs on this machine, then a summary table.
#
#   bash benchmarks/torchrl_env.sh                      # once: .venv-torchrl/ for the TorchRL loop
#   bash benchmarks/compare_torchrl.sh [ROUNDS]          # default 3 rounds; run on a quiet machine
#
# Each round runs, one after the other (so a slow spell of the machine hits every loop alike):
#   torchrl       benchmarks/torchrl_ppo.py --iterations 3 --json       (stock TorchRL PPO loop, feed-forward)
#   machina       python -m machina.bench --epochs 3 --json learner.update_epochs=1   (default experiment: QRNN policy)
#   machina_ff    python -m machina.bench --epochs 3 --json learner.update_epochs=1 policy.core=none   (feed-forward,
#                 like the TorchRL loop)
# Both machina runs train one pass per batch, as the TorchRL loop does (the main job trains two: twice the learning
# work per agent step, which is not the loop's speed); MACHINA_OVERRIDES=learner.update_epochs=2 measures the main job.
# Every run measures end-to-end agent-steps/s over 3 whole iterations / epochs of 65,536 agent steps after one
# warm-up. Each run's JSON line is printed as it ends and kept in $RESULTS (default
# outputs/compare_torchrl-<time>.jsonl, as "label<TAB>json" lines); the table shows each loop's mean and runs.
# machina runs from the repo root with .venv/bin/python (override: MACHINA_PYTHON=/path/to/python), the TorchRL
# loop with .venv-torchrl/bin/python (override: TORCHRL_PYTHON). MACHINA_OVERRIDES adds settings to both machina
# runs, DEFAULT_OVERRIDES to the default's only (a core, which the feed-forward run has none of). A CPU without bf16
# units, emulated on one with them (oneDNN, MKL and torch's kernels limited to AVX2, bf16 products off):
#   ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 \
#       MACHINA_OVERRIDES=system.bf16_matmuls=false bash benchmarks/compare_torchrl.sh
# The LSTM core the default had before its quasi-recurrent one:
#   DEFAULT_OVERRIDES=policy.core._target_=machina.policy.lstm_core.LSTMCore bash benchmarks/compare_torchrl.sh
set -euo pipefail
cd "$(dirname "$0")/.."

rounds="${1:-3}"
machina_python="${MACHINA_PYTHON:-.venv/bin/python}"
torchrl_python="${TORCHRL_PYTHON:-.venv-torchrl/bin/python}"
results="${RESULTS:-outputs/compare_torchrl-$(date +%Y%m%d-%H%M%S).jsonl}"
for py in "$machina_python" "$torchrl_python"; do
  [[ -x "$py" ]] || { echo "missing $py (see the top of this file)" >&2; exit 1; }
done
mkdir -p "$(dirname "$results")"
: >"$results"

# run LABEL COMMAND...: runs one benchmark, keeps its last JSON line under LABEL.
run() {
  local label="$1" line
  shift
  line="$("$@" | grep '^{' | tail -n 1)"
  printf '%s\t%s\n' "$label" "$line" | tee -a "$results"
}

start=$SECONDS
for ((round = 1; round <= rounds; round++)); do
  echo "# round $round of $rounds" >&2
  run torchrl "$torchrl_python" benchmarks/torchrl_ppo.py --iterations 3 --json
  run machina "$machina_python" -m machina.bench --epochs 3 --json learner.update_epochs=1 ${MACHINA_OVERRIDES:-} \
    ${DEFAULT_OVERRIDES:-}
  run machina_ff "$machina_python" -m machina.bench --epochs 3 --json learner.update_epochs=1 policy.core=none \
    ${MACHINA_OVERRIDES:-}
done
echo "# series: $((SECONDS - start)) s, results in $results" >&2

"$machina_python" - "$results" <<'EOF'
import json
import statistics
import sys

runs = {}
for line in open(sys.argv[1]):
    label, _, result = line.rstrip("\n").partition("\t")
    runs.setdefault(label, []).append(json.loads(result)["sps"])
base = statistics.mean(runs["torchrl"])
print(f"{'loop':<12}{'mean agent-steps/s':>20}{'vs torchrl':>12}   runs")
for label, sps in runs.items():
    mean = statistics.mean(sps)
    print(f"{label:<12}{mean:>20,.0f}{mean / base:>11.2f}x   " + ", ".join(f"{s:,.0f}" for s in sps))
EOF
