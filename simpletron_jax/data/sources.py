"""What the data command shares across tasks: the public downloads, where a task reads from,
the manifest, archives and the checks (``python -m simpletron_jax.data``; docs/data.md).

Nothing here downloads. A task's record (:class:`simpletron_jax.data.tasks.TaskSpec`) names
its :class:`Download` and the functions that find, prepare and check its data; they build on
these helpers. :func:`write_manifest` records each output's size and SHA-256 (and the source's
size and MD5) in :data:`MANIFEST`, which :func:`check_manifest` reads back.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import tarfile
import time
import zlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from simpletron_jax.runtime import atomic_io

MANIFEST = "simpletron_prepared.json"
MANIFEST_FORMAT = "simpletron_jax.data.prepare/1"
COMMAND = "python -m simpletron_jax.data"
SPLITS = ("train", "val", "test")

Check = tuple[str, str]
"""One line of ``verify``: ``(status, text)``, status ``ok``, ``FAIL`` or ``note``."""


class DataError(ValueError):
  """A user's data or source cannot be used; the one-line message names the file and what
  to do."""


@dataclasses.dataclass(frozen=True)
class Download:
  """A public file a task's data comes from.

  Attributes:
    file: its name.
    url: its address.
    md5: its published MD5 (None when none is published).
    what: what it holds, for the messages.
  """

  file: str
  url: str
  md5: str | None
  what: str


LRA_RELEASE = Download("lra_release.gz",
                       "https://storage.googleapis.com/long-range-arena/lra_release.gz", None,
                       "LRA's release (ListOps, AAN retrieval, Pathfinder, Path-X)")
"""LRA's release archive: in it ``lra_release/listops-1000/``, ``lra_release/tsv_data/`` (AAN),
``lra_release/pathfinder32/`` and ``pathfinder128/``."""


@dataclasses.dataclass
class Where:
  """Where a task reads its data from.

  Attributes:
    task: the task.
    kind: the source kind (``tfds``, ``npz``, ``jsonl``, ``aclimdb``, ``csv``, ``tsv``,
      ``generated``, ``lra``, ...), or ``missing``.
    path: the file or folder (for ``jsonl`` and ``csv`` the folder of the two files); for
      data not generated yet, the cache folder it will be made in.
    ready: False when the data must still be made (generated on first use) or is missing.
    note: one line for the user.
  """

  task: str
  kind: str
  path: str
  ready: bool
  note: str = ""

  def line(self) -> str:
    """One line: ``<task>: <kind> <path> (<note>)``; ``<task>: not generated yet (<note>)``
    for data still to be made; the note alone when missing."""
    if self.kind == "missing":
      return self.note
    if not self.ready:
      return f"{self.task}: not generated yet (in {self.path}; {self.note})"
    return f"{self.task}: {self.kind} {self.path}" + (f" ({self.note})" if self.note else "")


def fetch_line(task: str, download: Download | None, dest: str | None = None) -> str:
  """The one line that says what to fetch for ``task``, from where, and what to run then."""
  if download is None:
    return f"{task}: no data found, and the task names no public file to prepare it from"
  dest_flag = f" --dest {dest}" if dest else ""
  return (f"{task}: no data found. Fetch {download.file} ({download.what}) from "
          f"{download.url}, put it anywhere (e.g. ~/data/{download.file}) and run: {COMMAND} "
          f"prepare --task {task} --from ~/data/{download.file}{dest_flag}")


def data_dir_line(task: str, folder: str) -> str:
  """The line telling the user which flag points training at ``folder``."""
  return f"{task}: ready in {folder}; train with --config.data.data_dir={folder}"


def read_json(path: str) -> Any:
  """The JSON in ``path``, or None when it is absent or not JSON."""
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def cached_sets(cache: str, marker: str) -> Iterator[tuple[str, Any]]:
  """``(folder, json)`` for each ``{cache}/*/{marker}`` holding JSON, in name order: the sets a
  generator left in its cache (``marker`` may hold a subfolder, ``pathfinder32/.../x.json``)."""
  for path in sorted(glob.glob(os.path.join(glob.escape(os.path.expanduser(cache)), "*",
                                            marker))):
    found = read_json(path)
    if isinstance(found, dict):
      yield path[:-len(marker) - 1], found


# ----------------------------------------------------------------------------
# Checksums and the manifest.


def file_digest(path: str, algorithm: str = "sha256") -> str:
  """The hex digest of a file's bytes (``sha256`` or ``md5``)."""
  digest = hashlib.new(algorithm)
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def write_manifest(folder: str, task: str, files: Sequence[str], source: str | None,
                   extra: dict | None = None) -> str:
  """Writes :data:`MANIFEST` in ``folder``: the size and SHA-256 of each of ``files`` (paths
  under ``folder``), and the source's path, size and MD5.

  Returns:
    The manifest's path.
  """
  entries = {}
  for path in files:
    rel = os.path.relpath(path, folder)
    entries[rel] = {"bytes": os.path.getsize(path), "sha256": file_digest(path)}
  src = None
  if source:
    src = {"path": os.path.abspath(source)}
    if os.path.isfile(source):
      src.update(bytes=os.path.getsize(source), md5=file_digest(source, "md5"))
  manifest = {"format": MANIFEST_FORMAT, "task": task, "source": src, "files": entries,
              "made": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **(extra or {})}
  path = os.path.join(folder, MANIFEST)
  with atomic_io.atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1, sort_keys=True)
    f.write("\n")
  return path


def check_manifest(folder: str) -> list[Check]:
  """Checks the files a :data:`MANIFEST` in ``folder`` lists against their recorded size and
  SHA-256.

  Returns:
    ``(status, line)`` pairs (``ok`` / ``FAIL``), none when there is no manifest.
  """
  manifest = read_json(os.path.join(folder, MANIFEST))
  if not isinstance(manifest, dict):
    return []
  out = []
  for rel, want in sorted(manifest.get("files", {}).items()):
    path = os.path.join(folder, rel)
    if not os.path.isfile(path):
      out.append(("FAIL", f"{path}: missing (listed in {MANIFEST}); run prepare again"))
    elif os.path.getsize(path) != want["bytes"]:
      out.append(("FAIL", f"{path}: {os.path.getsize(path)} bytes, {MANIFEST} says "
                          f"{want['bytes']}; run prepare again"))
    elif file_digest(path) != want["sha256"]:
      out.append(("FAIL", f"{path}: SHA-256 differs from {MANIFEST}'s; run prepare again"))
    else:
      out.append(("ok", f"{path}: {want['bytes']} bytes, SHA-256 as made"))
  return out


def check_download(download: Download, path: str) -> Check:
  """Checks a downloaded file against its published MD5."""
  d = download
  if not os.path.isfile(path):
    return "note", f"{path}: a folder, not {d.file}; its files are checked below"
  if d.md5 is None:
    return "note", f"{path}: {os.path.getsize(path)} bytes; no MD5 is published for {d.file}"
  md5 = file_digest(path, "md5")
  if md5 != d.md5:
    return "FAIL", (f"{path}: MD5 {md5}, the published {d.file} has {d.md5}; fetch it again "
                    f"from {d.url}")
  return "ok", f"{path}: MD5 {md5}, as published for {d.file}"


# ----------------------------------------------------------------------------
# Archives.


def _member_parts(name: str) -> list[str] | None:
  """The path parts of an archive member, or None when it would leave the destination."""
  name = name.replace("\\", "/")
  if name.startswith("/"):
    return None
  parts = [p for p in name.split("/") if p not in ("", ".")]
  return None if any(p == ".." for p in parts) else parts


def iter_tar(path: str) -> Iterator[tuple[list[str], Callable[[], Any]]]:
  """``(parts, open)`` for each regular file of a (compressed) tar archive, in archive
  order, streamed (the archive is read once).

  Raises:
    DataError: when ``path`` is not a tar archive (naming it).
  """
  try:
    with tarfile.open(path, mode="r|*") as tar:
      for member in tar:
        parts = _member_parts(member.name)
        if not member.isfile() or parts is None:
          continue
        yield parts, lambda m=member: tar.extractfile(m)
  except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
    raise DataError(f"{path}: not a readable tar archive ({type(e).__name__}: {e}); fetch "
                    "it again") from None


def copy_stream(src, path: str) -> None:
  """Copies the open binary file ``src`` to ``path``, atomically."""
  with atomic_io.atomic_path(path) as tmp, open(tmp, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)


def _find(parts: Sequence[str], anchor: Sequence[str]) -> int | None:
  """The index after ``anchor`` (consecutive parts) in ``parts``, or None."""
  n = len(anchor)
  for i in range(len(parts) - n + 1):
    if list(parts[i:i + n]) == list(anchor):
      return i + n
  return None


def extract_lra(archive: str, dest: str, anchor: Sequence[str],
                keep: Callable[[list[str]], bool] = lambda rest: True,
                log: Callable[[str], None] = print) -> list[str]:
  """Copies the files of LRA's release under ``anchor`` out of ``lra_release.gz``.

  A member ``.../<anchor>/<rest>`` (wherever the anchor sits in its path, so a doubly nested
  ``lra_release/lra_release/...`` works too) becomes ``{dest}/lra_release/<anchor>/<rest>``.

  Args:
    archive: ``lra_release.gz``.
    dest: the destination root.
    anchor: e.g. ``["tsv_data"]`` or ``["pathfinder32", "curv_contour_length_14"]``.
    keep: which ``rest`` parts to copy.
    log: progress lines.

  Returns:
    The paths written, in archive order.

  Raises:
    DataError: not a tar archive, or nothing under ``anchor`` in it.
  """
  log(f"reading {archive} (all of it: a few minutes for LRA's 7 GB release) for "
      f"{'/'.join(anchor)}/")
  written = []
  for parts, open_member in iter_tar(archive):
    at = _find(parts, anchor)
    if at is None or at == len(parts) or not keep(parts[at:]):
      continue
    path = os.path.join(dest, "lra_release", *anchor, *parts[at:])
    with open_member() as src:
      copy_stream(src, path)
    written.append(path)
    if len(written) % 20000 == 0:
      log(f"  {len(written)} files")
  if not written:
    raise DataError(f"{archive} holds no {'/'.join(anchor)}/ files: is it LRA's "
                    f"{LRA_RELEASE.file} ({LRA_RELEASE.url})?")
  return written


def from_lra(task: str, source: str, dest: str, anchor: Sequence[str],
             keep: Callable[[list[str]], bool], log: Callable[[str], None],
             listed: Callable[[str], bool] = lambda path: True) -> str:
  """The folder holding ``task``'s part of LRA's release: ``source`` itself when it is an
  unpacked release (used where it is), else ``{dest}/lra_release`` after
  :func:`extract_lra`, with a :data:`MANIFEST` of the extracted files that ``listed`` keeps.
  """
  if os.path.isdir(source):
    return source
  written = extract_lra(source, dest, anchor, keep, log)
  write_manifest(os.path.join(dest, "lra_release", *anchor), task,
                 [p for p in written if listed(p)], source, {"files_extracted": len(written)})
  return os.path.join(dest, "lra_release")


def point_at(made: Where, find: Callable[[Any], Where], config: Any,
             log: Callable[[str], None]) -> Where:
  """``made``, after a line saying which flag reads it when the loaders, under ``config``
  (``find``: the task's search), would read another source first, or none."""
  try:
    found = find(config)
  except FileNotFoundError:
    found = None
  if found is None or found.path != made.path:
    folder = made.path if os.path.isdir(made.path) else os.path.dirname(made.path)
    log(f"{made.task}: with this config the loaders read {found.line() if found else 'nothing'}; "
        f"train with --config.data.data_dir={folder} to read the copy made here")
  return made


# ----------------------------------------------------------------------------
# verify's checks.


def tfds_counts(version_dir: str) -> dict[str, int]:
  """Examples per split of a prepared tfds data set, from its ``dataset_info.json``."""
  info = read_json(os.path.join(version_dir, "dataset_info.json")) or {}
  out = {}
  for split in info.get("splits", []):
    lengths = split.get("shardLengths") or []
    out[split.get("name")] = sum(int(n) for n in lengths)
  return out


def count_checks(task: str, counts: dict[str, int], known: dict[str, int] | None,
                 what: str = "examples", strict: bool = True, generated: bool = False
                 ) -> list[Check]:
  """Each split's count against ``known`` (the published sizes, or the generator's for
  ``generated`` data); a mismatch fails when ``strict``, else it is a note."""
  out = []
  same, other = (("as the config asks", "the config asks for") if generated
                 else ("as published", "the published data has"))
  for split, n in counts.items():
    want = (known or {}).get(split)
    if want is None:
      out.append(("note", f"{task} {split}: {n:,} {what}"))
    elif n == want:
      out.append(("ok", f"{task} {split}: {n:,} {what}, {same}"))
    else:
      out.append(("FAIL" if strict else "note", f"{task} {split}: {n:,} {what}, {other} "
                                                f"{want:,}"))
  return out


def balance_checks(task: str, labels: dict[str, np.ndarray], per_class: dict[str, int] | None,
                   num_classes: int) -> list[Check]:
  """Each split's examples per label, against ``per_class`` where the classes are balanced
  (a mismatch fails), else as a note."""
  out = []
  for split, y in labels.items():
    hist = np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes).tolist()
    want = (per_class or {}).get(split)
    if want is None:
      out.append(("note", f"{task} {split}: examples per label {hist}"))
    elif all(h == want for h in hist):
      out.append(("ok", f"{task} {split}: {want:,} examples per label, balanced as published"))
    else:
      out.append(("FAIL", f"{task} {split}: examples per label {hist}, the published data has "
                          f"{want:,} each"))
  return out


def split_checks(task: str, labels: dict[str, np.ndarray], num_classes: int,
                 known: dict[str, int] | None = None, per_class: dict[str, int] | None = None,
                 what: str = "examples", strict: bool = True, generated: bool = False
                 ) -> list[Check]:
  """:func:`count_checks` of each split's size, then :func:`balance_checks` of its labels."""
  counts = {split: len(y) for split, y in labels.items()}
  return (count_checks(task, counts, known, what, strict, generated)
          + balance_checks(task, labels, per_class, num_classes))


def glob_dirs(root: str, pattern: str) -> list[str]:
  """The folders ``{root}/{pattern}`` (a glob, ``root`` taken literally)."""
  return [p for p in glob.glob(os.path.join(glob.escape(root), pattern)) if os.path.isdir(p)]
