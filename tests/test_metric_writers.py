"""The metric writers, W&B, the parameter overview and --profile_steps (issues 29, 43, 47).

* A killed-and-resumed sequence of writes leaves TensorBoard one value per step, the resumed
  run's (the restart marker each start writes), and the flattened config as hparams. The
  event file holds TensorBoard's own records (its plugins' summaries, its record framing),
  and the writers subclass clu's ``MetricWriter``.
* W&B in offline mode: the values logged are in the run's ``.wandb`` log under
  ``workdir/wandb``, read back with W&B's record protos; a resumed logger continues the same
  run id. W&B's own ``WANDB_MODE`` decides when ``config.wandb.mode`` is "" (the default). A
  bad ``config.wandb.mode`` and a missing wandb package are one-line errors.
* A tiny run with ``profile_steps=(2, 3)`` leaves a profiler trace in ``workdir/profile`` and
  ``parameter_overview.txt`` whose total is the ``params`` info record.
"""

import glob
import importlib.util
import os
import re
import struct
import subprocess
import sys
import time

import flax
import ml_collections
import numpy as np
import pytest
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

from simpletron_jax.runtime import errors
from simpletron_jax.train import run_config, trainer
from simpletron_jax.run import metric_logging, profiling, tensorboard_writer
from simpletron_jax.run.metric_logging import MetricLogger, read_records
from tests.conftest import ROOT
from tests.test_faults import _params, fault_config


def _next_second():
  """Sleeps into the next wall-clock second: TensorBoard orders a folder's event files by
  name, whose first field is the second the file was created in (the name ends in a
  per-process counter, which sorts 10 before 9)."""
  time.sleep(1.0 - time.time() % 1.0 + 0.01)


def _tensorboard(tb_dir):
  """TensorBoard's reader of a run folder (the one ``tensorboard --load_fast=false`` uses;
  the older ``event_accumulator`` never purges tensor summaries, which is what the event
  writer writes, as tf.summary does, so it cannot show a restart)."""
  from tensorboard.backend.event_processing import \
      plugin_event_accumulator as pea  # pylint: disable=import-outside-toplevel
  accumulator = pea.EventAccumulator(str(tb_dir), size_guidance={pea.TENSORS: 0})
  accumulator.Reload()
  return accumulator


def _values(accumulator, tag):
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
          for e in accumulator.Tensors(tag)]


def _settings(config):
  """MetricLogger's ``hparams`` and ``wandb`` of ``config``, as train_and_evaluate gives them."""
  return {"hparams": metric_logging.flat_config(config),
          "wandb": run_config.RunConfig.from_config_dict(config).logging.wandb}


def test_resumed_run_shows_one_value_per_step_in_tensorboard(tmp_path):
  config = fault_config()
  killed = MetricLogger(str(tmp_path), **_settings(config))
  killed.write(0, {"params": 100}, "info")
  for step in (1, 2, 3, 4):
    killed.write(step, {"loss": 1.0 / step}, "train")
  killed.write(3, {"accuracy": 0.5}, "val")   # after the checkpoint at 2: to be hidden
  # Killed after step 4 (every record is on disk already); resumed from the checkpoint at 2.
  _next_second()
  resumed = MetricLogger(str(tmp_path), resume_step=2, **_settings(config))
  resumed.write(2, {"params": 100}, "info")
  for step in (3, 4, 5):
    resumed.write(step, {"loss": 10.0 * step}, "train")
  resumed.write(5, {"accuracy": 0.75}, "val")
  resumed.close()
  killed.close()

  assert resumed.tb_path != killed.tb_path
  assert sorted(os.listdir(tmp_path / "tb")) == [os.path.basename(killed.tb_path),
                                                 os.path.basename(resumed.tb_path)]
  board = _tensorboard(tmp_path / "tb")
  assert _values(board, "train/loss") == [(1, 1.0), (2, 0.5), (3, 30.0), (4, 40.0),
                                          (5, 50.0)]
  assert _values(board, "val/accuracy") == [(5, 0.75)]
  assert _values(board, "info/params") == [(0, 100.0), (2, 100.0)]
  # metrics.jsonl says the same.
  records = read_records(os.path.join(tmp_path, "metrics.jsonl"))
  assert [(r["step"], r["loss"]) for r in records if r["split"] == "train"] == [
      (1, 1.0), (2, 0.5), (3, 30.0), (4, 40.0), (5, 50.0)]
  # The flattened config is in TensorBoard's hparams plugin.
  from tensorboard.plugins.hparams import \
      plugin_data_pb2  # pylint: disable=import-outside-toplevel
  content = board.PluginTagToContent("hparams")["_hparams_/session_start_info"]
  hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
  assert hparams["model.num_layers"].number_value == config.model.num_layers == 1
  assert hparams["model.attention"].string_value == "simple"


