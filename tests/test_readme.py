"""The README is a front page whose figures come from committed files (issue 28).

No JAX work: these tests read ``README.md``, ``docs/*.md``, ``.ci/run`` and the files the README
cites, and check that

* ``README.md`` has at most ``MAX_README_LINES`` lines;
* its test command is the one ``.ci/run`` runs (CI reads it);
* every relative link in ``README.md`` and ``docs/*.md`` names an existing file, and a link
  into a markdown file with a ``#fragment`` names one of its headings (GitHub's anchors);
* every figure of a README table or paragraph that a ``Source:`` line follows appears in the
  files that line names, and every README table with figures has such a line.

The convention (also in ``docs/testing.md``): a table or paragraph is followed, after one blank
line, by a paragraph that starts with ``Source:`` and names committed files or folders in
backticks, relative to the repository root. The figures of a paragraph are its numbers outside
backticks and link targets; the figures of a table row are the numbers of its cells that start
with a digit (after ``**``), so names, commands and patterns are left alone. All the figures of
one paragraph, or of one table row, must be found in one unit of the sources: a named file, or
the text files directly inside a named folder or one of its subfolders (a run's folder holds
its ``results.json``, ``metrics.jsonl`` and ``config.json``). A figure is found when a value
in the unit, as written, times 100 (a fraction shown as a percentage) or divided by 60
(seconds shown as minutes) rounds to the figure at the figure's own precision; ``M min S s``
is read as seconds.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CI_RUN = ROOT / ".ci" / "run"
MAX_README_LINES = 150
SOURCE_PREFIX = "Source:"
TEXT_SUFFIXES = (".md", ".json", ".jsonl", ".txt", ".csv", ".tsv")
MAIN_JOB_SOURCE = "results/listops_simple_tiny_seeds"

# A figure: digits (with thousands commas) and an optional fraction, optionally followed by
# "x" (a ratio); not part of a word ("H100", "4K", "CIFAR-10", "float32").
_FIGURE = re.compile(r"(?<![\w.\-])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?x?(?![\w])")
_MIN_SEC = re.compile(r"(?<![\w.])(\d+) min (\d+) s\b")
_SOURCE_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


@dataclasses.dataclass
class Block:
  """A run of non-blank markdown lines: a paragraph, a table or a fenced code block.

  Attributes:
    kind: ``"table"`` (every line starts with ``|``), ``"code"`` (a fenced block) or
      ``"para"`` (anything else, headings and lists included).
    lines: the block's lines, without their newlines.
    lineno: the 1-based line number of its first line in the file.
  """

  kind: str
  lines: list[str]
  lineno: int


def _blocks(text: str) -> list[Block]:
  """Splits markdown text into blocks at blank lines; a fenced code block is one block.

  Args:
    text: the markdown source.

  Returns:
    The blocks in file order.
  """
  blocks: list[Block] = []
  current: list[str] = []
  start = 0
  in_code = False

  def flush(kind: str) -> None:
    nonlocal current
    if current:
      if kind != "code" and all(line.lstrip().startswith("|") for line in current):
        kind = "table"
      blocks.append(Block(kind, current, start))
    current = []

  for number, line in enumerate(text.split("\n"), start=1):
    if line.lstrip().startswith("```"):
      if in_code:
        current.append(line)
        flush("code")
        in_code = False
      else:
        flush("para")
        in_code, start, current = True, number, [line]
      continue
    if in_code:
      current.append(line)
    elif line.strip():
      if not current:
        start = number
      current.append(line)
    else:
      flush("para")
  flush("code" if in_code else "para")
  return blocks


@dataclasses.dataclass(frozen=True)
class Figure:
  """A number as the README shows it.

  Attributes:
    value: the number (thousands commas removed; ``M min S s`` as seconds).
    decimals: digits after the point, the precision it was rounded to.
    text: the number as written, for messages.
  """

  value: Decimal
  decimals: int
  text: str


def _strip_code(text: str) -> str:
  """Removes inline code spans and link targets, which hold commands and paths, not figures."""
  return re.sub(r"\]\([^)]*\)", "]", _CODE_SPAN.sub(" ", text))


def _figures(text: str) -> list[Figure]:
  """The figures in ``text`` (code spans and link targets removed first).

  Args:
    text: a paragraph or a table cell.

  Returns:
    Every figure, ``M min S s`` as one figure in seconds.
  """
  text = _strip_code(text).replace("**", "")
  figures = []
  for match in _MIN_SEC.finditer(text):
    seconds = int(match.group(1)) * 60 + int(match.group(2))
    figures.append(Figure(Decimal(seconds), 0, match.group(0)))
  text = _MIN_SEC.sub(" ", text)
  for match in _FIGURE.finditer(text):
    digits = match.group(1).replace(",", "") + (match.group(2) or "")
    decimals = len(match.group(2)) - 1 if match.group(2) else 0
    figures.append(Figure(Decimal(digits), decimals, match.group(0)))
  return figures


def _cells(row: str) -> list[str]:
  """The cells of a markdown table row (escaped ``\\|`` does not split)."""
  parts = re.split(r"(?<!\\)\|", row.strip())
  return [part.strip() for part in parts[1:-1]]


def _row_figures(row: str) -> list[Figure]:
  """The figures of a table row's cells that start with a digit (after ``**``)."""
  figures = []
  for cell in _cells(row):
    if re.match(r"\d", cell.replace("**", "")):
      figures.extend(_figures(cell))
  return figures


