"""What a run was computed with, so that nothing resumes or reports silently (docs/runs.md).

:func:`run_record` (in each checkpoint's meta) and :func:`check_resume` refuse a resume with
other settings; :func:`config_fingerprint` (in ``results.json``) and :func:`results_problem`
tell whether a ``results.json`` is a finished run of a config. No JAX here.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from typing import Any, Iterable, Mapping

import ml_collections

from simpletron_jax.runtime.errors import ConfigMismatchError


# Config fields a resumed run may change: what is reported or when, not what a step computes
# (the data are compared by ``data_sha256``). ``num_train_steps`` only upward, and not under a
# factor of SCHEDULE_LENGTH_FACTORS. Any other change needs --allow_resume_changes.
RESUME_ALLOWED_FIELDS = ("eval_frequency", "num_train_steps", "max_train_minutes", "log_every",
                         "checkpoint_every", "max_to_keep", "data.data_dir", "data.cache_dir",
                         "data.tfds_data_dir", "parallelism", "async_checkpoints",
                         "wandb.project", "wandb.entity", "wandb.mode")
# Left out of computed_fields at these defaults, so older runs keep their config_fingerprint.
FINGERPRINT_DEFAULTS = {"best_metric": "accuracy", "best_mode": "max"}
# Learning-rate factors whose rate depends on num_train_steps (their period).
SCHEDULE_LENGTH_FACTORS = ("cosine_decay",)
# The checkpoint meta key holding :func:`run_record`, and config.json's list of changes.
RECORD_KEY = "run_record"
CONFIG_HISTORY_KEY = "config_history"
# config.json's record of the software and devices (:func:`software_record.software`).
SOFTWARE_KEY = "software"
NOT_CONFIG_KEYS = (CONFIG_HISTORY_KEY, SOFTWARE_KEY)
# results.json's list of the changes --allow_resume_changes let through (:func:`forced_changes`).
FORCED_KEY = "forced_resume_changes"
# What each non-config entry of a run record is, for the messages.
RECORD_LABELS = {
    "vocab_size": "vocab_size (of the task's data: the embedding's rows)",
    "num_classes": "num_classes (of the task's data: the output layer's width)",
    "num_devices": "number of devices (jax.device_count(): the data and dropout layout)",
    "num_hosts": "number of hosts (jax.process_count())",
    "data_sha256": "data (sha256 of the loaded splits)",
}


def flatten_config(config: Any) -> dict[str, Any]:
  """``{"model.emb_dim": 64, ...}``: every leaf of ``config`` (a ``ConfigDict`` or the dict of
  ``config.json``) as plain JSON values (tuples as lists), without :data:`NOT_CONFIG_KEYS`."""
  if hasattr(config, "to_json_best_effort"):
    config = json.loads(config.to_json_best_effort())
  out: dict[str, Any] = {}

  def walk(node, prefix):
    for key, value in node.items():
      if not prefix and key in NOT_CONFIG_KEYS:
        continue
      name = f"{prefix}{key}"
      if isinstance(value, Mapping) and value:
        walk(value, name + ".")
      else:
        out[name] = json.loads(json.dumps(value, default=str))
  walk(config, "")
  return out


def _schedule_uses_length(flat: Mapping[str, Any]) -> bool:
  return any(f in str(flat.get("factors", "")) for f in SCHEDULE_LENGTH_FACTORS)


def computed_fields(config: Any) -> dict[str, Any]:
  """The fields of ``config`` that change what is computed: every leaf of
  :func:`flatten_config` but :data:`RESUME_ALLOWED_FIELDS` (``num_train_steps`` stays when
  the schedule depends on it) and :data:`FINGERPRINT_DEFAULTS` at their defaults."""
  flat = flatten_config(config)
  keep_length = _schedule_uses_length(flat)
  return {k: v for k, v in flat.items()
          if (k not in RESUME_ALLOWED_FIELDS or (k == "num_train_steps" and keep_length))
          and FINGERPRINT_DEFAULTS.get(k, ()) != v}


def config_fingerprint(config: Any) -> str:
  """SHA-256 (64 hex digits) of the canonical JSON (sorted keys, no spaces) of
  :func:`computed_fields`: two configs share it exactly when they compute the same run,
  whatever their reporting settings (:data:`RESUME_ALLOWED_FIELDS`) and data paths."""
  text = json.dumps(computed_fields(config), sort_keys=True, separators=(",", ":"))
  return hashlib.sha256(text.encode()).hexdigest()


def run_record(config: Any, *, vocab_size: int, num_classes: int, num_devices: int,
               num_hosts: int, data_sha256: str | None = None) -> dict[str, Any]:
  """What a checkpoint's numbers depend on, stored in its meta under :data:`RECORD_KEY`: a
  JSON-ready dict of ``config`` (nested, as ``config.json``) and the other arguments.

  Args:
    vocab_size, num_classes: the task data's sizes (the model's embedding and output).
    num_devices, num_hosts: ``jax.device_count()`` and ``jax.process_count()``.
    data_sha256: a digest of the loaded splits
      (:func:`simpletron_jax.runtime.distributed.data_fingerprint`); None: not compared.
  """
  tree = (json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort")
          else dict(config))
  for key in NOT_CONFIG_KEYS:
    tree.pop(key, None)
  return {"config": tree, "vocab_size": int(vocab_size), "num_classes": int(num_classes),
          "num_devices": int(num_devices), "num_hosts": int(num_hosts),
          "data_sha256": data_sha256}


def resume_changes(saved: Mapping[str, Any], current: Mapping[str, Any],
                   skip_prefixes: tuple[str, ...] = ("model.",)) -> list[dict[str, Any]]:
  """Every difference between two :func:`run_record`\\ s, as ``{"field", "old", "new",
  "allowed"}``: the record's own entries first, then the config fields by name; ``allowed``
  follows :data:`RESUME_ALLOWED_FIELDS`.

  Args:
    saved: the checkpoint's record, or only a ``config`` from ``config.json`` (what is
      missing is not compared).
    current: this start's record.
    skip_prefixes: config fields compared elsewhere (``model.*``: by ``model_config``).
  """
  changes = []
  for key in RECORD_LABELS:
    old, new = saved.get(key), current.get(key)
    if old is not None and new is not None and old != new:
      changes.append({"field": key, "old": old, "new": new, "allowed": False})
  old_cfg = flatten_config(saved.get("config") or {})
  new_cfg = flatten_config(current.get("config") or {})
  if old_cfg:
    length_matters = _schedule_uses_length(old_cfg) or _schedule_uses_length(new_cfg)
    for field in sorted(set(old_cfg) | set(new_cfg)):
      if field.startswith(skip_prefixes):
        continue
      old, new = old_cfg.get(field, "<absent>"), new_cfg.get(field, "<absent>")
      if old == new:
        continue
      allowed = field in RESUME_ALLOWED_FIELDS
      if field == "num_train_steps":
        allowed = (not length_matters and isinstance(old, int) and isinstance(new, int)
                   and new >= old)
      changes.append({"field": field, "old": old, "new": new, "allowed": allowed})
  return changes


def describe_change(change: Mapping[str, Any]) -> str:
  """``"<field>: checkpoint A, config B"`` (with what a record entry is)."""
  name = RECORD_LABELS.get(change["field"], change["field"])
  old, new = change["old"], change["new"]
  if change["field"] == "data_sha256":
    old, new = str(old)[:12], str(new)[:12]
  elif change["field"] == "num_train_steps" and not change["allowed"]:
    name += " (only upward, and not with a cosine_decay schedule, whose period it is)"
  return f"{name}: checkpoint {old!r}, config {new!r}"


def check_resume(where: str, saved: Mapping[str, Any], current: Mapping[str, Any], *,
                 model_diff: Iterable[str] = (), allow_changes: bool = False
                 ) -> list[dict[str, Any]]:
  """Refuses to resume the checkpoint at ``where`` with settings that compute something else.

  Args:
    where: the checkpoint folder, for the message.
    saved, current: the checkpoint's and this start's :func:`run_record`.
    model_diff: the ``model.*`` differences (:func:`flat_diff` lines); never allowed.
    allow_changes: ``--allow_resume_changes``: continue despite the other changes.

  Returns:
    Every change (:func:`resume_changes`), allowed or forced, for the config history.

  Raises:
    ConfigMismatchError: one line listing each refused field with both values.
  """
  model_diff = list(model_diff)
  changes = resume_changes(saved, current)
  refused = [c for c in changes if not c["allowed"]]
  if model_diff or (refused and not allow_changes):
    listed = "; ".join([describe_change(c) for c in refused] + model_diff)
    todo = ("Resume with the checkpoint's values (the workdir's config.json) or use another "
            "--workdir")
    if refused:
      todo += ("; or pass --allow_resume_changes to continue with the new values (recorded in "
               f"config.json's {CONFIG_HISTORY_KEY})")
    if model_diff:
      todo += "; model.* fields cannot change on resume"
    raise ConfigMismatchError(f"{where} was computed with other settings: {listed}. {todo}.")
  return changes


def flat_diff(saved: Mapping[str, Any], current: Mapping[str, Any],
              prefix: str = "model") -> list[str]:
  """``"field: saved A, now B"`` for every field where two nested dicts differ."""
  out = []
  for key in sorted(set(saved) | set(current)):
    a, b = saved.get(key, "<absent>"), current.get(key, "<absent>")
    if isinstance(a, Mapping) and isinstance(b, Mapping):
      out += flat_diff(a, b, f"{prefix}.{key}")
    elif a != b:
      out.append(f"{prefix}.{key}: checkpoint {a!r}, config {b!r}")
  return out


def read_config_json(path: str) -> dict[str, Any] | None:
  """The config a run saved at ``path`` as a nested dict (with its ``config_history``), or
  None when the file is missing or unreadable (a torn write: it is rewritten at start)."""
  try:
    with open(path, encoding="utf-8") as f:
      tree = json.load(f)
  except (OSError, ValueError):
    return None
  return tree if isinstance(tree, dict) else None


def config_with_history(config: ml_collections.ConfigDict, history: list,
                        changes: list[dict[str, Any]], step: int) -> dict[str, Any]:
  """``config`` as the nested dict of ``config.json``, with its history of changes.

  Args:
    history: the previous ``config.json``'s ``config_history`` (a list, maybe empty).
    changes: :func:`check_resume`'s changes at this start.
    step: the optimizer step this start resumes from.

  Returns:
    The config's fields and, when any start changed a setting, under
    :data:`CONFIG_HISTORY_KEY` one entry per such start: ``{"step", "time"`` (ISO 8601,
    local), ``"changes": {field: {"old", "new", "allowed"}}, "forced"}`` (a refused change
    was let through).
  """
  tree = json.loads(config.to_json_best_effort())
  history = list(history) if isinstance(history, list) else []
  if changes:
    entry = {"step": int(step), "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
             "changes": {c["field"]: {"old": c["old"], "new": c["new"],
                                      "allowed": c["allowed"]} for c in changes},
             "forced": any(not c["allowed"] for c in changes)}
    last = history[-1] if history else {}
    if not (last.get("step") == entry["step"] and last.get("changes") == entry["changes"]):
      history.append(entry)   # a start killed before its first save repeats the same change
  if history:
    tree[CONFIG_HISTORY_KEY] = history
  return tree


def forced_changes(history: Any) -> list[dict[str, Any]]:
  """The starts that ``--allow_resume_changes`` let change what is computed, from ``history``
  (``config.json``'s ``config_history``; not a list: empty): ``[{"step": N, "fields": [the
  forced fields]}]``, empty for a run of one config."""
  out = []
  for entry in history if isinstance(history, list) else []:
    if isinstance(entry, Mapping) and entry.get("forced"):
      fields = [f for f, c in (entry.get("changes") or {}).items()
                if isinstance(c, Mapping) and not c.get("allowed", False)]
      out.append({"step": entry.get("step"), "fields": fields})
  return out


def _describe_forced(forced: list) -> str:
  """``"learning_rate at step 60; seed at step 80"`` for :func:`forced_changes`' list."""
  parts = []
  for entry in forced:
    fields = entry.get("fields") if isinstance(entry, Mapping) else None
    step = entry.get("step") if isinstance(entry, Mapping) else None
    parts.append(f"{', '.join(map(str, fields or ['?']))} at step {step}")
  return "; ".join(parts)


