"""The ``logger`` group: a sink defined here and selected by one override receives every epoch's metrics of a real
in-process run; the CSV sink writes metrics.jsonl's rows; a run without the W&B sink writes no W&B folder; a
``logger`` list without jsonl, a target that is not a sink, a setting a sink does not take and a bad ``evaluation``
value are refused before anything is written."""

import csv
import json
import math
import re
from pathlib import Path

import pytest

from machina.errors import ConfigError
from machina.files.metrics_file import encode_row
from machina.logging.csv_sink import CsvSink
from machina.logging.sink import Sink, Sinks
from machina.run import train
from machina.startup.build import build_sinks
from tests.conftest import compose_config

# One debug epoch of 1,024 agent steps, W&B off unless a test turns it on.
ONE_EPOCH = ["debug=tiny", "trainer.total_timesteps=1024", "wandb=disabled"]
HERE = f"{__name__}.Recorder"


class Recorder(Sink):
    """Records every call, in a class-level list (Hydra builds the instance)."""

    calls: list[tuple] = []

    def __init__(self, label: str = "none"):
        self.label = label
        Recorder.calls.append(("init", label))

    def log(self, metrics):
        Recorder.calls.append(("log", dict(metrics)))

    def log_media(self, name, path, step):
        Recorder.calls.append(("media", name, Path(path), step))

    def summarize(self, summary):
        Recorder.calls.append(("summary", dict(summary)))

    def close(self, error=None):
        Recorder.calls.append(("close", error))


@pytest.fixture
def recorder():
    Recorder.calls = []
    return Recorder.calls


def jsonl_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_logger_defined_in_a_test_gets_every_epoch_the_replay_and_the_summary(tmp_path, recorder):
    cfg = compose_config(
        [
            *ONE_EPOCH,
            "trainer.total_timesteps=2048",
            "trainer.replay_interval=2",
            f"+logger.mine._target_={HERE}",
            "+logger.mine.label=mine",
        ]
    )
    objective = train(cfg, tmp_path)
    kinds = [call[0] for call in recorder]
    assert kinds == ["init", "log", "media", "log", "summary", "close"]  # a replay comes before its epoch's row
    assert recorder[0] == ("init", "mine")
    rows = jsonl_rows(tmp_path)
    logged = [call[1] for call in recorder if call[0] == "log"]
    assert [row["metric/epoch"] for row in logged] == [1, 2]
    assert [json.loads(encode_row(row)) for row in logged] == rows  # the same rows as metrics.jsonl
    assert recorder[2] == ("media", "eval/replay", tmp_path / "replays" / "replay_000002.gif", 2048)
    assert recorder[2][2].is_file()
    summary = recorder[4][1]
    assert summary["summary/agent_steps"] == 2048 and summary[cfg.objective] == pytest.approx(objective, nan_ok=True)
    assert recorder[5] == ("close", None)
    assert not (tmp_path / "wandb").exists()  # wandb=disabled writes nothing


def test_a_stopped_run_closes_its_sinks_with_the_error_and_the_summary_it_reached(tmp_path, recorder, monkeypatch):
    from machina.training.trainer import Trainer

    run_epoch = Trainer.run_epoch

    def second_epoch_fails(self):
        if self.epoch == 1:
            raise RuntimeError("boom")
        return run_epoch(self)

    monkeypatch.setattr(Trainer, "run_epoch", second_epoch_fails)
    cfg = compose_config([*ONE_EPOCH, "trainer.total_timesteps=3072", f"+logger.mine._target_={HERE}"])
    with pytest.raises(RuntimeError, match="boom"):
        train(cfg, tmp_path)
    (summary,) = [call[1] for call in recorder if call[0] == "summary"]
    assert summary["summary/agent_steps"] == 1024  # what the run reached
    kind, error = recorder[-1]
    assert kind == "close" and isinstance(error, RuntimeError)


