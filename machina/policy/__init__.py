"""Policies: a ``ComponentPolicy`` (component.py) built by Hydra from ``conf/policy/*.yaml``.

Components: ``TokenBagEncoder`` (bag_encoder.py, policy=fast) or ``PerceiverEncoder`` (perceiver.py, policy=vit),
``QRNNCore`` (qrnn_core.py, policy=fast) or ``LSTMCore`` (lstm_core.py), each with a skip of its input past its
state (core_skip.py), ``ActorHead`` / ``CriticHead`` (heads.py), then ``ActionProbs`` (action_probs.py).
``python -m machina.bench policy`` measures their throughput.
"""