def _figure_groups(block: Block) -> list[tuple[int, list[Figure]]]:
  """(line number, figures) for each body row of a table, or for a whole paragraph.

  Each group must be found in one unit of the block's sources (a table's header and rule are
  skipped; a row or paragraph without figures gives no group).
  """
  if block.kind == "table":
    groups = [(block.lineno + i, _row_figures(row)) for i, row in enumerate(block.lines)
              if i >= 2]
  else:
    groups = [(block.lineno, _figures(" ".join(block.lines)))]
  return [(lineno, figures) for lineno, figures in groups if figures]


class SourceValues:
  """Every number in some text files, as written, x100 and /60, for range look-ups.

  Args:
    files: the files to read (``.md``, ``.json``, ``.jsonl``, ``.txt``, ...).
  """

  def __init__(self, files: list[Path]):
    values: set[Decimal] = set()
    for file in files:
      for token in _SOURCE_NUMBER.findall(file.read_text(errors="replace")):
        try:
          values.add(Decimal(token.replace(",", "")))
        except ArithmeticError:
          continue
    scaled = set()
    for value in values:
      try:   # a hex digest can read as a huge float ("3e912345"), past Decimal's exponents
        scaled.update((value, value * 100, value / 60))
      except ArithmeticError:
        continue
    self._sorted = sorted(scaled)

  def has(self, figure: Figure) -> bool:
    """Whether some value, as written, x100 or /60, rounds to ``figure`` at its precision."""
    half = Decimal(5) * Decimal(10) ** (-figure.decimals - 1)
    low = figure.value - half - Decimal("1e-9")
    high = figure.value + half + Decimal("1e-9")
    i = bisect.bisect_left(self._sorted, low)
    return i < len(self._sorted) and self._sorted[i] <= high


def _name(path: Path) -> str:
  """``path`` relative to the repository root, for messages (as is when outside it)."""
  return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _units(paths: list[Path]) -> dict[str, SourceValues]:
  """The units a Source line names: each file, and each folder's own text files.

  Args:
    paths: files or folders. A folder gives one unit per folder under it (itself included)
      that directly holds a text file.

  Returns:
    Unit name (relative to the repository root) -> its values.

  Raises:
    AssertionError: a path does not exist, or a folder holds no text file.
  """
  units = {}
  for path in paths:
    name = _name(path)
    assert path.exists(), f"Source names {name}, which does not exist"
    if path.is_file():
      units[name] = SourceValues([path])
      continue
    for folder in sorted({path, *(p for p in path.rglob("*") if p.is_dir())}):
      files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in TEXT_SUFFIXES)
      if files:
        units[_name(folder) + "/"] = SourceValues(files)
    assert units, f"no text file under {name}"
  return units


def _missing(figures: list[Figure], units: dict[str, SourceValues]) -> tuple[str, list[Figure]]:
  """The unit that holds the most of ``figures``, and the figures it lacks ([] if none)."""
  best = min(units.items(), key=lambda item: sum(not item[1].has(f) for f in figures))
  return best[0], [f for f in figures if not best[1].has(f)]


def _source_paths(block: Block) -> list[Path]:
  """The paths a ``Source:`` paragraph names in backticks, relative to the repository root."""
  names = [span.strip("`") for span in _CODE_SPAN.findall(" ".join(block.lines))]
  assert names, f"README.md:{block.lineno}: a Source line names no file in backticks"
  return [ROOT / name for name in names]


def _sourced_blocks(blocks: list[Block]) -> list[tuple[Block, Block]]:
  """Pairs (covered block, Source block): each Source paragraph covers the block before it."""
  pairs = []
  for i, block in enumerate(blocks):
    if block.kind == "para" and block.lines[0].startswith(SOURCE_PREFIX):
      assert i > 0 and blocks[i - 1].kind in ("table", "para"), (
          f"README.md:{block.lineno}: a Source line must follow a table or a paragraph")
      pairs.append((blocks[i - 1], block))
  return pairs


def test_readme_is_at_most_150_lines():
  lines = README.read_text().split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  assert len(lines) <= MAX_README_LINES, (
      f"README.md has {len(lines)} lines; move text to docs/ (at most {MAX_README_LINES})")