def test_a_disabled_logger_writes_nothing_and_imports_no_tensorflow(tmp_path):
  code = ("import sys; from simpletron_jax.run.metric_logging import MetricLogger, read_records; "
          f"MetricLogger({str(tmp_path)!r}, enabled=False).write(1, {{'loss': 1.0}}, 'train'); "
          "print('tensorflow' in sys.modules, 'wandb' in sys.modules)")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=120, check=True)
  assert proc.stdout.split() == ["False", "False"]
  assert not os.listdir(tmp_path)


def test_scalars_and_texts_are_tensorboards_own_records(tmp_path):
  """Scalars and texts read back through TensorBoard's loader (record CRCs checked) with the
  plugins' metadata, and the file is whole records only, framed as TensorBoard frames them."""
  from tensorboard.backend.event_processing import \
      event_file_loader  # pylint: disable=import-outside-toplevel
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  writer = tensorboard_writer.TensorBoardWriter(str(tmp_path))
  writer.write_scalars(3, {"train/loss": 0.1, "train/accuracy": 1})
  writer.write_texts(4, {"note": "resumed at 2"})
  writer.close()
  events = list(event_file_loader.EventFileLoader(writer.path).Load())
  assert events[0].file_version == "brain.Event:2"
  values = [(e.step, v.tag, v.metadata.plugin_data.plugin_name, tensor_util.make_ndarray(v.tensor))
            for e in events[1:] for v in e.summary.value]
  assert [v[:3] for v in values] == [(3, "train/loss", "scalars"),
                                     (3, "train/accuracy", "scalars"), (4, "note", "text")]
  assert values[0][3].dtype == "float32" and values[0][3] == np.float32(0.1)
  assert values[1][3] == 1.0 and values[2][3] == b"resumed at 2"
  with open(writer.path, "rb") as f:
    data = f.read()
  lengths = []
  while data:   # length (uint64), its masked CRC, the event, its masked CRC
    (length,) = struct.unpack("<Q", data[:8])
    assert struct.unpack("<I", data[8:12])[0] == masked_crc32c(data[:8])
    assert struct.unpack("<I", data[12 + length:16 + length])[0] == masked_crc32c(
        data[12:12 + length])
    lengths.append(length)
    data = data[16 + length:]
  assert len(lengths) == len(events) == 3


def test_the_writers_are_clus_metric_writers():
  """The interface is loaded without TensorFlow; a later ``import clu.metric_writers`` (here
  TensorFlow is installed) sees the same class, so clu's helpers accept the writers."""
  code = ("import sys; from simpletron_jax.run import tensorboard_writer as t; "
          "assert 'clu.metric_writers' not in sys.modules and 'tensorflow' not in sys.modules; "
          "from clu import metric_writers; "
          "print(metric_writers.MetricWriter is t.MetricWriter, "
          "issubclass(t.TensorBoardWriter, metric_writers.MetricWriter))")
  if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("clu.metric_writers needs TensorFlow (pip install -e '.[test]')")
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["True", "True"]


# ----------------------------------------------------------------------------
# Weights & Biases.


def _wandb_records(path):
  """The records of a ``.wandb`` log: W&B's 7-byte header, then LevelDB-log chunks (32 KiB
  blocks; a chunk is crc32c(4) length(2) type(1) and data; type 1 is a whole record, 2..4
  its first, middle and last pieces), each record a ``wandb_internal_pb2.Record``. W&B's
  service writes the file while this reads it, so a chunk cut short at the end is not yet a
  record and is left for the next read."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", path
  records, pending, pos, block = [], b"", 7, 32768
  while pos + 7 <= len(data):
    if block - pos % block < 7:   # a block's tail too short for a header is padding
      pos += block - pos % block
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0:   # zero padding
      pos += block - pos % block
      continue
    if pos + 7 + length > len(data):   # the service has not finished writing this chunk
      break
    pending += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):
      records.append(wandb_internal_pb2.Record.FromString(pending))
      pending = b""
  return records


def _finished_wandb_records(path, timeout=60.0):
  """:func:`_wandb_records` once W&B's service has written the run's exit record."""
  deadline = time.time() + timeout
  while True:
    records = _wandb_records(path) if os.path.exists(path) else []
    if any(r.HasField("exit") for r in records) or time.time() > deadline:
      return records
    time.sleep(0.2)


def _history(records):
  """``[{key: value}]`` of the logged rows, W&B's own ``_``-keys left out."""
  import json  # pylint: disable=import-outside-toplevel
  rows = []
  for record in records:
    if record.HasField("history"):
      row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json)
             for item in record.history.item}
      rows.append({k: v for k, v in row.items() if not k.startswith("_")})
  return rows


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
  """W&B without network: offline mode, quiet, its config and cache in ``tmp_path``."""
  if importlib.util.find_spec("wandb") is None:
    pytest.skip("wandb is not installed (pip install -e '.[test]')")
  for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"),
                      ("WANDB_CONFIG_DIR", tmp_path / "wandb_config"),
                      ("WANDB_CACHE_DIR", tmp_path / "wandb_cache"),
                      ("WANDB_DATA_DIR", tmp_path / "wandb_data"),
                      ("WANDB_ERROR_REPORTING", "false")):
    monkeypatch.setenv(name, str(value))
  config = fault_config()
  config.wandb.project, config.wandb.mode = "simpletron-test", "offline"
  return config


