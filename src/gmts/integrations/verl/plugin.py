"""The ``verl.plugins`` entry point: switches GMTS on inside every verl process.

verl 0.9's ``verl/__init__.py`` calls ``EntryPoint.load()`` on every entry point of the group
``verl.plugins`` (unless ``VERL_USE_EXTERNAL_PLUGINS=none``); ``load()`` imports the module and
returns the named attribute without calling it, and load errors are logged at DEBUG only. So
the work happens when this module is imported: it calls :func:`register`. Because every Ray
worker imports verl, this runs in each worker process too.

:func:`register` installs three small wrappers, applied when (and only if) verl's modules are
imported, so importing verl stays as cheap as before:

- ``verl.workers.engine_workers.TrainingWorker.set_loss_fn``: when ``GMTS_VERL_SELECTION`` is
  set, verl's ``partial(ppo_loss, config=actor_config)`` is replaced by
  :class:`~gmts.integrations.verl.loss.GMTSPolicyLoss` for the same config (the loss-function
  hook verl offers for custom losses). The critic's ``value_loss`` and ``sft_loss`` pass
  through; any other actor loss raises (GMTS was asked for and cannot be applied).
- ``verl.workers.engine.base.BaseEngine.train_batch``: a loss function that has a
  ``prepare_mini_batch(engine, data)`` method gets to see the whole mini-batch before it is
  split into micro-batches (where GMTS selects). Any other loss function: unchanged.
- ``verl.utils.config.validate_config`` (the driver's config check, before Ray starts): with
  GMTS on it also runs :func:`check_trainer_config` (DAPO group filtering on the legacy
  trainer, which has none, is refused).

Without ``GMTS_VERL_SELECTION`` verl behaves exactly as without the plugin.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = [
    "register",
    "is_registered",
    "when_imported",
    "wrap_loss_fn",
    "check_trainer_config",
]

logger = logging.getLogger(__name__)

_PATCH_MARK = "__gmts_patched__"
_lock = threading.RLock()
_registered = False
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


# --------------------------------------------------------------------------------------------
# run a callback when a module is imported (now, if it already is)


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the callbacks registered for the module."""

    def __init__(self, inner: importlib.abc.Loader, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _run_callbacks(self._name, module)

    def __getattr__(self, item: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._inner, item)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self._busy: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _pending or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _CallbackLoader(spec.loader, fullname)
        return spec


_finder = _PostImportFinder()


def _run_callbacks(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
    for callback in callbacks:
        callback(module)


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once module ``name`` is imported (immediately if it is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(callback)
            if _finder not in sys.meta_path:
                sys.meta_path.insert(0, _finder)
            return
    callback(module)


# --------------------------------------------------------------------------------------------
# the two wrappers


# loss functions of verl's other roles, which have no policy tokens to select (critic, SFT)
PASS_THROUGH_LOSSES = frozenset({"value_loss", "sft_loss"})


def wrap_loss_fn(loss_fn: Any) -> Any:
    """``loss_fn``, or the GMTS loss in place of verl's actor ``ppo_loss`` when GMTS is on.

    With GMTS on, verl's critic ``value_loss`` and ``sft_loss`` pass through untouched; any
    other loss (a distillation loss, a custom actor loss) raises ``ValueError``: GMTS was asked
    for and cannot be applied, and training without selection would be a silent fallback.
    """
    from gmts.integrations.verl.settings import ENV_VAR, GMTSVerlSettings

    settings = GMTSVerlSettings.from_env()
    if settings is None:
        return loss_fn
    from gmts.integrations.verl.loss import GMTSPolicyLoss

    if isinstance(loss_fn, GMTSPolicyLoss):
        return loss_fn
    func = loss_fn.func if isinstance(loss_fn, functools.partial) else loss_fn
    name = getattr(func, "__name__", type(func).__name__)
    if name in PASS_THROUGH_LOSSES:
        return loss_fn
    from verl.workers.utils.losses import ppo_loss

    if func is not ppo_loss or "config" not in loss_fn.keywords:
        raise ValueError(
            f"gmts: {ENV_VAR} asks for GMTS selection, but the actor's loss function is {name}, "
            "not verl's ppo_loss (GMTS replaces ppo_loss only; critic value_loss and sft_loss "
            f"pass through). Unset {ENV_VAR} (or run without the gmts launcher) to train with "
            f"{name}."
        )
    logger.warning("gmts: actor loss replaced by GMTS selection %s", settings.to_dict())
    return GMTSPolicyLoss(loss_fn.keywords["config"], settings)


def patch_training_worker(module: ModuleType) -> None:
    """Wrap ``module.TrainingWorker.set_loss_fn`` with :func:`wrap_loss_fn` (idempotent)."""
    cls = module.TrainingWorker
    original = cls.set_loss_fn
    if getattr(original, _PATCH_MARK, False):
        return

    @functools.wraps(original)  # keeps verl's @register dispatch attributes
    def set_loss_fn(self: Any, loss_fn: Any) -> Any:
        return original(self, wrap_loss_fn(loss_fn))

    setattr(set_loss_fn, _PATCH_MARK, True)
    cls.set_loss_fn = set_loss_fn


def patch_base_engine(module: ModuleType) -> None:
    """Wrap ``module.BaseEngine.train_batch`` to call ``prepare_mini_batch`` (idempotent)."""
    cls = module.BaseEngine
    original = cls.train_batch
    if getattr(original, _PATCH_MARK, False):
        return

    @functools.wraps(original)
    def train_batch(self: Any, data: Any, loss_function: Any = None, *args: Any, **kwargs: Any):
        prepare = getattr(loss_function, "prepare_mini_batch", None)
        if callable(prepare):
            data = prepare(self, data)
        return original(self, data, loss_function, *args, **kwargs)

    setattr(train_batch, _PATCH_MARK, True)
    cls.train_batch = train_batch


def check_trainer_config(config: Any, settings: Any = None) -> None:
    """Raise ``ValueError`` for a verl trainer config that would silently not do what it says,
    or whose actor settings GMTS cannot honour.

    DAPO's dynamic sampling (``algorithm.filter_groups.enable=true``) exists only in verl 0.9's
    V1 trainer (``verl/trainer/ppo/v1/trainer_base.py`` builds its replay buffer with the group
    filter); the legacy trainer (``trainer.use_v1=false``, ``main_ppo_v0`` / ``ray_trainer.py``)
    never reads ``filter_groups``, so the run would train on unfiltered groups. With
    ``settings`` (``GMTSVerlSettings``), the actor config (``actor_rollout_ref.actor``) gets the
    workers' own check, :func:`~gmts.integrations.verl.loss_modes.check_actor_config`, here on
    the driver before Ray starts.
    """
    if settings is not None:
        from gmts.integrations.verl.loss_modes import check_actor_config

        actor = (config.get("actor_rollout_ref", {}) or {}).get("actor", None)
        if actor is not None:
            check_actor_config(actor, settings)
    trainer = config.get("trainer", {}) or {}
    algorithm = config.get("algorithm", {}) or {}
    filter_groups = algorithm.get("filter_groups", None) or {}
    if not bool(trainer.get("use_v1", True)) and bool(filter_groups.get("enable", False)):
        raise ValueError(
            "algorithm.filter_groups.enable=true with trainer.use_v1=false: verl's legacy trainer "
            "implements no group filtering (DAPO dynamic sampling exists only in the V1 trainer), "
            "so the run would silently train on every group. Use trainer.use_v1=true, or "
            "algorithm.filter_groups.enable=false for DAPO without dynamic sampling."
        )


def patch_validate_config(module: ModuleType) -> None:
    """Wrap ``module.validate_config`` (verl's driver-side config check, run by
    ``verl.trainer.main_ppo.main`` before Ray starts) to add :func:`check_trainer_config` when
    GMTS is on (idempotent)."""
    original = module.validate_config
    if getattr(original, _PATCH_MARK, False):
        return

    @functools.wraps(original)
    def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
        from gmts.integrations.verl.settings import GMTSVerlSettings

        settings = GMTSVerlSettings.from_env()
        if settings is not None:
            check_trainer_config(config, settings)
        return original(config, *args, **kwargs)

    setattr(validate_config, _PATCH_MARK, True)
    module.validate_config = validate_config


TARGETS: dict[str, Callable[[ModuleType], None]] = {
    "verl.workers.engine_workers": patch_training_worker,
    "verl.workers.engine.base": patch_base_engine,
    "verl.utils.config": patch_validate_config,
}


def register() -> None:
    """Install the wrappers (now or when verl imports the target modules). Idempotent."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    for name, patch in TARGETS.items():
        when_imported(name, patch)


def is_registered() -> bool:
    """Whether :func:`register` ran in this process."""
    return _registered


register()  # verl's entry-point loader imports this module but never calls the attribute
