"""Pictures: python -m machina.plot RUN_DIR draws a run's metrics.jsonl to a PNG; the replay palette tells every
object type apart."""

import itertools
import json

import numpy as np
import pytest
from PIL import Image

from machina.env.machina_1.render import FLOOR, OBJECT_COLOURS
from machina.plot import curve, main
from tests.test_compare import assert_one_line_error, hashes, run_cli


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


def test_plot_names_a_folder_without_metrics(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"python -m machina.plot: error: no metrics.jsonl in {str(tmp_path)!r}: pass a run folder written by train.py\n"
    )


def damaged_metrics(run):
    """A metrics.jsonl as a kill, a disk or a careless edit leaves it: every kind of bad line between good rows."""
    run.mkdir(parents=True)
    rows = [{"metric/agent_step": 512 * (i + 1), "overview/sps": 900.0, "overview/reward": float(i)} for i in range(4)]
    del rows[1]["overview/sps"], rows[2]["metric/agent_step"]
    rows[3]["overview/reward"] = "high"
    good = [json.dumps(r).encode() + b"\n" for r in rows]
    text = good[0] + b"[1, 2]\n" + b"\xff\xfe\n" + good[1] + b"7\n" + good[2] + good[3] + b'{"metric/agent_st'
    (run / "metrics.jsonl").write_bytes(text)
    return run


def test_plot_draws_what_a_damaged_metrics_file_holds_and_warns_about_the_rest(tmp_path):
    run = damaged_metrics(tmp_path / "run")
    before = hashes(tmp_path)
    result = run_cli("machina.plot", run)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout.strip() == str(run / "plot.png")
    assert result.stderr.splitlines() == [
        f"{run}: metrics.jsonl line 2: not a JSON object",
        f"{run}: metrics.jsonl line 3: invalid UTF-8",
        f"{run}: metrics.jsonl line 5: not a JSON object",
        f"{run}: metrics.jsonl line 8: torn (a partial last line: the run stopped while writing it)",
    ]
    with Image.open(run / "plot.png") as png:
        assert png.format == "PNG"
    assert hashes(tmp_path) == {**before, "run/plot.png": hashes(tmp_path)["run/plot.png"]}


def test_plot_command_line_errors_are_one_line_exit_2_and_write_nothing(tmp_path):
    run = damaged_metrics(tmp_path / "run")
    (tmp_path / "dir_run" / "metrics.jsonl").mkdir(parents=True)
    (run / "plot.png").mkdir()  # the default picture cannot be written there
    before = hashes(tmp_path)
    assert_one_line_error(run_cli("machina.plot", tmp_path / "missing"), "no such folder", "missing")
    assert_one_line_error(run_cli("machina.plot", tmp_path / "dir_run"), "dir_run/metrics.jsonl", "a folder")
    assert_one_line_error(run_cli("machina.plot", run), f"cannot write {run / 'plot.png'}", "--out PATH")
    assert_one_line_error(run_cli("machina.plot", run, "--out", run / "metrics.jsonl"), "metrics.jsonl", ".png")
    assert_one_line_error(run_cli("machina.plot", run, "--returns", "--window", "0", "--out", tmp_path / "r.png"))
    assert hashes(tmp_path) == before


def test_returns_leave_out_a_damaged_run_and_draw_the_others(tmp_path, capsys):
    damaged_metrics(tmp_path / "good")
    (tmp_path / "broken" / "metrics.jsonl").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "r.png"
    runs = [tmp_path / "good", tmp_path / "broken", tmp_path / "empty"]
    assert main([*map(str, runs), "--returns", "--out", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("left out")] == [
        f"left out {tmp_path / 'broken'}: {tmp_path / 'broken' / 'metrics.jsonl'}: is a folder, not a regular file; "
        "only regular files are read",
        f"left out {tmp_path / 'empty'}: no metrics.jsonl in {str(tmp_path / 'empty')!r}: pass a run folder written "
        "by train.py",
    ]
    with Image.open(out) as png:
        assert png.format == "PNG"
    assert main([*map(str, runs[1:]), "--returns", "--out", str(tmp_path / "none.png")]) == 2
    assert "none of the run folders has a readable metrics.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "none.png").exists()


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
