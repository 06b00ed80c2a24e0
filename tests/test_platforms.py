"""No TPU start-up noise on a machine without a TPU (``simpletron_jax.runtime.platforms``).

* :func:`platforms.tpu_may_be_attached` reads the signs a TPU leaves (``/dev/accel*``, a
  numbered VFIO group, a PCI device of Google's vendor id), on fake ``/dev`` and sysfs trees.
* In a subprocess without ``JAX_PLATFORMS`` (the suite sets it to ``cpu``),
  :func:`platforms.skip_absent_tpu` leaves JAX on its CPU, with nothing about a TPU on stderr
  even though libtpu is installed (the ``test`` extra), and Pallas's TPU module still imports
  (it registers lowerings for the platform "tpu", which must stay known). A set
  ``JAX_PLATFORMS`` is left alone, and so is a TPU VM.
* ``train.py`` on tiny ListOps prints no TPU line.
"""

import importlib.util
import os
import subprocess
import sys

import pytest

from simpletron_jax.runtime import platforms
from tests.conftest import ROOT, SMALL_LISTOPS


def _fake_machine(tmp_path, accel=(), vfio=(), vendors=()):
  dev, pci = tmp_path / "dev", tmp_path / "pci"
  dev.mkdir()
  pci.mkdir()
  for name in accel:
    (dev / name).write_text("")
  if vfio:
    (dev / "vfio").mkdir()
    for name in vfio:
      (dev / "vfio" / name).write_text("")
  for i, vendor in enumerate(vendors):
    (pci / f"0000:00:{i:02x}.0").mkdir()
    (pci / f"0000:00:{i:02x}.0" / "vendor").write_text(vendor + "\n")
  return str(dev), str(pci)


@pytest.mark.parametrize("machine,attached", [
    ({}, False),
    ({"vfio": ("vfio",), "vendors": ("0x8086", "0x10de")}, False),   # Intel, NVIDIA; no group
    ({"accel": ("accel0",)}, True),                                   # TPU v4
    ({"vfio": ("vfio", "12")}, True),                                 # TPU v5e / v6e
    ({"vendors": ("0x8086", "0x1ae0")}, True),                        # a Google PCI device
])
def test_a_tpu_is_recognised_by_what_it_leaves_in_dev_and_sysfs(tmp_path, machine, attached):
  dev, pci = _fake_machine(tmp_path, **machine)
  assert platforms.tpu_may_be_attached(dev, pci) is attached


def _env_without_jax_platforms():
  env = dict(os.environ)
  env.pop("JAX_PLATFORMS", None)
  return env


_PROBE = """
from simpletron_jax.runtime import platforms
replaced = platforms.skip_absent_tpu()
import jax
devices = jax.devices()
import jax.experimental.pallas.tpu  # registers lowerings for the platform "tpu"
print(replaced, devices[0].platform)
"""


def _needs_libtpu_and_no_tpu():
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu is not installed (pip install -e '.[test]'): nothing to quieten")
  if platforms.tpu_may_be_attached():
    pytest.skip("this machine may have a TPU")


def test_without_a_tpu_jax_starts_on_its_cpu_and_says_nothing_about_a_tpu():
  _needs_libtpu_and_no_tpu()
  proc = subprocess.run([sys.executable, "-c", _PROBE], env=_env_without_jax_platforms(),
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["True", "cpu"], proc.stdout
  assert "tpu" not in proc.stderr.lower(), proc.stderr[-3000:]


def test_a_platform_the_user_set_is_left_alone():
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["False", "cpu"], proc.stdout


def test_a_machine_with_a_tpu_is_left_alone(monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setattr(platforms, "tpu_may_be_attached", lambda *a, **k: True)
  assert platforms.skip_absent_tpu() is False


@pytest.mark.slow
def test_train_py_prints_no_tpu_line(tmp_path):
  _needs_libtpu_and_no_tpu()
  proc = subprocess.run(
      [sys.executable, "train.py", "--config", "configs/listops/simple.py:tiny", "--workdir",
       str(tmp_path / "run"), *SMALL_LISTOPS,
       "--config.num_train_steps=2",
       "--config.eval_frequency=2", "--config.warmup=1", "--config.checkpoint_every=2"],
      env=_env_without_jax_platforms(), cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "devices: [CpuDevice(id=0)" in proc.stdout, proc.stdout
  assert [line for line in proc.stderr.splitlines() if "tpu" in line.lower()] == []
