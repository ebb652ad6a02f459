"""Read back an offline W&B run (``run-*.wandb``) in tests: run record and history rows.

The file is a LevelDB-style log: a 7-byte header (b":W&B", magic 0xBEE1, version), then 32 KiB blocks of records,
each with a 7-byte header (crc32, length, type) and a protobuf ``Record`` payload, split across blocks as
FIRST/MIDDLE/LAST pieces when long. wandb ships no reader in 0.31, so tests carry this small one.
"""

import json
import struct
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    data = Path(path).read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    if ident != b":W&B" or magic != 0xBEE1:
        raise ValueError(f"{path} is not a W&B transaction log")
    pos, pieces = 7, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            pos += room
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        pieces = chunk if kind in (FULL, FIRST) else pieces + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            pieces = b""
            yield record


def read_run(path: Path) -> dict:
    """Return {"run": RunRecord, "history": [dict], "config": {key: value}, "summary": {key: value}, "exit_code":
    int or None (no exit record: the process died), "kinds": [record type, ...]} for one ``.wandb`` file. The summary
    is the summary records' updates applied in order."""
    run, history, summary, exit_code, kinds = None, [], {}, None, []
    for record in records(path):
        kind = record.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append(items(record.history.item))
        elif kind == "summary":
            summary.update(items(record.summary.update))
        elif kind == "exit":
            exit_code = record.exit.exit_code
    config = {item.key: json.loads(item.value_json) for item in run.config.update} if run else {}
    return {
        "run": run,
        "history": history,
        "config": config,
        "summary": summary,
        "exit_code": exit_code,
        "kinds": kinds,
    }


def items(entries) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in entries}


def find_runs(directory: Path) -> list[Path]:
    return sorted(Path(directory).rglob("run-*.wandb"))
