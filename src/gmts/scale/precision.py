"""Mixed precision as the training engines do it: bf16 compute over float32 master weights.

``model.dtype: bfloat16`` means: the policy's parameters (the master weights), their gradients
and the AdamW state stay float32; forward and backward passes run in bf16; log-probs and
entropies are reduced in float32 (:mod:`gmts.core.logprobs`). ``float32`` runs everything in
float32 (no casts at all, so results are bitwise those of a plain float32 model).

Why: at the paper's learning rates (1e-6) an Adam update of a typical weight (~0.02) is far
below half a bf16 ulp (~6e-5 at 0.02), so bf16 parameters round the update away. verl keeps
float32 master weights under FSDP mixed precision, TRL autocasts over float32 parameters.

How the cast happens depends on the distributed strategy (:mod:`gmts.scale.strategy`):
``replicate`` runs each pass under :meth:`Precision.autocast` (float32 parameters, bf16
matmuls, autocast's per-region weight-cast cache), ``fsdp`` hands :meth:`Precision.fsdp_policy`
to ``fully_shard`` (parameters all-gathered in bf16, gradients reduced in float32).

The rule is per parameter: what trains is float32 (its updates must survive rounding), what
never trains lives in the compute dtype (:attr:`Precision.frozen`). Full fine-tuning trains
every parameter; its KL reference is a frozen copy in the compute dtype. With LoRA
(``model.lora``, :mod:`gmts.models.lora`) only the adapters train: they are the float32 masters
(with their gradients and AdamW state), the base is frozen in the compute dtype (2 bytes per
parameter under bf16), and the same strategy code casts them: autocast casts the float32
adapters, FSDP's policy gathers base and adapters in bf16 and reduces the adapters' gradients
in float32.

On a CPU ``bfloat16`` is honoured the same way (``torch.autocast("cpu")`` over float32
masters, the sampler in one bf16 cast), but it pays only where the CPU computes in bf16
(AVX512-BF16 or AMX-BF16 on x86: 0.59x the float32 time of a SmolLM2 forward + backward on an
AMD EPYC with AVX512-BF16, issue 34); elsewhere (AVX2) torch emulates bf16 and runs about 4x
slower than float32 (docs/results.md section 8).

``model.dtype: auto`` takes bf16 where it pays and float32 elsewhere
(:mod:`gmts.scale.auto_dtype`: the CPU's flags, the kernels torch and oneDNN run, which
``ATEN_CPU_CAPABILITY`` / ``ONEDNN_MAX_CPU_ISA`` can lower; on CUDA the GPU's bf16 support);
the trainer prints the choice and what it read in its first lines and records it in the run
folder. The default stays ``float32`` on every device: a seed then gives the same numbers on
every machine that runs the same kernels (the demo's, the tests' and every committed figure are
float32 results), while ``auto`` gives other numbers on a bf16 machine than on an AVX2 one.

Serving: checkpoints hold the float32 master weights (a LoRA run's: its adapters);
:func:`export_model` writes a bf16 Hugging Face folder (``gmts export``), merging a LoRA run's
adapters into its base.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``model.dtype`` names -> compute dtypes."""


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run.

    Attributes:
        compute: dtype of the forward/backward matmuls (float32 or bfloat16).
        master: dtype of the trainable parameters, their gradients and the optimizer state
            (always float32).
    """

    compute: torch.dtype = torch.float32
    master: torch.dtype = torch.float32

    @classmethod
    def from_name(cls, name: str) -> Precision:
        """``model.dtype`` -> Precision; an unknown name lists the valid ones."""
        if name not in DTYPES:
            raise ValueError(f"model.dtype: expected one of {list(DTYPES)}, got {name!r}")
        return cls(compute=DTYPES[name])

    @property
    def mixed(self) -> bool:
        """True when the compute dtype differs from the master dtype."""
        return self.compute != self.master

    @property
    def frozen(self) -> torch.dtype:
        """dtype of parameters that never train (a LoRA run's base, the KL reference model):
        the compute dtype, since no update has to survive its rounding."""
        return self.compute

    @property
    def compute_bytes(self) -> int:
        """Bytes of one element in the compute dtype."""
        return torch.empty((), dtype=self.compute).element_size()

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """A region whose matmuls run in the compute dtype (no-op when not mixed).

        Weight casts are cached for the whole region (autocast caches casts of leaf tensors
        that require grad), so wrap a whole forward + backward, or a whole sampling loop, in one
        region rather than each call.
        """
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=self.compute)

    def fsdp_policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy``: parameters gathered in the compute dtype, gradients
        reduced in float32 (an all-float32 policy when not mixed)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if not self.mixed:
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=self.compute, reduce_dtype=torch.float32)


def export_model(source: str | Path, out: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the model of ``source`` (a model folder, checkpoint or run; see
    :func:`gmts.models.loading.resolve_model_path`) as a Hugging Face folder in ``dtype``.

    The training checkpoints keep float32 master weights (4 bytes per parameter); a bf16 copy
    is what a server (vLLM, ``gmts eval``) needs. A LoRA run's checkpoint (adapters only) is
    written as its base with the adapters merged in (``W + scaling * B A`` in float32, rounded
    once to ``dtype``; :func:`gmts.models.loading.load_model`). The tokenizer is copied along.
    The folder is written to ``<out>.tmp`` and renamed, so ``out`` is either complete or
    absent.
    """
    import os
    import shutil

    from gmts.models.loading import load_model, load_tokenizer, resolve_model_path

    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {list(DTYPES)}, got {dtype!r}")
    path = resolve_model_path(source)
    out = Path(out)
    if out.exists():
        raise ValueError(f"{out} already exists; choose a new folder")
    staging = out.with_name(out.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model = load_model(path, dtype=DTYPES[dtype], training=False)
    model.save_pretrained(staging, safe_serialization=True)
    load_tokenizer(path, pad_token=False).save_pretrained(staging)  # as it is
    os.replace(staging, out)
    return out
