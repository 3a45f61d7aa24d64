"""An objective nobody ships, registered by the user's own module: ``gmts train --plugin``
imports it before the config is read, GMTS scores it with omega by autograd, and the trainer
trains on it. Without the plugin the objective is named as unknown before anything loads."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from gmts.cli import main
from gmts.core.objectives.registry import _OBJECTIVES
from gmts.train.metrics_log import read_metrics

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")

PLUGIN = '''
import torch
import gmts
from gmts.core.objectives.inputs import Surrogate


def tanh_ratio(inputs, config, ratio):
    """s = A tanh(r - 1): bounded in r, no clip, no closed-form omega."""
    return Surrogate.unclipped(inputs.advantages * torch.tanh(ratio.value - 1))


gmts.register_objective(gmts.Objective("tanh-ratio", tanh_ratio, None, frozenset()))
'''


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "my_objectives.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("my_objectives", None)
    if "tanh-ratio" in _OBJECTIVES.names():
        _OBJECTIVES.remove("tanh-ratio")


def _args(tmp_path: Path) -> list[str]:
    model_dir = _tiny.save_tiny_model(tmp_path / "model")
    return [
        *_tiny.small_overrides(model_dir, tmp_path / "run"),
        "selection.ratio=0.3",
        "objective.name=tanh-ratio",
        "objective.clip_low=0.2",  # shared fields keep their meaning; the plugin reads none
    ]


def test_gmts_train_imports_the_plugin_before_reading_the_config(plugin_dir, capsys):
    torch.set_num_threads(1)
    args = _args(plugin_dir)
    assert main(["train", *args]) == 2  # not registered yet: named before anything loads
    assert "unknown objective 'tanh-ratio'" in capsys.readouterr().err
    assert not (plugin_dir / "run" / "metrics.jsonl").exists()

    assert main(["train", "--plugin", "my_objectives", "selection.omega=autograd", *args]) == 0
    rows = read_metrics(plugin_dir / "run")
    assert [r["step"] for r in rows] == [1, 2]
    # (the random model earns reward 0 on every answer of the task: A = 0, nothing selected;
    # the next test gives it a graded reward)
    assert all(r["update/skipped_nonfinite"] == 0 for r in rows)


def test_a_plugged_in_objective_trains_with_gmts(plugin_dir):
    from gmts.cli.train import import_plugins
    from gmts.train.trainer import Trainer

    torch.set_num_threads(1)
    import_plugins(["my_objectives"])
    cfg = _tiny.small_config(
        _tiny.save_tiny_model(plugin_dir / "model"),
        plugin_dir / "run",
        "selection.ratio=0.3",
        "selection.omega=autograd",
        "objective.name=tanh-ratio",
    )
    trainer = Trainer(cfg, reward_fn=_tiny.partial_credit)
    before = _tiny.params_vector(trainer.model)
    trainer.run()
    assert not torch.equal(before, _tiny.params_vector(trainer.model))
    rows = read_metrics(plugin_dir / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["update/skipped_nonfinite"] == 0 and math.isfinite(row["update/loss"])
        # graded rewards: non-zero advantages, so GMTS selects its 30% (ceil per step)
        assert 0 < row["select/fraction"] <= 0.3 + 2 / row["response/tokens"] + 1e-9


def test_a_plugin_that_cannot_be_imported_is_named(tmp_path, capsys):
    assert main(["train", "--plugin", "no_such_module_here", "optim.steps=1"]) == 2
    err = capsys.readouterr().err
    assert "--plugin no_such_module_here: cannot import it" in err