RESULTS_ACCURACY_KEYS = ("test_accuracy", "test_accuracy_best_val", "test_accuracy_final")


def results_problem(results: Any, config: Any = None,
                    count_forced: bool = False) -> str | None:
  """Why a ``results.json`` does not count as a finished run (of ``config``); None if it does.

  Files older than the ``complete``, ``final_step`` and ``config_fingerprint`` keys count when
  their ``last_step`` reached ``num_train_steps``.

  Args:
    results: the parsed ``results.json``.
    config: the config the run should have (a ConfigDict or ``config.json``'s dict); None:
      only completeness, finiteness and forced changes are checked.
    count_forced: count a run with a non-empty :data:`FORCED_KEY` (``--allow_resume_changes``).

  Returns:
    One line: incomplete, no or a non-finite test accuracy, forced changes, another step
    count, or another config fingerprint.
  """
  if not isinstance(results, Mapping):
    return "it is not a JSON object"
  step = results.get("final_step", results.get("last_step"))
  total = results.get("num_train_steps")
  complete = results.get("complete")
  if complete is None and isinstance(step, int) and isinstance(total, int):
    complete = step >= total
  if complete is False:
    why = results.get("stopped_by")
    return (f"incomplete: training stopped at step {step} of {total}"
            + (f" ({why})" if why else "") + "; rerun the same command to continue")
  if not any(k in results for k in RESULTS_ACCURACY_KEYS):
    return "it holds no test accuracy"
  for key in RESULTS_ACCURACY_KEYS:
    value = results.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
      return f"{key} is {'null (NaN or inf)' if value is None else repr(value)}"
  forced = results.get(FORCED_KEY)
  if forced and not count_forced:
    return (f"it was resumed with --allow_resume_changes ({_describe_forced(forced)}), so its "
            "numbers are not those of one config; train that config in a new workdir, or "
            "count the run anyway with --count_forced (docs/runs.md)")
  if config is not None:
    wanted = config.get("num_train_steps")
    if isinstance(step, int) and isinstance(wanted, int) and step != wanted:
      return f"it was computed at step {step}, but the config trains {wanted} steps"
    saved = results.get("config_fingerprint")
    if saved is not None and saved != config_fingerprint(config):
      return (f"it was computed with another config (config_fingerprint {str(saved)[:12]}, "
              f"this config's {config_fingerprint(config)[:12]})")
  return None


def workdir_results_problem(workdir: str, config: Any = None,
                            count_forced: bool = False) -> str | None:
  """Why ``workdir/results.json`` does not count (missing, unreadable, or
  :func:`results_problem`'s reason, naming the file), or None. Never raises."""
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    return "no results.json"
  try:
    with open(path, encoding="utf-8") as f:
      results = json.load(f)
  except (OSError, ValueError) as e:
    return f"{path} is unreadable ({e})"
  problem = results_problem(results, config, count_forced)
  return None if problem is None else f"{path}: {problem}"
