"""machina: a Hydra-configured RL experiment framework for fast multi-agent training."""
