"""No TPU start-up noise on a machine without a TPU.

With ``libtpu`` installed (the ``tpu`` and ``test`` extras) and ``JAX_PLATFORMS`` unset, JAX
tries its TPU backend first on every machine; on one without a TPU, libtpu then prints five
or six lines of errors to stderr ("could not determine TPU accelerator type", "unexpected
worker hostname", ...) before JAX falls back to the GPU or CPU. :func:`skip_absent_tpu`,
called by ``train.py`` and ``eval.py`` before JAX starts its backends, makes the TPU backend
fail at once, quietly and without loading libtpu, when no TPU can be attached, and changes
nothing else: the CUDA or ROCm plugin and the CPU are tried as before, in JAX's order, with
JAX's fallbacks. On a TPU VM, or when the user chose (``JAX_PLATFORMS``,
``JAX_FORCE_TPU_INIT``), JAX is left alone.

"tpu" stays a platform JAX knows, so Pallas's TPU lowerings still register (importing
``jax.experimental.pallas.tpu`` needs that), and compiling for a TPU on a CPU machine
(``scripts/tpu_check.py``, ``simpletron_jax.tools.tpu_aot``) keeps working: it loads libtpu
through ``jax.experimental.topologies``, not through the TPU backend.

JAX has no public switch for "every platform but the TPU": the TPU backend's registration in
``jax._src.xla_bridge._backend_factories`` (a ``BackendRegistration`` dataclass with
``fail_quietly=True``, the same in jax 0.6.1 to 0.11) gets a factory that raises. Where that
registration is missing or would fail loudly, nothing is changed, and the lines come back.
"""

from __future__ import annotations

import dataclasses
import glob
import os

# PCI vendor id of Google, whose devices on a PCI bus are TPU chips (jax's
# hardware_utils.num_available_tpu_chips_and_device_id reads the same files).
_GOOGLE_PCI_VENDOR = "0x1ae0"


def tpu_may_be_attached(dev: str = "/dev", sys_pci: str = "/sys/bus/pci/devices") -> bool:
  """Whether this machine may have a TPU chip: conservative, any sign counts.

  Args:
    dev: the device folder (``/dev``; a parameter for tests).
    sys_pci: the PCI device folder of sysfs (``/sys/bus/pci/devices``).

  Returns:
    True when any of these exists: a ``{dev}/accel*`` device (TPU v2 to v4), a numbered
    VFIO group ``{dev}/vfio/<n>`` (TPU v5e, v5p, v6e are attached through VFIO), or a PCI
    device of Google's vendor id 0x1ae0 (what jax itself checks); else False.
  """
  if glob.glob(os.path.join(dev, "accel*")):
    return True
  vfio = os.path.join(dev, "vfio")
  if os.path.isdir(vfio) and any(name.isdigit() for name in os.listdir(vfio)):
    return True
  for vendor_file in glob.glob(os.path.join(sys_pci, "*", "vendor")):
    try:
      with open(vendor_file) as f:
        if f.read().strip().lower() == _GOOGLE_PCI_VENDOR:
          return True
    except OSError:
      continue
  return False


def _no_tpu_attached():
  """The TPU backend factory on a machine without a TPU: fails without loading libtpu."""
  raise RuntimeError("no TPU is attached to this machine (no /dev/accel*, no VFIO group, no "
                     "Google PCI device; simpletron_jax.runtime.platforms)")


def skip_absent_tpu() -> bool:
  """Makes JAX's TPU backend fail quietly, without loading libtpu, when no TPU can be attached.

  Call before anything starts JAX's backends (``jax.devices()``, the first computation);
  it imports ``jax`` (which starts nothing). Does nothing when ``JAX_PLATFORMS`` or
  ``jax.config.jax_platforms`` is set (the user chose), when ``JAX_FORCE_TPU_INIT`` is set,
  when :func:`tpu_may_be_attached`, when the backends are already started, or when this jax
  keeps no quiet TPU registration where jax 0.6.1 to 0.11 keep it. Afterwards
  ``jax.devices("tpu")`` raises JAX's "Unable to initialize backend 'tpu'" with this
  module's reason.

  Returns:
    True when the TPU backend was replaced; False when JAX was left as it was.
  """
  if os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ:
    return False
  if tpu_may_be_attached():
    return False
  import jax  # pylint: disable=import-outside-toplevel
  if jax.config.jax_platforms:
    return False
  try:
    from jax._src import xla_bridge  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  factories = getattr(xla_bridge, "_backend_factories", None)
  started = getattr(xla_bridge, "backends_are_initialized", lambda: True)
  registration = factories.get("tpu") if isinstance(factories, dict) else None
  if (registration is None or not dataclasses.is_dataclass(registration)
      or getattr(registration, "fail_quietly", False) is not True or started()):
    return False
  factories["tpu"] = dataclasses.replace(registration, factory=_no_tpu_attached)
  return True
