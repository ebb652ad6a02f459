"""Benchmarks, all behind one command (``machina/bench.py``):

    python -m machina.bench [HYDRA_OVERRIDE ...]           training: end-to-end SPS, parts, ceiling (training.py)
    python -m machina.bench env [--ops] ...                the built-in env alone (env.py)
    python -m machina.bench policy ...                     policy forward and backward on synthetic tokens (policy.py)
    python -m machina.bench overhead [HYDRA_OVERRIDE ...]  launch overhead per rollout step and minibatch

Each prints a table, or with ``--json`` one JSON object per measured configuration.
"""
