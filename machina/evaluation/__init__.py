"""Evaluation of policies on an env of their own: ``evaluator`` (the numbers), ``episodes`` (playing until every env
has ended an episode), ``actors`` (the policy, the env's scripted teacher, uniform random), ``rng`` (a forked torch
RNG, so that evaluating never changes training) and ``gif`` (an episode as an animated GIF)."""