def test_wandb_offline_run_holds_the_values_and_a_resumed_start_continues_it(
    wandb_offline, tmp_path):
  workdir, run_id = str(tmp_path / "run"), "0123456789abcdef0123456789abcdef"
  os.makedirs(workdir)
  first = MetricLogger(workdir, **_settings(wandb_offline), run_id=run_id)
  for step in (1, 2, 3):
    first.write(step, {"loss": 1.0 / step, "accuracy": 0.25 * step}, "train")
  first.write(2, {"accuracy": 0.5}, "test")   # a lower step than the last row: kept
  first_dir = first._writers[-1].run_dir  # pylint: disable=protected-access
  first.close()
  resumed = MetricLogger(workdir, resume_step=2, **_settings(wandb_offline), run_id=run_id)
  resumed.write(3, {"loss": 0.125}, "train")
  resumed_dir = resumed._writers[-1].run_dir  # pylint: disable=protected-access
  resumed.close()

  assert first_dir != resumed_dir
  for folder in (first_dir, resumed_dir):
    assert folder.startswith(os.path.join(workdir, "wandb", "offline-run-"))
  first_records = _finished_wandb_records(os.path.join(first_dir, f"run-{run_id}.wandb"))
  resumed_records = _finished_wandb_records(os.path.join(resumed_dir, f"run-{run_id}.wandb"))
  for records in (first_records, resumed_records):   # the same W&B run: a resume continues it
    (run,) = [r.run for r in records if r.HasField("run")]
    assert run.run_id == run_id and run.project == "simpletron-test"
  assert _history(first_records) == [
      {"step": 1, "train/loss": 1.0, "train/accuracy": 0.25},
      {"step": 2, "train/loss": 0.5, "train/accuracy": 0.5},
      {"step": 3, "train/loss": pytest.approx(1 / 3), "train/accuracy": 0.75},
      {"step": 2, "test/accuracy": 0.5}]
  assert _history(resumed_records) == [{"step": 3, "train/loss": 0.125}]
  # The flattened config is the run's config.
  import json  # pylint: disable=import-outside-toplevel
  config = {u.key: json.loads(u.value_json)
            for r in first_records if r.HasField("config") for u in r.config.update}
  config.update({u.key: json.loads(u.value_json) for u in run.config.update})
  assert config["model.num_layers"] == 1 and config["wandb.project"] == "simpletron-test"


def test_wandb_mode_left_empty_follows_wandbs_own_variable(wandb_offline, tmp_path,
                                                           monkeypatch):
  """Issue 47: ``config.wandb.mode`` defaults to "", and then ``WANDB_MODE=offline`` (set by
  the fixture) makes an offline run; a mode set in the config wins over the variable (here
  ``WANDB_MODE=online`` would need the network)."""
  from configs.listops import simple  # pylint: disable=import-outside-toplevel
  default = simple.get_config("tiny")
  assert default.wandb.mode == ""
  default.wandb.project = "simpletron-test"
  assert _settings(default)["wandb"].mode == ""
  run_dirs = []
  for name, config in (("from_variable", default), ("from_config", wandb_offline)):
    if name == "from_config":
      monkeypatch.setenv("WANDB_MODE", "online")
    workdir = str(tmp_path / name)
    os.makedirs(workdir)
    logger = MetricLogger(workdir, **_settings(config), run_id=f"{name:0>32}")
    logger.write(1, {"loss": 0.5}, "train")
    run_dirs.append(logger._writers[-1].run_dir)  # pylint: disable=protected-access
    logger.close()
    assert os.path.basename(run_dirs[-1]).startswith("offline-run-"), run_dirs[-1]
    records = _finished_wandb_records(os.path.join(run_dirs[-1], f"run-{name:0>32}.wandb"))
    assert _history(records) == [{"step": 1, "train/loss": 0.5}]


def test_wandb_settings_errors_name_the_field_and_the_fix(wandb_offline, tmp_path,
                                                         monkeypatch):
  config = wandb_offline
  config.wandb.mode = "Offline"
  with pytest.raises(ValueError,
                     match=r"^config\.wandb\.mode='Offline' is not one of '', online, offline"):
    MetricLogger(str(tmp_path), **_settings(config))
  assert not os.listdir(tmp_path), "checked before any file is written"
  config.wandb.mode = "offline"
  real_find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real_find_spec(name, *a))
  with pytest.raises(errors.RunError, match=re.escape('pip install -e ".[wandb]"')):
    MetricLogger(str(tmp_path), **_settings(config))
  config.wandb.project = ""   # off: wandb is not needed
  assert not _settings(config)["wandb"].enabled()


