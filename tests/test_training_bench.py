"""The training benchmark (``python -m machina.bench``): what it reports, and that ``--compare`` measures each
configuration under its own torch flags, its part rates included."""

import torch

from machina.speed import training
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