def test_readme_test_command_is_the_one_ci_runs():
  ci_commands = [line.strip() for line in CI_RUN.read_text().splitlines()
                 if line.strip().startswith("python -m pytest")]
  assert ci_commands, f"{CI_RUN} runs no pytest command"
  readme_commands = []
  for block in _blocks(README.read_text()):
    if block.kind == "code":
      for line in block.lines:
        if "python -m pytest" in line:
          readme_commands.append(line[line.index("python -m pytest"):].strip())
  assert readme_commands == ci_commands


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = heading.strip().lstrip("#").strip().lower()
  text = re.sub(r"[^\w\- ]", "", text)
  return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
  """The anchors of a markdown file's headings (code blocks skipped; repeats get -1, -2...)."""
  anchors: set[str] = set()
  counts: dict[str, int] = {}
  for block in _blocks(path.read_text()):
    if block.kind == "code":
      continue
    for line in block.lines:
      if re.match(r"#{1,6} ", line):
        slug = _slug(line)
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
  return anchors


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
  broken = []
  for block in _blocks(page.read_text()):
    if block.kind == "code":
      continue
    for line in block.lines:
      for target in _LINK.findall(_CODE_SPAN.sub(" ", line)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
          continue
        path_part, _, fragment = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
          broken.append(f"{target} (no such file)")
        elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
          broken.append(f"{target} (no heading #{fragment})")
  assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_readme_figure_is_in_the_file_it_cites():
  blocks = _blocks(README.read_text())
  pairs = _sourced_blocks(blocks)
  assert pairs, "README.md has no Source line"
  missing = []
  for covered, source in pairs:
    units = _units(_source_paths(source))
    groups = _figure_groups(covered)
    assert groups, f"README.md:{covered.lineno}: a Source line follows a block with no figure"
    for lineno, figures in groups:
      unit, absent = _missing(figures, units)
      if absent:
        missing.append(f"README.md:{lineno}: {[f.text for f in absent]} not in {unit} "
                       f"(the cited unit with the most of this line's figures)")
  assert not missing, "\n".join(missing)


def test_every_readme_table_with_figures_cites_its_source():
  blocks = _blocks(README.read_text())
  covered = {id(block) for block, _ in _sourced_blocks(blocks)}
  unsourced = [f"README.md:{block.lineno}" for block in blocks
               if block.kind == "table" and _figure_groups(block) and id(block) not in covered]
  assert not unsourced, f"tables with figures but no Source line after them: {unsourced}"


def test_the_main_job_figures_cite_its_committed_run():
  blocks = _blocks(README.read_text())
  main_job = [block for block in blocks if block.kind == "code"
              and any("python train.py --config configs/listops/simple.py:tiny" in line
                      for line in block.lines)]
  assert main_job, "README.md lost the main job's command"
  cited = [covered for covered, source in _sourced_blocks(blocks)
           if covered.kind == "para" and covered.lineno > main_job[0].lineno
           and any(MAIN_JOB_SOURCE in str(p.relative_to(ROOT)) for p in _source_paths(source))]
  assert cited, f"no paragraph after the main job cites {MAIN_JOB_SOURCE}"


def test_figure_check_rejects_a_figure_absent_from_the_source(tmp_path):
  source = tmp_path / "results.json"
  source.write_text('{"test_accuracy": 0.377, "steps_per_sec": 3.3223, "train_seconds": 1504.97}')
  values = SourceValues([source])
  found = {text: values.has(_figures(text)[0]) for text in
           ("37.7%", "3.32", "25.1 min", "1,505", "37.8%", "3.3", "4.4x", "25 min 5 s", "26 min")}
  assert found == {"37.7%": True, "3.32": True, "25.1 min": True, "1,505": True,
                   "37.8%": False, "3.3": True, "4.4x": False, "25 min 5 s": True,
                   "26 min": False}


def test_figures_skip_names_code_and_units():
  figures = _figures(
      "H100 at 4K, CIFAR-10, `--steps 300`, [a](b2.md), **37.7%** and 1,024 tokens, 4.4x")
  assert [f.text for f in figures] == ["37.7", "1,024", "4.4x"]
  assert [(f.value, f.decimals) for f in figures] == [
      (Decimal("37.7"), 1), (Decimal("1024"), 0), (Decimal("4.4"), 1)]


def test_a_row_must_be_found_in_one_unit(tmp_path):
  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  (tmp_path / "a" / "results.json").write_text('{"test_accuracy": 0.377, "steps_per_sec": 3.32}')
  (tmp_path / "b" / "results.json").write_text('{"test_accuracy": 0.168, "steps_per_sec": 0.41}')
  units = _units([tmp_path])
  assert sorted(units) == [f"{tmp_path}/a/", f"{tmp_path}/b/"]
  assert _missing(_row_figures("| a | 37.7% | 3.32 |"), units) == (f"{tmp_path}/a/", [])
  unit, absent = _missing(_row_figures("| a | 37.7% | 0.41 |"), units)
  assert [f.text for f in absent] == ["0.41"] and unit == f"{tmp_path}/a/"