def test_train_pys_early_wandb_check_reads_the_section_as_the_run_does():
  """train.py checks ``config.wandb`` before JAX starts: the same settings as the run's
  (None as "", a field of another reader left alone, no section: the defaults)."""
  config = fault_config()
  with config.unlocked():
    config.wandb = ml_collections.ConfigDict({"project": None, "entity": "me", "mode": "",
                                              "tags": ("a",)})
  early = metric_logging.WandbConfig.from_config(config)
  assert early == run_config.RunConfig.from_config_dict(config).logging.wandb
  assert early == metric_logging.WandbConfig(project="", entity="me", mode="")
  assert not early.enabled()
  assert metric_logging.WandbConfig.from_config(
      ml_collections.ConfigDict({})) == metric_logging.WandbConfig()


# ----------------------------------------------------------------------------
# --profile_steps and the parameter overview.


@pytest.mark.parametrize("text", ["3", "a:b", "0:2", "3:2", "2:11", "1:2:3"])
def test_bad_profile_steps_are_refused_naming_the_flag(text):
  with pytest.raises(ValueError, match=r"^--profile_steps="):
    profiling.parse_profile_steps(text, num_train_steps=10)


def test_profile_steps_parse():
  assert profiling.parse_profile_steps("2:3", 10) == (2, 3)
  assert profiling.parse_profile_steps("10:10", 10) == (10, 10)
  assert profiling.parse_profile_steps("", 10) is None
  assert profiling.parse_profile_steps(None, 10) is None


def test_train_py_refuses_a_bad_profile_steps_before_starting(tmp_path):
  proc = subprocess.run(
      [sys.executable, "train.py", "--config", "configs/listops/simple.py:tiny",
       "--workdir", str(tmp_path / "run"), "--profile_steps=5:2"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 1, proc.stderr
  assert proc.stderr.strip().splitlines()[-1].startswith(
      "train.py: --profile_steps=5:2: need 1 <= A <= B <= num_train_steps="), proc.stderr
  assert not os.path.exists(tmp_path / "run")


def test_a_run_resumed_past_the_first_profiled_step_traces_nothing(tmp_path):
  profiler = profiling.StepProfiler(str(tmp_path / "profile"), (2, 3), start_step=2)
  for step in (3, 4):
    profiler.step_started(step)
    profiler.step_finished(step, None)
  profiler.close()
  assert profiler.steps is None and not os.path.exists(tmp_path / "profile")


@pytest.mark.slow
def test_tiny_run_writes_a_profile_of_the_chosen_steps_and_the_parameter_overview(
    presence_task, tmp_path):
  workdir = str(tmp_path / "run")
  trainer.train_and_evaluate(fault_config(num_train_steps=4, warmup=2), workdir,
                             data=presence_task, profile_steps=(2, 3))
  traces = glob.glob(os.path.join(workdir, "profile", "plugins", "profile", "*", "*.xplane.pb"))
  assert len(traces) == 1 and os.path.getsize(traces[0]) > 0, traces
  perfetto = glob.glob(os.path.join(os.path.dirname(traces[0]), "perfetto_trace.json.gz"))
  assert perfetto, os.listdir(os.path.dirname(traces[0]))
  # The trace marks steps 2 and 3 (StepTraceAnnotation), and no other step.
  import gzip  # pylint: disable=import-outside-toplevel
  import json  # pylint: disable=import-outside-toplevel
  with gzip.open(perfetto[0], "rt") as f:
    events = json.load(f)
  events = events["traceEvents"] if isinstance(events, dict) else events
  marked = {int(e["args"]["step_num"]) for e in events
            if e.get("name") == "train" and "step_num" in e.get("args", {})}
  assert marked == {2, 3}, marked

  with open(os.path.join(workdir, metric_logging.PARAMETER_OVERVIEW_FILE)) as f:
    overview = f.read()
  (params,) = [r["params"] for r in read_records(os.path.join(workdir, "metrics.jsonl"))
               if r["split"] == "info" and "params" in r]
  total = re.search(r"^Total: ([\d,]+)", overview, re.M)
  assert total and int(total.group(1).replace(",", "")) == params > 0, overview
  config = fault_config(num_train_steps=4, warmup=2)
  paths = flax.traverse_util.flatten_dict(_params(workdir, config, presence_task), sep="/")
  rows = re.findall(r"^\| (\S+)\s+\|", overview, re.M)
  assert set(rows) - {"Name"} == set(paths) and len(paths) > 3, (rows, sorted(paths))
