"""The training benchmark (``python -m machina.bench``): what it reports, and that ``--compare`` measures each
configuration under its own torch flags, its part rates included."""

import torch

from machina.speed import profile, training
from machina.training.learner import Learner


def test_compare_measures_each_configuration_under_its_own_flags(monkeypatch, capsys):
    seen: dict[int, set[str]] = {}
    run = Learner.run

    def recording_run(self, progress):
        seen.setdefault(id(self), set()).add(torch.get_float32_matmul_precision())
        return run(self, progress)

    monkeypatch.setattr(Learner, "run", recording_run)
    results = training.main(["--epochs", "1", "--compare", "system.bf16_matmuls=false,true", "debug=tiny"])
    # Every update of the first configuration (its epochs and its learner-only rate) ran at full float32 precision
    # (TF32 allowed, as system.tf32 says), every one of the second with bf16 products.
    assert sorted(map(sorted, seen.values())) == [["high"], ["medium"]]
    assert [r["overrides"][-1] for r in results] == ["system.bf16_matmuls=false", "system.bf16_matmuls=true"]
    for r in results:
        assert r["sps"] > 0 and r["learner_sps"] > 0 and r["inference_sps"] > 0 and r["env_sps"] > 0
        assert r["ceiling_sps"] < min(r["env_sps"], r["inference_sps"], r["learner_sps"])
        assert r["syncs_per_step"] == 0.0
    out = capsys.readouterr().out
    assert "sps ratio system.bf16_matmuls=true / system.bf16_matmuls=false:" in out


def test_the_profile_lists_the_updates_costliest_ops_and_the_lstm_has_per_step_products_the_qrnn_has_not(capsys):
    """``python -m machina.bench profile``: the update's ops by self time. An LSTM core multiplies its [B, H] state by
    W_hh at every step ([B, H] x [H, 4H] products); the quasi-recurrent core's products all take every B*T row."""
    tiny = ["debug=tiny", "policy.core.hidden_size=16"]
    lstm = ["policy.core._target_=machina.policy.lstm_core.LSTMCore"]
    shapes = {}
    for name, extra in (("qrnn", []), ("lstm", lstm)):
        result = profile.main(["--json", "--rows", "400", *tiny, *extra])
        assert result["update_seconds"] > 0 and result["minibatches"] >= 1
        ops = result["ops"]
        assert 0 < sum(op["share"] for op in ops) <= 1.0 + 1e-6
        assert [op["self_ms"] for op in ops] == sorted((op["self_ms"] for op in ops), reverse=True)
        shapes[name] = {op["shapes"] for op in ops if op["name"] == "aten::mm"}
    assert any(", [16, 64]]" in s for s in shapes["lstm"])  # h [B, 16] x W_hh^T [16, 64], step by step
    assert not any(", [16, 64]]" in s or ", [16, 48]]" in s for s in shapes["qrnn"])
    assert '"update_seconds"' in capsys.readouterr().out