def test_the_csv_sink_writes_the_rows_of_metrics_jsonl(tmp_path):
    cfg = compose_config(
        [
            *ONE_EPOCH,
            "trainer.total_timesteps=3072",
            "trainer.eval_interval=2",
            "evaluation.episodes=4",
            "logger=[console,jsonl,csv]",
        ]
    )
    train(cfg, tmp_path)
    expected = jsonl_rows(tmp_path)
    assert [row.get("eval/episodes") for row in expected] == [None, 4, 4]  # the evaluation node's episodes
    with (tmp_path / "metrics.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(expected) == 3
    # The header grew when evaluation first ran (epoch 2): eval/* are columns, empty on epoch 1.
    assert "eval/return" in table[0] and table[0]["eval/return"] == "" and table[1]["eval/return"] != ""
    for row, want in zip(table, expected, strict=True):
        assert set(want) <= set(row)
        for name, value in row.items():
            if name not in want or want[name] is None:
                assert value == "", name
            else:
                assert float(value) == want[name], name
    assert not (tmp_path / "wandb").exists()


def test_the_csv_sink_starts_from_metrics_jsonl_and_writes_missing_values_as_empty_cells(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(encode_row({"metric/epoch": 1, "a": 0.1}))
    (tmp_path / "metrics.csv").write_text("stale,rows\n9,9\n9,9\n")  # rows a resume rewound away
    sink = CsvSink(tmp_path / "metrics.csv", [json.loads(encode_row({"metric/epoch": 1, "a": 0.1}))])
    sink.log({"metric/epoch": 2, "a": float("nan")})
    sink.log({"metric/epoch": 3, "a": 1 / 3, "b": math.inf})
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "metric/epoch,a,b",
        "1,0.1,",
        "2,,",
        f"3,{1 / 3!r},",
    ]


def test_without_wandb_in_the_logger_list_no_wandb_folder_is_written(tmp_path, wandb_dirs, recorder):
    cfg = compose_config([*ONE_EPOCH, "wandb=offline", "logger=[console,jsonl]", f"+logger.mine._target_={HERE}"])
    train(cfg, tmp_path / "run")
    assert len(jsonl_rows(tmp_path / "run")) == 1
    assert not (tmp_path / "run" / "wandb").exists() and not (tmp_path / "wandb-home").exists()


def test_the_default_loggers_are_console_jsonl_and_an_offline_wandb_run(tmp_path, wandb_dirs):
    cfg = compose_config(["debug=tiny", "trainer.total_timesteps=1024"])
    assert list(cfg.logger) == ["console", "jsonl", "wandb"] and cfg.wandb.mode == "offline"
    train(cfg, tmp_path)
    assert [row["metric/epoch"] for row in jsonl_rows(tmp_path)] == [1]
    assert list((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["logger=[console]"], "logger has no jsonl"),
        (["logger=[console,wandb]"], "logger has no jsonl"),
        (["evaluation.episodes=0"], "evaluation.episodes=0 must be an integer >= 1"),
        (["+evaluation.episode=8"], "evaluation has unknown keys ['episode']"),
        (
            ["+logger.mine._target_=machina.errors.ConfigError"],
            "logger.mine._target_=machina.errors.ConfigError is not a sink",
        ),
        (["+logger.mine._target_=no.such.Sink"], "logger.mine._target_=no.such.Sink names no class"),
        ([f"+logger.mine._target_={HERE}", "+logger.mine.colour=red"], "logger.mine (tests.test_loggers.Recorder): "),
        (["+logger.jsonl.path=/tmp/x"], "logger.jsonl (machina.logging.sinks.JsonlSink): "),
    ],
)
def test_a_bad_logger_list_is_refused_before_anything_is_written(tmp_path, recorder, overrides, message):
    cfg = compose_config([*ONE_EPOCH, *overrides])
    with pytest.raises(ConfigError, match=re.escape(message)):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists() and recorder == []


