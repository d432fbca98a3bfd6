"""The commit record of a checkpoint: step, world size, config hash, every file's size and
sha256, time. Written by rank 0 after all ranks finished; verification names the bad file."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.checkpoint.layout import MANIFEST

FORMAT_VERSION = 1
_CHUNK_BYTES = 8 << 20


class CheckpointCorrupt(RuntimeError):
    """A committed checkpoint whose files do not match its manifest."""


@dataclass
class FileEntry:
    size_bytes: int
    sha256: str


@dataclass
class Manifest:
    step: int
    world_size: int
    config_hash: str
    created_unix: float
    files: dict[str, FileEntry] = field(default_factory=dict)  # relative path -> entry
    format_version: int = FORMAT_VERSION

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Manifest:
        raw = json.loads(text)
        files = {k: FileEntry(**v) for k, v in raw.pop("files").items()}
        return Manifest(files=files, **raw)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def data_files(directory: Path) -> list[str]:
    """Every file under the checkpoint directory except the manifest, as relative paths."""
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def build_manifest(directory: Path, step: int, world_size: int, config_hash: str) -> Manifest:
    files = {
        rel: FileEntry((directory / rel).stat().st_size, sha256_file(directory / rel))
        for rel in data_files(directory)
    }
    return Manifest(step, world_size, config_hash, time.time(), files)


def read_manifest(directory: Path) -> Manifest:
    path = directory / MANIFEST
    try:
        return Manifest.from_json(path.read_text())
    except FileNotFoundError:
        raise CheckpointCorrupt(
            f"{directory}: no {MANIFEST} (not a committed checkpoint)"
        ) from None
    except (ValueError, TypeError, KeyError) as exc:
        raise CheckpointCorrupt(f"{path}: unreadable manifest ({exc})") from None


def verify(directory: Path, checksums: bool = True) -> Manifest:
    """The manifest, once every listed file exists with its size (and sha256 when
    `checksums`); raises CheckpointCorrupt naming the first bad file otherwise."""
    manifest = read_manifest(directory)
    if ".metadata" not in manifest.files:
        raise CheckpointCorrupt(f"{directory}: manifest lists no .metadata (not a DCP checkpoint)")
    for rel, entry in sorted(manifest.files.items()):
        path = directory / rel
        if not path.is_file():
            raise CheckpointCorrupt(f"{path}: missing (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != entry.size_bytes:
            raise CheckpointCorrupt(
                f"{path}: size {size} bytes, manifest says {entry.size_bytes} (truncated or altered)"
            )
        if checksums and sha256_file(path) != entry.sha256:
            raise CheckpointCorrupt(f"{path}: sha256 differs from the manifest (altered)")
    return manifest
