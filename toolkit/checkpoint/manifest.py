"""The commit record of a checkpoint: step, world size, config hash, every file's size and
checksum, time. Written by rank 0 after all ranks finished; verification names the bad file.

Checksums are xxh3-128 (format 2): they detect truncated, torn or altered files at a
fraction of sha256's CPU per GB (see docs/BENCHMARKS.md, Issue 4), which on CPU-only nodes
competes with training for the same cores. They are integrity checks against accidents, not
signatures: whoever can rewrite a shard can rewrite the manifest too. Format-1 manifests (sha256) still verify.

Every path a manifest lists must stay inside the checkpoint directory (no absolute path, no
`..`, no symlink leading out). The manifest also names the torch and toolkit versions that
wrote the checkpoint: DCP reads checkpoints of an older torch, not of a newer one, so a
checkpoint of a newer torch is refused before any rank loads it (manifests without the
versions, written before they were recorded, are read as before).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import torch
import xxhash

import toolkit
from toolkit.checkpoint.layout import MANIFEST, TRAIN_STATE, parse_step

FORMAT_VERSION = 2
CHECKSUM = "xxh3_128"
_HASHES: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_CHUNK_BYTES = 8 << 20


class CheckpointCorrupt(RuntimeError):
    """A committed checkpoint whose files do not match its manifest."""


class CheckpointTooNew(RuntimeError):
    """A checkpoint written by a newer torch than this process runs (DCP cannot read it)."""


@dataclass
class FileEntry:
    size_bytes: int
    checksum: str


@dataclass
class Manifest:
    step: int
    world_size: int
    config_hash: str
    created_unix: float
    files: dict[str, FileEntry] = field(default_factory=dict)  # relative path -> entry
    checksum_algorithm: str = CHECKSUM
    format_version: int = FORMAT_VERSION
    torch_version: str | None = None  # None: written before versions were recorded
    toolkit_version: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files.values())

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Manifest:
        raw = json.loads(text)
        if raw.get("format_version", 1) == 1:  # sha256 under its own key
            raw["checksum_algorithm"] = "sha256"
            for entry in raw["files"].values():
                entry["checksum"] = entry.pop("sha256")
        if raw["checksum_algorithm"] not in _HASHES:
            raise ValueError(f"unknown checksum algorithm {raw['checksum_algorithm']!r}")
        files = {k: FileEntry(**v) for k, v in raw.pop("files").items()}
        return Manifest(files=files, **raw)


def new_hash(algorithm: str = CHECKSUM) -> Any:
    """A running checksum (`update(bytes)`, `hexdigest()`) of the given algorithm."""
    return _HASHES[algorithm]()


def checksum_file(path: Path, algorithm: str = CHECKSUM) -> str:
    h = new_hash(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def describe_files(directory: Path, relative: list[str]) -> dict[str, FileEntry]:
    """Size and checksum of the given files (paths relative to `directory`)."""
    return {
        rel: FileEntry((directory / rel).stat().st_size, checksum_file(directory / rel))
        for rel in relative
    }


def data_files(directory: Path) -> list[str]:
    """Every file under the checkpoint directory except the manifest, as relative paths."""
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def build_manifest(
    directory: Path,
    step: int,
    world_size: int,
    config_hash: str,
    known: dict[str, FileEntry] | None = None,
) -> Manifest:
    """The manifest of every file in `directory`. `known` holds entries other ranks computed
    for the shards they wrote; they are used when the size on disk still matches, and every
    other file is checksummed here."""
    known = known or {}
    files = {}
    todo = []
    for rel in data_files(directory):
        entry = known.get(rel)
        if entry is not None and (directory / rel).stat().st_size == entry.size_bytes:
            files[rel] = entry
        else:
            todo.append(rel)
    files.update(describe_files(directory, todo))
    return Manifest(
        step,
        world_size,
        config_hash,
        time.time(),
        dict(sorted(files.items())),
        torch_version=torch.__version__,
        toolkit_version=toolkit.__version__,
    )


def file_in(directory: Path, relative: str, listed_in: Path) -> Path:
    """`directory / relative`, once `relative` names a file inside `directory`: not absolute,
    no `..`, no symlink leading out. Raises CheckpointCorrupt naming `listed_in`, the file
    that lists the path, otherwise."""
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts:
        raise CheckpointCorrupt(
            f"{listed_in}: lists {relative!r}, a path outside the checkpoint directory; refused"
        )
    path = directory / relative
    if not path.resolve().is_relative_to(directory.resolve()):
        raise CheckpointCorrupt(
            f"{listed_in}: lists {relative!r}, a symlink leading out of {directory}; refused"
        )
    return path


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a version string: "2.15.0+cu128" -> (2, 15, 0)."""
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(n) for n in match.group(0).split(".")) if match else ()


