"""The MettaGrid adapter, ``MettaGridEnv`` (``env=mettagrid``; the ``mettagrid`` extra): any MettaGrid game behind
machina's env interface, its game files (``game_file``, the shipped ``games/``), their builders (``game``) and the
processes that step them (``sims``, ``workers``). Importing this package imports no ``mettagrid`` engine module:
``MettaGridEnv`` imports them when an env is built, so the extra stays optional."""

from machina.env.mettagrid.env import MettaGridEnv

__all__ = ["MettaGridEnv"]
