"""The Gymnasium adapter, ``GymnasiumEnv`` (``env=gymnasium``; the ``gym`` extra): any registered Gymnasium env with
flat Box observations and Discrete actions behind machina's env interface. Importing this package does not import
``gymnasium``: ``GymnasiumEnv`` imports it when an env is built."""

from machina.env.gymnasium.env import GymnasiumEnv

__all__ = ["GymnasiumEnv"]
