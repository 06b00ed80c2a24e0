"""IMDB's ``aclImdb`` release (``aclImdb_v1.tar.gz``, Maas et al., 2011), read from the tarball
or its folder, for :func:`simpletron_jax.data.text.imdb_jsonl` (``python -m simpletron_jax.data
prepare --task text``)."""

from __future__ import annotations

import os
import re
from typing import Iterator

from simpletron_jax.data import sources

IMDB_DIR = "aclImdb"
LABEL_FOLDERS = ("neg", "pos")
"""The release's folder of each label, by id."""
DOWNLOAD = sources.Download("aclImdb_v1.tar.gz",
                            "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz",
                            # MD5 as torchtext and others check it.
                            "7c2ac02c03563afcf9b574c7e56c153a",
                            "IMDB reviews (Maas et al., 2011)")

_ACL_FILE = re.compile(r"^(\d+)_(\d+)\.txt$")


def _parse(parts: list[str]) -> tuple[str, int, int, int] | None:
  """``(split, label, id, rating)`` of a member ``.../aclImdb/{split}/{neg,pos}/{id}_{r}.txt``,
  else None."""
  if len(parts) < 4 or parts[-4] != IMDB_DIR or parts[-3] not in ("train", "test") or (
      parts[-2] not in LABEL_FOLDERS):
    return None
  m = _ACL_FILE.match(parts[-1])
  return None if m is None else (parts[-3], LABEL_FOLDERS.index(parts[-2]), int(m.group(1)),
                                 int(m.group(2)))


def reviews(source: str) -> Iterator[tuple[str, int, int, int, bytes, str]]:
  """``(split, label, id, rating, text, where)`` of every review in ``aclImdb``'s
  ``{train,test}/{neg,pos}/{id}_{rating}.txt``, from the tarball or a folder (``aclImdb`` or
  one above it); ``where`` names the file for messages.

  Raises:
    DataError: a tarball that cannot be read (naming it).
  """
  if os.path.isdir(source):
    root = source if os.path.basename(os.path.normpath(source)) == IMDB_DIR else os.path.join(
        source, IMDB_DIR)
    for split in ("train", "test"):
      for name in LABEL_FOLDERS:
        folder = os.path.join(root, split, name)
        for file in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
          key = _parse([IMDB_DIR, split, name, file])
          if key:
            with open(os.path.join(folder, file), "rb") as f:
              yield (*key, f.read(), os.path.join(folder, file))
    return
  for parts, open_member in sources.iter_tar(source):
    key = _parse(parts)
    if key:
      with open_member() as f:
        yield (*key, f.read(), f"{source}:{'/'.join(parts)}")
