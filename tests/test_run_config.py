"""The typed run config (simpletron_jax/train/run_config.py): its defaults are configs/lra.py's,
a field a config lacks takes its default, and a bad value is refused naming its field."""

import dataclasses
import re

import ml_collections
import pytest

from configs import lra
from simpletron_jax.train import run_config
from tests.test_train import tiny_config

SECTIONS = (run_config.TrainConfig, run_config.EvalConfig, run_config.CheckpointConfig,
            run_config.LoggingConfig)


def _defaults(cls, prefix=""):
  """``{dotted field: default}`` of a section, sub-sections included."""
  found = {}
  for f in dataclasses.fields(cls):
    if "section" in f.metadata:
      found.update(_defaults(f.metadata["section"], f"{prefix}{f.name}."))
    elif f.default is not dataclasses.MISSING:
      found[prefix + f.name] = f.default
  return found


@pytest.mark.parametrize("task", ["listops", "text", "retrieval"])
def test_defaults_are_those_of_configs_lra(task):
  config = lra.make_config(task, "softmax")
  for cls in SECTIONS:
    for field, default in _defaults(cls).items():
      holder = config
      for part in field.split("."):
        holder = holder[part]
      assert holder == default, field


def test_a_field_the_config_lacks_takes_its_default():
  config = tiny_config()
  values = config.to_dict()
  for field in ("max_train_minutes", "lora", "parallelism", "num_eval_steps", "max_to_keep"):
    del values[field]
  run = run_config.RunConfig.from_config_dict(ml_collections.ConfigDict(values), 2)
  assert run.train.max_train_minutes == 0.0 and run.train.lora == run_config.LoraConfig()
  assert run.train.parallelism == "pmap" and run.eval.num_eval_steps == -1
  assert run.checkpoint.max_to_keep == 2


def test_it_is_read_once_into_frozen_sections():
  config = tiny_config(**{"lora.rank": 4, "freeze": ("^encoder/",)})
  run = run_config.RunConfig.from_config_dict(config, 2)
  config.batch_size = 64   # the typed config is a copy
  assert run.train.batch_size == 16 and run.train.lora.rank == 4
  assert run.train.freeze == ("^encoder/",) and run.model.emb_dim == 16
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.train.batch_size = 8


@pytest.mark.parametrize("field,value,message", [
    ("log_every", 0, "log_every=0 must be >= 1"),
    ("max_to_keep", 0, "max_to_keep=0 must be >= 1, or a killed run cannot resume"),
    ("eval_batch_size", -1, "eval_batch_size=-1 must be >= 0 (0: the micro-batch size)"),
    ("num_test_steps", 0, "num_test_steps=0 would evaluate no batch"),
    ("lora.alpha", -1.0, "lora.alpha=-1.0 must be >= 0 (0: alpha = rank)"),
    ("seed", -1, "seed=-1 must be >= 0"),
    ("task", "nope", "nope"),
])
def test_a_bad_value_names_its_field(field, value, message):
  with pytest.raises(ValueError, match="^" + re.escape(message) if field != "task" else message):
    run_config.RunConfig.from_config_dict(tiny_config(**{field: value}), 2)


def test_a_missing_field_without_default_is_named():
  values = tiny_config().to_dict()
  del values["learning_rate"]
  with pytest.raises(ValueError, match="^learning_rate is missing"):
    run_config.TrainConfig.from_config_dict(ml_collections.ConfigDict(values))


def test_an_evaluated_run_skips_the_training_checks():
  config = tiny_config(batch_size=15)   # does not split over 2 devices: only a run refuses it
  assert run_config.RunConfig.from_config_dict(config).train.batch_size == 15
  with pytest.raises(ValueError, match="batch_size=15 must be divisible"):
    run_config.RunConfig.from_config_dict(config, 2)
