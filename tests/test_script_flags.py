"""Issue 63, items 3 and 5, for the scripts beyond seeds.py, compare.py, reproduce.py, spt.py
and variant_table.py (tests/test_first_hour.py): ``scripts/explain.py``, the experiments
(``scripts/experiments/*.py``), the fixture generators (``scripts/lra_golden.py``,
``scripts/authors_golden.py``), ``scripts/pathfinder_grid.py`` and ``scripts/tpu_check.py``;
and the benchmarks (``benchmarks/*.py``), whose flags follow the same style.

Each command is run as a user runs it (a subprocess in the repository root) and stops at its
flags, before any data or compilation: a bad invocation is one line, ``<prog>: <cause>``, with
exit status 1; a dashed flag of the earlier release is still accepted, with a deprecation
note; ``--help`` is plain text with every long option spelled with underscores.
"""

import ast
import glob
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def _run(*args, timeout=300):
  """Runs ``python <args>`` in the repository root; returns the finished process."""
  return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=timeout, env=dict(os.environ))


def _stderr_lines(proc) -> list[str]:
  return proc.stderr.strip().splitlines()


@pytest.mark.parametrize("argv,first", [
    (("scripts/explain.py",), "explain.py: the following arguments are required: --workdir "
     "(see --help)"),
    (("scripts/explain.py", "--workdir", "RUN", "--index", "a"), "explain.py: argument --index: "
     "invalid int value: 'a' (see --help)"),
    (("scripts/explain.py", "--workdir", "RUN", "--split", "dev"), "explain.py: argument "
     "--split: invalid choice: 'dev'"),
    (("scripts/lra_golden.py",), "lra_golden.py: the following arguments are required: "
     "--lra_src (see --help)"),
    (("scripts/authors_golden.py", "--out", "x"), "authors_golden.py: the following arguments "
     "are required: --authors_src (see --help)"),
    (("scripts/pathfinder_grid.py", "--rows", "x"), "pathfinder_grid.py: argument --rows: "
     "invalid int value: 'x' (see --help)"),
    (("scripts/tpu_check.py", "--config", "configs/listops/simple.py:tiny", "--slcie", "v4-8"),
     "tpu_check.py: Unknown command line flag 'slcie'. Did you mean: slice ?"),
    (("benchmarks/speed_memory.py", "--rounds", "x"), "speed_memory.py: argument --rounds: "
     "invalid int value: 'x' (see --help)"),
    (("benchmarks/group_padding.py",), "group_padding.py: the following arguments are "
     "required: --data_dir (see --help)"),
])
def test_a_bad_invocation_is_one_line_and_status_1(argv, first):
  proc = _run(*argv)
  assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
  assert _stderr_lines(proc) and _stderr_lines(proc)[0].startswith(first), proc.stderr[-2000:]
  assert len(_stderr_lines(proc)) == 1, "no usage block, no traceback"
  assert proc.stdout == "", proc.stdout


def test_experiment_dashed_flag_is_a_deprecated_alias(tmp_path):
  # --finished-only with no finished run: the script stops at once with its own one line,
  # which shows that the dashed spelling set --finished_only.
  runs = tmp_path / "runs"
  proc = _run("scripts/experiments/depth.py", "--quick", "--attentions", "simple",
              "--depths", "1", "--seeds", "0", "--runs", str(runs), "--finished-only")
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = _stderr_lines(proc)
  assert lines[0].startswith("depth.py: --finished-only is deprecated: write --finished_only"), (
      proc.stderr[-2000:])
  assert lines[1] == f"depth.py: no finished run under {runs} (--finished_only)", lines
  assert len(lines) == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert not runs.exists(), "nothing was trained"


def test_experiment_common_dashed_flags_parse_as_the_underscored_ones(capsys):
  sys.path.insert(0, os.path.join(ROOT, "scripts", "experiments"))
  try:
    import exp_common  # pylint: disable=import-outside-toplevel
  finally:
    sys.path.remove(os.path.join(ROOT, "scripts", "experiments"))
  parser = exp_common.make_parser("depth", "A test parser.")
  parser.add_argument("--lora_rank", type=int, default=32)
  dashed = parser.parse_args(["--eval-every", "5", "--copy-to=/tmp/c", "--lora-rank", "4",
                              "--config.seed=1"])
  notes = capsys.readouterr().err.splitlines()
  underscored = parser.parse_args(["--eval_every", "5", "--copy_to=/tmp/c", "--lora_rank", "4",
                                   "--config.seed=1"])
  assert vars(dashed) == vars(underscored)
  assert (underscored.eval_every, underscored.copy_to, underscored.lora_rank) == (5, "/tmp/c", 4)
  assert capsys.readouterr().err == "", "the underscored spelling draws no note"
  assert len(notes) == 3 and all("is deprecated: write --" in n for n in notes), notes


@pytest.mark.parametrize("program", ["scripts/explain.py", "scripts/experiments/depth.py",
                                     "scripts/experiments/attention_swap.py",
                                     "scripts/lra_golden.py", "scripts/authors_golden.py",
                                     "scripts/pathfinder_grid.py", "scripts/tpu_check.py",
                                     "benchmarks/speed_memory.py",
                                     "benchmarks/group_padding.py"])
def test_help_is_plain_text_with_underscored_flags(program):
  proc = _run(program, "--help")
  # absl's --help (tpu_check.py) exits with status 1 after printing; argparse's with 0.
  assert proc.returncode == (1 if program.endswith("tpu_check.py") else 0), proc.stderr
  assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
  assert "``" not in proc.stdout and ":func:`" not in proc.stdout, proc.stdout
  names = re.findall(r"^\s+(?:-\w, )?--(?:\[no\])?([\w-]+)", proc.stdout, re.M)
  assert "help" in names or "config" in names, proc.stdout
  assert not [n for n in names if "-" in n], "flags are spelled with underscores"


def test_benchmark_dashed_flag_is_a_deprecated_alias():
  # A bad value stops the parse at once: the error names the underscored flag.
  proc = _run("benchmarks/group_padding.py", "--data-dir", "DIR", "--max-length", "x")
  assert proc.returncode == 1, proc.stderr[-2000:]
  lines = _stderr_lines(proc)
  assert [line.split(" (")[0] for line in lines] == [
      "group_padding.py: --data-dir is deprecated: write --data_dir",
      "group_padding.py: --max-length is deprecated: write --max_length",
      "group_padding.py: argument --max_length: invalid int value: 'x'"], lines


def test_every_benchmark_parser_is_the_scripts_one_with_underscored_flags():
  """Each ``benchmarks/*.py`` that takes flags builds ``cli.ArgumentParser`` (so a dashed
  spelling is still accepted, with a note) and defines every long option with underscores."""
  found = {}
  for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py"))):
    with open(path, encoding="utf-8") as f:
      calls = [n for n in ast.walk(ast.parse(f.read())) if isinstance(n, ast.Call)]
    options = [a.value for c in calls if getattr(c.func, "attr", "") == "add_argument"
               for a in c.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
    if options:
      parsers = [ast.unparse(c.func) for c in calls
                 if getattr(c.func, "attr", "") == "ArgumentParser"]
      found[os.path.basename(path)] = (parsers, [o for o in options if "-" in o[2:]])
  assert len(found) >= 13, sorted(found)
  assert {name: p for name, (p, _) in found.items() if p != ["cli.ArgumentParser"]} == {}
  assert {name: dashed for name, (_, dashed) in found.items() if dashed} == {}
