"""A checkpoint written from a whole state dict (FSDP's gathered weights, whose tensors share
no storage) stores a tied weight once, as ``save_pretrained`` does from the model itself, and
loads back to the same model."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from gmts.train.checkpoint import list_checkpoints, save_checkpoint

from file_modules import load_module

_tiny = load_module(Path(__file__).with_name("_tiny.py"), "_tiny")


def _saved(tmp_path: Path, model: torch.nn.Module, weights: dict | None) -> Path:
    save_checkpoint(tmp_path / "run", 1, model=model, tokenizer=None, trainer_state={}, keep=1)
    if weights is not None:  # the FSDP form: copies, not views of the model's parameters
        save_checkpoint(
            tmp_path / "run", 2, model=model, tokenizer=None, trainer_state={}, keep=2,
            weights=weights,
        )  # fmt: skip
    return list_checkpoints(tmp_path / "run")[-1][1] / "model"


def test_gathered_weights_store_a_tied_weight_once(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(_tiny.save_tiny_model(tmp_path / "tiny"))
    assert model.all_tied_weights_keys  # GPT-2: lm_head.weight is the token embedding
    gathered = {k: v.detach().clone() for k, v in model.state_dict().items()}
    plain = load_file(_saved(tmp_path / "a", model, None) / "model.safetensors")
    folder = _saved(tmp_path / "b", model, gathered)
    stored = load_file(folder / "model.safetensors")
    assert stored.keys() == plain.keys()
    assert not set(model.all_tied_weights_keys) & stored.keys()
    reloaded = AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(_tiny.params_vector(reloaded), _tiny.params_vector(model))


def test_untied_weights_are_all_kept(tmp_path):
    model = AutoModelForCausalLM.from_pretrained(_tiny.save_tiny_model(tmp_path / "tiny"))
    gathered = {k: v.detach().clone() for k, v in model.state_dict().items()}
    (target, source), *_ = model.all_tied_weights_keys.items()
    gathered[target] = gathered[source] + 1.0  # no longer a copy: it must stay
    stored = load_file(_saved(tmp_path, model, gathered) / "model.safetensors")
    assert torch.equal(stored[target], gathered[target])
