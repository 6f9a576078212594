"""Read back what wandb wrote offline: history rows, config, artifacts and the exit code.

wandb (0.31) has no public reader for offline runs. A run's ``run-<id>.wandb`` file is a
LevelDB-style log: a 7-byte file header (``:W&B``, magic 0xBEE1 little-endian, version 0),
then 32 KiB blocks of records, each ``crc32 (uint32) | length (uint16) | type (uint8) | data``,
where type is FULL, FIRST, MIDDLE or LAST (a record split across blocks), a block's last < 7
bytes are zero padding, and the crc (zlib's CRC-32) covers the type byte then the data. Each
whole record is a ``wandb.proto.wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_FILE_HEADER = b":W&B\xe1\xbe"  # ident, magic 0xBEE1; then one version byte
_FILE_HEADER_LEN = 7
_BLOCK_LEN = 32768
_RECORD_HEADER_LEN = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """One ``run-<id>.wandb`` file, decoded."""

    path: Path
    run_id: str = ""
    project: str = ""
    display_name: str = ""
    tags: list[str] = field(default_factory=list)
    step_metrics: dict[str, str] = field(default_factory=dict)  # metric or glob -> x axis
    history: list[dict[str, Any]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int | None = None


def read_records(path: str | os.PathLike[str]) -> list[bytes]:
    """The payloads of every complete record of a ``.wandb`` file, in order (crc checked)."""
    data = Path(path).read_bytes()
    if not data.startswith(_FILE_HEADER):
        raise ValueError(f"{path} is not a wandb log file (header {data[:7]!r})")
    records: list[bytes] = []
    pending = b""
    position = _FILE_HEADER_LEN
    while position + _RECORD_HEADER_LEN <= len(data):
        left_in_block = _BLOCK_LEN - position % _BLOCK_LEN
        if left_in_block < _RECORD_HEADER_LEN:
            position += left_in_block  # zero padding at the end of a block
            continue
        checksum, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if checksum == 0 and length == 0 and kind == 0:
            break  # preallocated zeros: the end of what was written
        if position + _RECORD_HEADER_LEN + length > len(data):
            break  # a record still being written
        body = data[position + 7 : position + 7 + length]
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF != checksum:
            raise ValueError(f"{path}: bad checksum at byte {position}")
        position += _RECORD_HEADER_LEN + length
        if kind == _FULL:
            records.append(body)
        elif kind == _FIRST:
            pending = body
        elif kind == _MIDDLE:
            pending += body
        elif kind == _LAST:
            records.append(pending + body)
            pending = b""
    return records


def read_run(path: str | os.PathLike[str]) -> OfflineRun:
    """Decode a ``run-<id>.wandb`` file into history rows, config, artifacts and exit code."""
    from wandb.proto import wandb_internal_pb2

    run = OfflineRun(path=Path(path))
    for payload in read_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id = record.run.run_id
            run.project = record.run.project
            run.display_name = record.run.display_name
            run.tags = list(record.run.tags)
            _update_config(run.config, record.run.config.update)
        elif kind == "config":
            _update_config(run.config, record.config.update)
        elif kind == "history":
            run.history.append(
                {_item_key(item): json.loads(item.value_json) for item in record.history.item}
            )
        elif kind == "artifact":
            run.artifacts.append(
                {
                    "name": record.artifact.name,
                    "type": record.artifact.type,
                    "aliases": list(record.artifact.aliases),
                    "metadata": json.loads(record.artifact.metadata or "{}"),
                    "files": sorted(entry.path for entry in record.artifact.manifest.contents),
                }
            )
        elif kind == "metric":
            name = record.metric.name or record.metric.glob_name
            run.step_metrics[name] = record.metric.step_metric
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    return run


def find_runs(root: str | os.PathLike[str], *, wait_s: float = 10.0) -> list[OfflineRun]:
    """Every finished offline run under ``root`` (its ``wandb/`` folder or above), oldest first.

    ``run.finish()`` returns before wandb's service process has written the end of the file
    (its stream closes asynchronously), so this waits up to ``wait_s`` for each run's exit
    record. Runs are ordered by their files' modification times: a resumed offline run with
    the same id in the same second gets a folder named ``...-<id>-1``.
    """
    deadline = time.monotonic() + wait_s
    while True:
        paths = sorted(
            Path(root).rglob("offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime_ns
        )
        runs = [read_run(path) for path in paths]
        if all(run.exit_code is not None for run in runs) or time.monotonic() > deadline:
            return runs
        time.sleep(0.02)


def _item_key(item: Any) -> str:
    """wandb 0.31 fills ``nested_key``; older writers used ``key``."""
    return item.key or "/".join(item.nested_key)


def _update_config(config: dict[str, Any], items: Any) -> None:
    for item in items:
        key = _item_key(item)
        if key != "_wandb":
            config[key] = json.loads(item.value_json)
