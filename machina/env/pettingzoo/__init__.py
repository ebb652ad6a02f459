"""The PettingZoo adapter, ``PettingZooEnv`` (``env=pettingzoo``; the ``pettingzoo`` extra): any PettingZoo parallel
env (or parallelizable AEC env) with Box observations (flattened; (H, W, C) images for ``policy=conv``) or Discrete
ones (one-hot) and one Discrete action space behind machina's env interface. Importing this package does not import
``pettingzoo``: the env imports it when it is built."""

from machina.env.pettingzoo.env import PettingZooEnv

__all__ = ["PettingZooEnv"]
