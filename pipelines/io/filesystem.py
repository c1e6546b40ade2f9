"""Writes through Beam's ``FileSystems``: atomic files and release folders on any Beam path.

Every file beamsynth writes outside a pipeline (manifests, reports, release folders) goes
through :class:`apache_beam.io.filesystems.FileSystems`, so ``gs://``, ``s3://``, ``hdfs://`` (and
any file system Beam discovers) work wherever Beam has the file system; a path without a scheme
is a local path. Beam-free of pipelines: plain functions.

* :func:`write_bytes_atomic` / :func:`write_text_atomic` / :func:`write_json_atomic`: write under a
  unique temporary name in the same folder (``.tmp-<id>-<name>``), then ``FileSystems.rename``;
  a reader never sees half a file (on object stores a rename is copy + delete: the final name
  appears only once the copy is complete). Local files are fsynced before the rename.
* :func:`move_folder`: publish a folder. Local: one ``os.rename`` (atomic on one file system).
  Elsewhere: every file is renamed, the ``marker`` file last, so a folder with its marker is
  complete.
* :func:`require_local`: for what must stay on the local disk (the SQLite privacy ledger).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from typing import Any

from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = [
    "delete_quietly",
    "exists",
    "folder_exists",
    "is_local",
    "join",
    "list_files",
    "move_folder",
    "read_bytes",
    "read_text",
    "require_local",
    "split",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


def is_local(path: str) -> bool:
    """Whether ``path`` is a local path (no ``scheme://``)."""
    return FileSystems.get_scheme(path) is None


def require_local(path: str, what: str) -> str:
    """``path`` as an absolute local path; ``ValueError`` naming ``what`` for ``scheme://`` paths."""
    if not is_local(path):
        raise ValueError(f"{what} ({path!r}) must be a local file path: it is a SQLite database, "
                         "which needs a local file system (keep it on the machine that runs "
                         "releases and back it up)")
    return os.path.abspath(path)


def _norm(path: str) -> str:
    return os.path.abspath(path) if is_local(path) else path


def join(base: str, *parts: str) -> str:
    """``base`` joined with ``parts`` by the rules of its file system."""
    return FileSystems.join(_norm(base), *parts)


def split(path: str) -> tuple[str, str]:
    """(folder, name) of ``path`` by the rules of its file system."""
    return FileSystems.split(_norm(path))


def exists(path: str) -> bool:
    """Whether the file (or local folder) ``path`` exists."""
    return FileSystems.exists(_norm(path))


def list_files(folder: str) -> list[str]:
    """Every file under ``folder`` (recursively), sorted; empty if there is none."""
    folder = _norm(folder).rstrip("/")
    if is_local(folder):
        return sorted(os.path.join(root, f) for root, _d, files in os.walk(folder) for f in files)
    try:
        found = FileSystems.match([folder + "/**"])[0].metadata_list
    except BeamIOError:
        return []
    return sorted(m.path for m in found)


def folder_exists(folder: str) -> bool:
    """Whether ``folder`` exists (object stores: whether any file lies under it)."""
    folder = _norm(folder)
    if is_local(folder):
        return os.path.exists(folder)
    return exists(folder) or bool(list_files(folder))


def delete_quietly(paths: Sequence[str]) -> None:
    """Delete files or folders (recursively); a missing one or a failure is ignored."""
    for p in paths:
        try:
            FileSystems.delete([_norm(p)])
        except (OSError, BeamIOError):
            pass


def _create(path: str) -> Any:
    return FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` on any Beam file system: temporary name, then rename."""
    path = _norm(path)
    folder, name = FileSystems.split(path)
    tmp = FileSystems.join(folder, f".tmp-{uuid.uuid4().hex}-{name}")
    try:
        with _create(tmp) as fh:  # a local create makes the missing folders
            fh.write(data)
        if is_local(tmp):
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        FileSystems.rename([tmp], [path])
    except BaseException:
        delete_quietly([tmp])
        raise


def write_text_atomic(path: str, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically (:func:`write_bytes_atomic`)."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str, data: Any) -> None:
    """Write ``data`` as indented JSON (UTF-8, trailing newline) to ``path`` atomically, on any
    Beam file system (``gs://``, ``s3://``, ``hdfs://``, local)."""
    write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")


def read_bytes(path: str) -> bytes:
    """The bytes of ``path`` (any Beam file system, no decompression)."""
    with FileSystems.open(_norm(path), compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        return fh.read()


def read_text(path: str) -> str:
    """The UTF-8 text of ``path``."""
    return read_bytes(path).decode("utf-8")


def move_folder(source: str, destination: str, *, marker: str | None = None) -> None:
    """Move folder ``source`` to ``destination`` (which must not exist).

    Local: one ``os.rename`` (atomic on one file system). Other file systems: each file is
    renamed, the file named ``marker`` (relative to the folder) last, so readers can take a
    folder holding its marker as complete.
    """
    source, destination = _norm(source).rstrip("/"), _norm(destination).rstrip("/")
    if is_local(source) and is_local(destination):
        os.rename(source, destination)
        return
    files = list_files(source)
    last = None if marker is None else FileSystems.join(source, marker)
    ordered = [f for f in files if f != last] + ([last] if last in files else [])
    for f in ordered:
        FileSystems.rename([f], [destination + f[len(source):]])
    delete_quietly([source])