def test_sinks_open_only_when_asked_and_close_each_one_once(tmp_path, recorder):
    cfg = compose_config([*ONE_EPOCH, "logger=[jsonl]", f"+logger.mine._target_={HERE}"])
    sinks = build_sinks(cfg, tmp_path / "run", "abcd1234", {})
    assert list(sinks) == [] and recorder == [] and not (tmp_path / "run").exists()
    sinks.open()
    assert [type(sink).__name__ for sink in sinks] == ["JsonlSink", "Recorder"]
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    sinks.close()
    sinks.close()
    assert recorder == [("init", "none"), ("close", None)]


def test_a_sink_that_fails_to_open_closes_those_already_open(recorder):
    def broken():
        raise OSError("disk gone")

    sinks = Sinks([Recorder, broken])
    with pytest.raises(OSError, match="disk gone"):
        sinks.open()
    assert recorder[-1][0] == "close" and isinstance(recorder[-1][1], OSError) and list(sinks) == []


def test_wandb_shows_the_runs_own_identity_with_the_wandb_group_and_tags_added(tmp_path, monkeypatch):
    """W&B reads the run's identity (``RunInfo``); ``wandb.group`` replaces only W&B's group, ``wandb.tags`` add to
    W&B's tags. The fake ``wandb.init`` records its arguments and fails, which the sink survives."""
    import wandb

    from machina.logging.sink import RunInfo
    from machina.logging.wandb_sink import WandbSink

    seen = []

    def init(**kwargs):
        seen.append(kwargs)
        raise RuntimeError("no W&B in this test")

    monkeypatch.setattr(wandb, "init", init)
    run = RunInfo(tmp_path, "abc", {}, name="3:x=1", group="sweep", tags=["loss:ppo"], job_type="ppo")
    assert WandbSink.for_run(run, mode="offline", project="p").run is None
    WandbSink.for_run(run, mode="offline", project="p", group="ablation", tags=["mine"])
    own, chosen = ({k: call[k] for k in ("id", "name", "group", "tags", "job_type")} for call in seen)
    assert own == {"id": "abc", "name": "3:x=1", "group": "sweep", "tags": ["loss:ppo"], "job_type": "ppo"}
    assert chosen == own | {"group": "ablation", "tags": ["loss:ppo", "mine"]}


def test_every_sink_gets_the_runs_identity_whatever_the_wandb_settings(tmp_path):
    cfg = compose_config([*ONE_EPOCH, "wandb.group=ablation", "wandb.tags=[mine]", f"+logger.mine._target_={HERE}"])
    sinks = build_sinks(cfg, tmp_path, "abc", {})
    run = sinks.openers[-1].args[0]  # the RunInfo the recorder's for_run is given
    assert run.id == "abc" and run.group is None and "mine" not in run.tags and "loss:ppo" in run.tags


def test_metrics_csv_never_holds_a_cell_a_spreadsheet_would_run_as_a_formula(tmp_path, caplog):
    """A run folder whose metrics.jsonl has metric names (and a damaged row's text) that start like a formula: the
    rebuilt metrics.csv shows them as text (a ' in front) and keeps negative numbers as numbers; the log says the
    file is a view of metrics.jsonl, rebuilt at each start."""
    from machina.logging.sink import RunInfo

    names = ['=HYPERLINK("http://x")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "plain"]
    rows = [{"metric/epoch": 1, **{name: -0.5 for name in names}}, {"metric/epoch": 2, "plain": "=1+1"}]
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(encode_row(row) for row in rows))
    with caplog.at_level("INFO", logger="machina.logging.csv_sink"):
        CsvSink.for_run(RunInfo(tmp_path, "abc", {}))
    assert "metrics.csv: rebuilt from metrics.jsonl (2 rows)" in caplog.text
    with (tmp_path / "metrics.csv").open(newline="") as f:
        header, *table = list(csv.reader(f))
    assert header == ["metric/epoch", *(f"'{name}" if name != "plain" else name for name in names)]
    assert table == [["1", *["-0.5"] * len(names)], ["2", "", "", "", "", "", "'=1+1"]]