def check_torch_version(directory: Path, manifest: Manifest, running: str | None = None) -> None:
    """Raise CheckpointTooNew when the checkpoint was written by a newer torch release than
    `running` (this process's): DCP's metadata gains fields between releases, and an older
    torch fails deep inside the load on every rank."""
    running = running or torch.__version__
    written = manifest.torch_version
    if written is None or release(written) <= release(running):
        return
    raise CheckpointTooNew(
        f"{directory}: written by torch {written} (toolkit {manifest.toolkit_version}), "
        f"this job runs torch {running} (toolkit {toolkit.__version__}), which cannot read "
        f"checkpoints of a newer torch; resume with torch>={'.'.join(map(str, release(written)))}, "
        "or start without this checkpoint"
    )


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
    """The manifest, once every listed file exists with its size (and checksum when
    `checksums`); raises CheckpointCorrupt naming the first bad file otherwise."""
    manifest = verify_sizes(directory)
    if checksums:
        verify_checksums(directory, manifest, sorted(manifest.files))
    check_metadata(directory, manifest)
    return manifest


def verify_sizes(directory: Path, share: tuple[int, int] = (0, 1)) -> Manifest:
    """The manifest, once every file it lists lies inside `directory` and exists with its
    size, every file in `directory` is listed, the train state's step is possible, and this
    torch can read it (cheap: only the small train state is read). Raises CheckpointTooNew
    for a checkpoint of a newer torch.

    `share=(k, n)`: ranks that verify together and gather their verdicts each check the sizes
    of every n-th listed file from the k-th on, and share 0 alone lists the directory for
    unlisted files; without it every rank would stat every file of the checkpoint (2 per
    rank), n x (2n + 3) metadata operations on the shared file system at resume."""
    index, count = share
    manifest = read_manifest(directory)
    if ".metadata" not in manifest.files:
        raise CheckpointCorrupt(f"{directory}: manifest lists no .metadata (not a DCP checkpoint)")
    check_torch_version(directory, manifest)
    for rel, entry in sorted(manifest.files.items())[index::count]:
        path = file_in(directory, rel, directory / MANIFEST)
        if not path.is_file():
            raise CheckpointCorrupt(f"{path}: missing (listed in {MANIFEST})")
        size = path.stat().st_size
        if size != entry.size_bytes:
            raise CheckpointCorrupt(
                f"{path}: size {size} bytes, manifest says {entry.size_bytes} (truncated or altered)"
            )
    for rel in data_files(directory) if index == 0 else []:
        if rel not in manifest.files:
            raise CheckpointCorrupt(
                f"{directory / rel}: not listed in {MANIFEST}, so never verified; refused"
            )
    check_train_state(directory, manifest)
    return manifest


def check_metadata(directory: Path, manifest: Manifest) -> None:
    """Raise CheckpointCorrupt unless DCP's `.metadata` unpickles (safely, through
    toolkit.checkpoint.trust) and every file it refers to is listed in the manifest (and so
    verified). Call after the checksums: an altered `.metadata` is named as such first."""
    from toolkit.checkpoint.trust import MetadataUnpickler, UnsafeCheckpoint

    meta_path = directory / ".metadata"
    try:
        with open(meta_path, "rb") as f:
            metadata = MetadataUnpickler(f, meta_path).load()
    except UnsafeCheckpoint:
        metadata = None  # refused at load, naming what it refers to (toolkit.checkpoint.trust)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure: unreadable
        raise CheckpointCorrupt(
            f"{meta_path}: unreadable DCP metadata ({type(exc).__name__}: {exc}); refused"
        ) from None
    storage = getattr(metadata, "storage_data", None) or {}
    for info in storage.values():
        rel = str(getattr(info, "relative_path", ""))
        if rel not in manifest.files:
            raise CheckpointCorrupt(
                f"{meta_path}: refers to {rel!r}, which {MANIFEST} does not list; refused"
            )


def check_train_state(directory: Path, manifest: Manifest) -> None:
    """The train state (when the checkpoint has one) is a JSON object whose step is a
    non-negative integer equal to the manifest's and the directory name's."""
    path = directory / TRAIN_STATE
    if not path.is_file():
        return
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointCorrupt(f"{path}: unreadable train state ({exc}); refused") from None
    step = state.get("step") if isinstance(state, dict) else None
    named = parse_step(directory.name)
    if (
        type(step) is not int
        or step < 0
        or step != manifest.step
        or (named is not None and step != named)
    ):
        raise CheckpointCorrupt(
            f"{path}: step {step!r} is impossible for {directory.name} (manifest step "
            f"{manifest.step}); refused"
        )


def verify_checksums(directory: Path, manifest: Manifest, files: list[str]) -> None:
    """Check the given files (relative paths listed in the manifest) against their checksums;
    ranks that resume together each check a share (see CheckpointHook)."""
    for rel in files:
        path = file_in(directory, rel, directory / MANIFEST)
        if checksum_file(path, manifest.checksum_algorithm) != manifest.files[rel].checksum:
            raise CheckpointCorrupt(
                f"{path}: {manifest.checksum_algorithm} checksum differs from the manifest (altered)"
            )
