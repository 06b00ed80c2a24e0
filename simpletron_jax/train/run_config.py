"""The typed run config of the training core: a frozen dataclass per section, in :class:`RunConfig`.

Built once from the ConfigDict of ``configs/`` (:meth:`RunConfig.from_config_dict`), with the
defaults below for the fields a config lacks; batching reads :class:`batches.BatchConfig`, the
loaders :class:`tasks.DataConfig`; only the run record keeps the ConfigDict.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import ml_collections
import numpy as np

from simpletron_jax.data import tasks
from simpletron_jax.data.batches import BatchConfig
from simpletron_jax.model.model_config import ModelConfig
from simpletron_jax.run.metric_logging import WandbConfig
from simpletron_jax.runtime.errors import warn
from simpletron_jax.train import checkpoints, config_checks, pretraining, schedules, steps

check = config_checks.check_range
PARALLELISMS = ("pmap", "jit")
BEST_MODES = ("max", "min")


def _section(cls):
  """A field holding the sub-section ``cls``."""
  return dataclasses.field(default_factory=cls, metadata={"section": cls})


def _read(cls, holder: Any, prefix: str = "") -> Any:
  """``cls`` read from ``holder`` (defaults where it lacks a field); raises ValueError naming a
  missing field that has no default."""
  values = {}
  for f in dataclasses.fields(cls):
    section = f.metadata.get("section")
    if f.name in holder:
      value = holder[f.name]
      values[f.name] = (_read(section, value, f"{prefix}{f.name}.") if section is not None
                        else value)
    elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
      raise ValueError(f"{prefix}{f.name} is missing: the config must set it")
  return cls(**values)


def _from_config_dict(cls, config: ml_collections.ConfigDict) -> Any:
  """The section ``cls`` of ``config``, checked; raises ValueError naming the field."""
  section = _read(cls, config)
  section.validate()
  return section


def _patterns(field: str, patterns: Any) -> tuple[str, ...]:
  """``patterns`` (regexes of parameter paths) as a tuple; raises ValueError naming
  ``field[i]``, not a string or not a regular expression."""
  patterns = (patterns,) if isinstance(patterns, str) else tuple(patterns or ())
  for i, pattern in enumerate(patterns):
    if not isinstance(pattern, str):
      raise ValueError(f"{field}[{i}]={pattern!r} must be a string (a regex of parameter "
                       f"paths), e.g. --config.{field}=\"('^encoder/',)\"")
    try:
      re.compile(pattern)
    except re.error as e:
      raise ValueError(f"{field}[{i}]={pattern!r}: not a regular expression ({e}); escape "
                       "a literal bracket, dot or star with a backslash") from None
  return patterns


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  """``config.lora``: LoRA adapters on the matching kernels (:mod:`simpletron_jax.model.lora`).

  Attributes:
    rank: adapter rank, an int >= 0; 0: no LoRA, else the base parameters are frozen.
    alpha: the scale is ``alpha / rank``, a number >= 0; 0: ``alpha = rank``.
    targets: regexes of the kernel paths that get adapters.
  """
  rank: int = 0
  alpha: float = 0.0
  targets: tuple[str, ...] = ("attention/(query|key|value|out)/kernel$",)

  def validate(self) -> None:
    """Raises ValueError naming ``lora.rank``, ``lora.alpha`` or ``lora.targets[i]``."""
    check("lora.rank", self.rank, low=0, integer=True, hint=" (0: no LoRA)")
    check("lora.alpha", self.alpha, low=0, hint=" (0: alpha = rank)")
    object.__setattr__(self, "targets", _patterns("lora.targets", self.targets))


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """The optimizer, its schedule, the batches and the weight surgery (LRA's
  ``utils/train_utils.py``; configs/lra.py ``_common`` sets every field).

  Attributes:
    batch_size: examples per optimizer step, over all devices and hosts.
    num_train_steps: optimizer steps of the run.
    learning_rate: the schedule's base rate, a positive finite number.
    factors: the schedule, ``"constant * linear_warmup * rsqrt_decay"`` style
      (:func:`schedules.create_learning_rate_schedule`).
    warmup: warmup in optimizer steps, an int >= 0.
    weight_decay: AdamW's decoupled decay (``p -= lr * wd * p``), >= 0.
    adam_b1, adam_b2, adam_eps: Adam's decays in [0, 1) and epsilon (> 0).
    seed: the run's seed (parameters, dropout, data order), an int >= 0.
    grad_accum_steps: micro-steps per optimizer step, a positive int.
    grad_clip_norm: global-norm gradient clipping; 0: none.
    freeze: regexes of parameter paths left untrained.
    init_from: a train.py workdir whose best params start this run; "": none.
    init_include: regexes of the parameter paths copied from ``init_from``; empty: every match.
    lora: :class:`LoraConfig`.
    max_train_minutes: wall-clock minutes per invocation, >= 0; 0: no limit.
    parallelism: ``"pmap"`` (LRA's) or ``"jit"`` (jax.jit over a device mesh).
  """
  batch_size: int
  num_train_steps: int
  learning_rate: float
  factors: str
  warmup: int
  weight_decay: float
  adam_b1: float
  adam_b2: float
  adam_eps: float
  seed: int = 0
  grad_accum_steps: int = 1
  grad_clip_norm: float = 0.0
  freeze: tuple[str, ...] = ()
  init_from: str = ""
  init_include: tuple[str, ...] = ()
  lora: LoraConfig = _section(LoraConfig)
  max_train_minutes: float = 0.0
  parallelism: str = "pmap"

  from_config_dict = classmethod(_from_config_dict)

  def validate(self) -> None:
    """Raises ValueError naming the field: a value outside the ranges above, a bad regex, or
    bad ``factors`` (:func:`schedules.create_learning_rate_schedule`)."""
    if self.parallelism not in PARALLELISMS:
      raise ValueError(f"parallelism={self.parallelism!r} is not 'pmap' (LRA's) or 'jit' "
                       "(jax.jit over a device mesh; docs/scaling.md)")
    check("seed", self.seed, low=0, integer=True)
    for field in ("batch_size", "num_train_steps", "grad_accum_steps"):
      check(field, getattr(self, field), low=1, integer=True)
    self.lora.validate()
    lr = self.learning_rate
    if (isinstance(lr, bool) or not isinstance(lr, (int, float, np.integer, np.floating))
        or not (math.isfinite(float(lr)) and lr > 0)):
      raise ValueError(f"learning_rate={lr} must be a positive finite number")
    check("weight_decay", self.weight_decay, low=0, hint=" (AdamW's decoupled decay; 0: none)")
    check("grad_clip_norm", self.grad_clip_norm, low=0, hint=" (0: none)")
    for field in ("adam_b1", "adam_b2"):
      check(field, getattr(self, field), low=0, high=1, high_open=True)
    check("adam_eps", self.adam_eps, low=0, low_open=True,
          hint=" (Adam divides by sqrt(nu) + adam_eps: 0 gives NaN where a gradient is 0; "
               "LRA's is 1e-9)")
    for field in ("freeze", "init_include"):
      object.__setattr__(self, field, _patterns(field, getattr(self, field)))
    check("warmup", self.warmup, low=0, integer=True, hint=" (optimizer steps)")
    schedules.create_learning_rate_schedule(factors=self.factors, warmup_steps=self.warmup)
    if float(self.max_train_minutes or 0) < 0:
      raise ValueError(f"max_train_minutes={self.max_train_minutes} must be >= 0 (0: no limit)")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  """Validations, the final test and the choice of the best checkpoint.

  Attributes:
    eval_frequency: optimizer steps between validations, a positive int.
    eval_batch_size: global rows per evaluation batch, >= 0; 0: the micro-batch size.
    num_eval_steps, num_test_steps: batches per validation and of the final test, >= 1;
      -1: the whole split.
    best_metric: the validation metric (a :data:`steps.Metrics` name) that picks the best.
    best_mode: ``"max"`` or ``"min"`` (for ``best_metric`` loss).
  """
  eval_frequency: int
  eval_batch_size: int = 0
  num_eval_steps: int = -1
  num_test_steps: int = -1
  best_metric: str = "accuracy"
  best_mode: str = "max"

  from_config_dict = classmethod(_from_config_dict)

  def validate(self) -> None:
    """Raises ValueError, one line naming the field, for a value outside the ranges above."""
    check("eval_frequency", self.eval_frequency, low=1, integer=True)
    check("eval_batch_size", self.eval_batch_size, low=0, integer=True,
          hint=" (0: the micro-batch size)")
    for field in ("num_eval_steps", "num_test_steps"):
      check(field, getattr(self, field), low=-1, integer=True, hint=" (-1: the whole split)")
      if getattr(self, field) == 0:
        raise ValueError(f"{field}=0 would evaluate no batch (0 is not a size here): set it "
                         "to -1 for the whole split, or to a number of batches >= 1")
    metrics = tuple(steps.Metrics.__annotations__)
    if self.best_metric not in metrics or self.best_mode not in BEST_MODES:
      raise ValueError(f"best_metric={self.best_metric!r} / best_mode={self.best_mode!r}: "
                       f"best_metric must be one of {metrics}, best_mode 'max' or 'min'")


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Checkpoints in ``workdir/checkpoints`` (:mod:`checkpoints`).

  Attributes:
    checkpoint_every: optimizer steps between checkpoints, a positive int.
    max_to_keep: newest checkpoints kept besides the best, >= 1.
    async_checkpoints: orbax saves in a background thread (one process only).
  """
  checkpoint_every: int
  max_to_keep: int = 2
  async_checkpoints: bool = False

  from_config_dict = classmethod(_from_config_dict)

  def validate(self) -> None:
    """Raises ValueError, one line naming the field, for a value outside the ranges above."""
    check("checkpoint_every", self.checkpoint_every, low=1, integer=True)
    check("max_to_keep", self.max_to_keep, integer=True)
    if int(self.max_to_keep) < 1:
      raise ValueError(f"max_to_keep={self.max_to_keep} must be >= 1, or a killed run "
                       "cannot resume")


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
  """Train records; ``log_every``: optimizer steps between them, a positive int; ``wandb``:
  the :class:`WandbConfig` section."""
  log_every: int = 10
  wandb: WandbConfig = _section(WandbConfig)

  from_config_dict = classmethod(_from_config_dict)

  def validate(self) -> None:
    """Raises ValueError naming ``log_every`` when it is not a positive int, or a ``wandb``
    field (:meth:`WandbConfig.validate`)."""
    check("log_every", self.log_every, low=1, integer=True)
    self.wandb.validate()


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """A run's config, typed and checked: the task name, the sections above, the encoder's
  :class:`ModelConfig`, the batching fields (:class:`BatchConfig`), the task's data settings
  (:class:`tasks.DataConfig`) and the ``pretrain`` section (None: a plain classifier)."""
  task: str
  train: TrainConfig
  eval: EvalConfig
  checkpoint: CheckpointConfig
  logging: LoggingConfig
  model: ModelConfig
  batches: BatchConfig
  data: tasks.DataConfig
  pretrain: pretraining.PretrainConfig | None = None

  @classmethod
  def from_config_dict(cls, config: ml_collections.ConfigDict, n_devices: int | None = None,
                       n_hosts: int = 1) -> RunConfig:
    """The typed config of ``config`` (``configs/``, overrides applied), every field checked.

    Args:
      n_devices: ``jax.device_count()`` of a run that trains: the batch must divide over
        them, and doubtful settings are warned about; None (evaluation): neither.
      n_hosts: ``jax.process_count()``.

    Warns (:class:`RunWarning`): ``warmup`` or ``checkpoint_every`` longer than the run
      (training only); stale ``model.attention_kwargs``.

    Raises:
      ValueError: one line naming the field: an unknown ``task``, a missing or bad field,
        ``batch_size`` not divisible by ``grad_accum_steps * n_devices``, or
        ``async_checkpoints`` on several hosts.
      errors.RunError: ``wandb.project`` is set but wandb is not installed.
    """
    tasks.get(config.task)   # an unknown task: the field and the known tasks
    sections = {name: kind.from_config_dict(config) for name, kind in
                (("train", TrainConfig), ("eval", EvalConfig),
                 ("checkpoint", CheckpointConfig), ("logging", LoggingConfig))}
    model = config_checks.check_model_and_data(config)
    pretrain = config.pretrain if "pretrain" in config else None
    if pretrain is not None:
      pretrain = _read(pretraining.PretrainConfig, pretrain, "pretrain.")
      pretrain.validate()
    run = cls(task=config.task, model=model, batches=BatchConfig.from_config_dict(config),
              data=tasks.data_config(config), pretrain=pretrain, **sections)
    if n_devices is not None:
      run._check_training(n_devices, n_hosts)
    return run

  def _check_training(self, n_devices: int, n_hosts: int) -> None:
    """The batch divides over ``grad_accum_steps * n_devices``, asynchronous saves run on
    one host; warns about a warmup or checkpoint period longer than the run."""
    train, every = self.train, self.checkpoint.checkpoint_every
    if train.batch_size % (train.grad_accum_steps * n_devices):
      hosts = (f" of all hosts ({n_hosts} host(s) x {n_devices // n_hosts} local device(s))"
               if n_hosts > 1 else "")
      raise ValueError(
          f"batch_size={train.batch_size} must be divisible by grad_accum_steps="
          f"{train.grad_accum_steps} times the {n_devices} device(s){hosts}: use a "
          f"multiple of {train.grad_accum_steps * n_devices}")
    checkpoints.check_async_supported(self.checkpoint.async_checkpoints, n_hosts)
    if "warmup" in str(train.factors) and train.warmup > train.num_train_steps:
      warn(f"warmup={train.warmup} exceeds num_train_steps={train.num_train_steps}: the "
           f"learning rate never reaches learning_rate={train.learning_rate}")
    if every > train.num_train_steps:
      warn(f"checkpoint_every={every} exceeds num_train_steps={train.num_train_steps}: only "
           "the final step is saved, so a killed run restarts from step 0")
