"""Pictures: python -m machina.plot RUN_DIR draws a run's metrics.jsonl to a PNG; the replay palette tells every
object type apart."""

import itertools
import json

import numpy as np
import pytest
from PIL import Image

from machina.env.render import FLOOR, OBJECT_COLOURS
from machina.plot import curve, main


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


def test_returns_of_several_runs_go_in_one_panel(tmp_path, capsys):
    for seed in (1, 2):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        rows = [{"metric/agent_step": 512 * (i + 1), "overview/reward": None if i % 3 else 10.0 * i} for i in range(9)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main([str(tmp_path / "seed1"), str(tmp_path / "seed2"), "--returns", "--out", str(tmp_path / "r.png")])
    assert capsys.readouterr().out.strip() == str(tmp_path / "r.png")
    with pytest.raises(SystemExit):
        main([str(tmp_path / "seed1"), str(tmp_path / "seed2")])  # several runs only with --returns


def test_a_curve_is_a_running_mean_against_steps_or_training_minutes():
    rows = [
        {"metric/agent_step": 100 * (i + 1), "timing/epoch": 30.0, "eval/return": 2.0 * i if i % 2 else None}
        for i in range(6)
    ]  # evaluated on epochs 1, 3 and 5 (0-based), one epoch every half minute
    rows = [{k: float("nan") if v is None else v for k, v in row.items()} for row in rows]
    assert curve(rows, "eval/return", "steps", window=1) == ([200, 400, 600], [2.0, 6.0, 10.0])
    assert curve(rows, "eval/return", "minutes", window=2) == ([1.0, 2.0, 3.0], [2.0, 4.0, 8.0])


def test_returns_take_a_metric_minutes_and_reference_lines(tmp_path, capsys):
    rows = [{"metric/agent_step": 512 * (i + 1), "timing/epoch": 6.0, "eval/return": float(i)} for i in range(5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval.png"
    args = [str(tmp_path), "--returns", "--metric", "eval/return", "--x", "minutes", "--line", "teacher=7.9"]
    main([*args, "--out", str(out)])
    assert capsys.readouterr().out.strip() == str(out) and out.stat().st_size > 0
    with pytest.raises(SystemExit):
        main([*args, "--line", "teacher=lots"])


def test_plot_names_a_folder_without_metrics(tmp_path):
    with pytest.raises(SystemExit, match="no metrics.jsonl"):
        main([str(tmp_path)])


# Colour-vision-deficiency simulation matrices on linear RGB (Machado, Oliveira & Fernandes 2009, severity 1.0).
CVD = {
    "normal": np.eye(3),
    "protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]],
    "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.01182, 0.04294, 0.968881]],
    "tritanopia": [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.3039]],
}


def lab(rgb, cvd) -> np.ndarray:
    """CIELAB (D65) of an sRGB colour as a viewer with ``cvd`` sees it."""
    c = np.asarray(rgb) / 255.0
    linear = np.clip(np.asarray(cvd) @ np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4), 0, 1)
    to_xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]])
    xyz = to_xyz @ linear / to_xyz.sum(1)
    f = np.where(xyz > 0.008856, np.cbrt(xyz), 7.787 * xyz + 16 / 116)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


@pytest.mark.parametrize("vision", list(CVD))
def test_every_object_type_has_a_colour_of_its_own_also_for_colour_blind_viewers(vision):
    """Walls and carbon extractors were once 70,70,80 and 60,60,60. Every pair of map colours (floor included) must
    now be at least 15 CIELAB units apart (clearly different side by side), also as simulated for each kind of
    colour blindness."""
    colours = {"floor": FLOOR, **{f"object type {kind}": colour for kind, colour in OBJECT_COLOURS.items()}}
    seen = {kind: lab(colour, CVD[vision]) for kind, colour in colours.items()}
    closest = min((float(np.linalg.norm(seen[a] - seen[b])), a, b) for a, b in itertools.combinations(seen, 2))
    assert closest[0] >= 15, closest
