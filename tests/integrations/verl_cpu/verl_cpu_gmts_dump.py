"""Test scaffolding: record what the GMTS loss did on the first actor mini-batch of a verl run.

Loaded in every verl process through ``VERL_USE_EXTERNAL_MODULES`` when
``GMTS_TEST_DUMP_DIR`` is set. It wraps :class:`GMTSPolicyLoss` (a thin recorder around the
real methods, which run unchanged) and writes ``<dir>/minibatch-<pid>.pt`` with, for the first
mini-batch this worker trains on:

- ``score_inputs``: the extra pass's current log-probs and entropies ``(B, R)`` and the
  mini-batch's padded response fields and ``gmts_selected`` (the selection's inputs and output);
- ``micro``: per micro-batch, its padded fields, ``gmts_selected``, the training forward's
  log-probs ``(b, R)`` and the loss value the engine back-propagated;
- ``num_selected``, ``batch_num_tokens``, ``dp_size``: the divisors' inputs;
- ``settings`` and ``loss_mode``: the worker's GMTS settings and its actor's
  ``policy_loss.loss_mode``.

The test recomputes selection and loss from these with ``gmts.core``. Not product code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from verl.utils import tensordict_utils as tu
from verl.workers.utils.padding import no_padding_2_padding

from gmts.integrations.verl import loss as gmts_loss

FIELDS = ("response_mask", "old_log_probs", "advantages", "ref_log_prob", "rollout_is_weights")
DUMP_DIR = os.environ.get("GMTS_TEST_DUMP_DIR", "")
_record: dict[str, Any] = {}


def _fields(data: Any) -> dict[str, torch.Tensor]:
    keys = [k for k in (*FIELDS, gmts_loss.SELECTED_KEY) if k in data]
    padded = gmts_loss.padded_response_fields(data, keys)
    return {k: padded[k].detach().cpu().clone() for k in keys}


def _save() -> None:
    path = Path(DUMP_DIR) / f"minibatch-{os.getpid()}.pt"
    torch.save(_record, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)  # a reader never sees half a file


_current_statistics = gmts_loss.current_statistics
_prepare = gmts_loss.GMTSPolicyLoss.prepare_mini_batch
_call = gmts_loss.GMTSPolicyLoss.__call__


def current_statistics(engine: Any, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs, entropy = _current_statistics(engine, data)
    if "score_inputs" not in _record:
        _record["pending"] = {"logprobs": logprobs.cpu().clone(), "entropy": entropy.cpu().clone()}
    return logprobs, entropy


def prepare_mini_batch(self: Any, engine: Any, data: Any) -> Any:
    data = _prepare(self, engine, data)
    if "score_inputs" not in _record:
        _record["score_inputs"] = {**_record.pop("pending", {}), **_fields(data)}
        _record["settings"] = self.settings.to_dict()
        _record["loss_mode"] = str(self.config.policy_loss.loss_mode)  # the worker's own
        _record["num_selected"] = tu.get_non_tensor_data(data, gmts_loss.NUM_SELECTED_KEY, None)
        _record["micro"] = []
        _record["recording"] = True
    else:
        _record["recording"] = False  # only the first mini-batch
    return data


def call(self: Any, model_output: Any, data: Any, dp_group: Any = None) -> Any:
    loss, metrics = _call(self, model_output, data, dp_group)
    if _record.get("recording") and torch.is_grad_enabled():
        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        _record["micro"].append(
            {
                **_fields(data),
                "log_prob": log_prob.detach().float().cpu().clone(),
                "loss": float(loss.detach()),
                "batch_num_tokens": data["batch_num_tokens"],
                "dp_size": data["dp_size"],
                "selected_fraction": metrics.get("gmts/selected_fraction"),
            }
        )
        _save()
    return loss, metrics


if DUMP_DIR:
    gmts_loss.current_statistics = current_statistics
    gmts_loss.GMTSPolicyLoss.prepare_mini_batch = prepare_mini_batch
    gmts_loss.GMTSPolicyLoss.__call__ = call
