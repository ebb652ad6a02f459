"""``python -m machina.bench``: every benchmark behind one command (``machina/speed/``).

    python -m machina.bench [--epochs N] [--compare KEY=A,B] [--json] [HYDRA_OVERRIDE ...]   training (default)
    python -m machina.bench env [--ops] [--num-envs N ...] [--json]                         the built-in env
    python -m machina.bench mettagrid [--workers 0 1 2] [--overlap] [--envs N] [--json]     MettaGrid env alone
    python -m machina.bench policy [--policies fast vit] [--json]                           policy alone
    python -m machina.bench overhead [--json] [HYDRA_OVERRIDE ...]                          launch overhead
    python -m machina.bench profile [--rows N] [--json] [HYDRA_OVERRIDE ...]                the update's ops

``python -m machina.bench <mode> --help`` explains each. Every mode first prints, on stderr, one line naming the
machine's case (CPU, its bf16/AMX/AVX512/AVX2 units, torch's kernels, threads, load average, cores other processes
keep busy; ``machina.speed.machine``) and a warning when another process is busy now.
"""

import sys

from machina.speed import env, mettagrid, overhead, policy, profile, training

MODES = {
    "env": env.main,
    "mettagrid": mettagrid.main,
    "policy": policy.main,
    "overhead": overhead.main,
    "profile": profile.main,
}


def main(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in MODES:
        return MODES[argv[0]](argv[1:])
    return training.main(argv)


if __name__ == "__main__":
    main()
