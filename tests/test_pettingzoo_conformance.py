"""The env conformance kit (``machina.conformance.env.check_env``) on the PettingZoo adapter: the relay of
``tests/test_pettingzoo_relay.py`` (agents that finish at different times, truncations), as a parallel env and as an
AEC env converted by PettingZoo, MPE's spread (vectors), SISL's pursuit (images) and rock-paper-scissors (Discrete
observations, one-hot) (``conf/env/pettingzoo.yaml`` is also checked with every env of
``conf/env`` by ``tests/test_env_conformance.py``)."""

import pytest

from machina.conformance.env import check_env
from machina.env.pettingzoo import PettingZooEnv


@pytest.mark.parametrize(
    "settings",
    [
        {"id": "tests.test_pettingzoo_relay:relay", "kwargs": {"finish": [2, 6, 9], "max_cycles": 7}},
        {"id": "tests.test_pettingzoo_relay:relay_aec", "kwargs": {"finish": [3, 5]}},
        {"id": "tests.test_pettingzoo_relay:relay", "kwargs": {"obs_sizes": [4, 6, 5]}, "pad_observations": True},
        {"id": "mpe2.simple_spread_v3", "kwargs": {"N": 2, "max_cycles": 10}},
        {
            "id": "sisl/pursuit-v5",
            "kwargs": {"max_cycles": 10, "x_size": 8, "y_size": 8, "n_pursuers": 2, "n_evaders": 2},
        },
        {"id": "classic/rps-v2", "kwargs": {"max_cycles": 5}},
    ],
)
def test_the_adapter_passes_the_env_check(settings):
    check_env(PettingZooEnv, settings, num_envs=3, steps=64)
