"""Keeps libtpu's start-up errors off stderr on a machine without a TPU.

With libtpu installed and ``JAX_PLATFORMS`` unset, JAX tries the TPU backend first, and libtpu
prints errors before JAX falls back to GPU or CPU. :func:`skip_absent_tpu` gives the TPU's
``BackendRegistration`` in ``jax._src.xla_bridge._backend_factories`` (``fail_quietly=True``
in jax 0.6.1 to 0.11) a factory that raises. "tpu" stays a known platform, so Pallas TPU
lowerings and compiling through ``jax.experimental.topologies`` keep working.
"""

from __future__ import annotations

import dataclasses
import glob
import os

# Google's PCI vendor id (jax's hardware_utils reads the same sysfs files).
_GOOGLE_PCI_VENDOR = "0x1ae0"


def tpu_may_be_attached(dev: str = "/dev", sys_pci: str = "/sys/bus/pci/devices") -> bool:
  """Whether a TPU may be attached: a ``{dev}/accel*`` device (TPU v2 to v4), a numbered VFIO
  group ``{dev}/vfio/<n>`` (v5e, v5p, v6e) or a PCI device of vendor 0x1ae0 under ``sys_pci``."""
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

  Call before JAX starts its backends. Returns False, changing nothing, when ``JAX_PLATFORMS``,
  ``jax.config.jax_platforms`` or ``JAX_FORCE_TPU_INIT`` is set, a TPU may be attached, the
  backends have started, or jax lacks the quiet TPU registration; True when it replaced it.
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


def devices():
  """``jax.devices()``, the first call that starts JAX's backends.

  Raises:
    ValueError: one line naming ``JAX_PLATFORMS`` (or ``jax_platforms``) and JAX's own first
      line, when no backend it names can start: an unknown name (``JAX_PLATFORMS=bogus``) or a
      platform this machine lacks (``JAX_PLATFORMS=tpu`` without a TPU).
  """
  import jax  # pylint: disable=import-outside-toplevel
  try:
    return jax.devices()
  except RuntimeError as e:
    setting = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms
    name = "JAX_PLATFORMS" if os.environ.get("JAX_PLATFORMS") else "jax_platforms"
    cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    raise ValueError(f"{name}={setting!r}: JAX could not start it ({cause}); unset "
                     f"{name} to use the devices JAX finds, or name one this machine has "
                     "(cpu, cuda, tpu)") from None
