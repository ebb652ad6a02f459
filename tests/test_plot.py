"""python -m machina.plot RUN_DIR draws a run's metrics.jsonl to a PNG."""

import json

import pytest
from PIL import Image

from machina.plot import main


def test_plot_writes_a_png_from_metrics_jsonl(tmp_path, capsys):
    rows = [
        {
            "metric/agent_step": 1024 * (i + 1),
            "overview/reward": None if i == 0 else 0.1 * i,  # no episode ended in the first epoch
            "overview/sps": 5000.0 + i,
            "losses/ppo/loss_policy": -0.01 * i,
            "losses/ppo/loss_value": 0.5 / (i + 1),
            "losses/ppo/approx_kl": 0.001,
        }
        for i in range(4)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main([str(tmp_path)])
    assert capsys.readouterr().out.strip() == str(tmp_path / "plot.png")
    with Image.open(tmp_path / "plot.png") as png:
        assert png.format == "PNG" and png.size[0] > png.size[1]

    main([str(tmp_path), "--out", str(tmp_path / "other.png")])
    assert (tmp_path / "other.png").is_file()


def test_plot_names_a_folder_without_metrics(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        main([str(tmp_path)])
