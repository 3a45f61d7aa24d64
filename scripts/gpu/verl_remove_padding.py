"""GMTS on verl's own actor engine with ``use_remove_padding`` on and off: the same tokens.

    python scripts/gpu/verl_remove_padding.py --out /tmp/rmpad.pt                 # CPU (CI's test)
    python scripts/gpu/verl_remove_padding.py --device cuda --out /tmp/rmpad.pt   # one CUDA GPU
    python scripts/gpu/verl_remove_padding.py --device cuda --attn flash_attention_2 \\
        --compute bfloat16 --out /tmp/rmpad-fa2.pt    # verl's GPU default: report, no check

verl 0.9.1's FSDP actor engine (``FSDPEngineWithLMHead``, built by ``EngineRegistry.new`` as
``TrainingWorker`` builds it, FSDP2 on one rank) runs the plugin's actor update
(``GMTSPolicyLoss`` through the plugin's ``BaseEngine.train_batch`` hook: the exact no-grad pass,
the selection on the mini-batch, the loss per micro-batch, backward) twice on the same actor
mini-batch: once with ``use_remove_padding=False`` (verl pads each micro-batch to its longest
row and passes an attention mask) and once with ``True`` (verl packs the micro-batch's rows into
one row of ``total_nnz`` tokens, ``attention_mask=None``, positions restarting at each row;
transformers' sdpa/eager masks then keep the rows apart, flash-attention runs its varlen kernel
through verl's monkey patch). Both start from the same weights (learning rate 0, so every case
sees them) and the same mini-batch, for each trainer layout (V1 nested, legacy padded) with fixed
and dynamic micro-batch sizes.

Recorded per case and path (``--out``, ``torch.save``): the model calls (input shape, whether an
attention mask was passed), the exact pass's current log-probs and entropies ``(B, R)``, the
mini-batch's ``gmts_selected`` ``(B, R)``, each micro-batch's loss, the gradient norm, every
parameter's gradient; and once, a reference: each answer alone through plain transformers
(batch 1, no padding) in float32. ``tests/integrations/test_verl_remove_padding_on_cpu.py`` runs
this on the CPU (the scaffolding of ``tests/integrations/verl_cpu/``: a "cpu" platform) and
checks the records. ``--check`` makes this script check them itself (exit 1 on a mismatch):
the same rows and selection, log-probs within ``--logprob-atol`` of each other and (float32
compute only) of the reference. A control case, packed rows whose positions do not restart,
is printed too (it must DIFFER; it does not count for ``--check``).

Not run on a GPU yet: none was available. On a GPU it needs a python with CUDA torch and verl
0.9.1 (and flash-attn for ``--attn flash_attention_2``). flash-attention has no float32 kernel,
so ``flash_attention_2`` runs in bf16, where the two paths' log-probs may differ by bf16
rounding and a token near the selection threshold may change sides: run it without
``--check`` and read the agreement it prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "integrations"))  # verl_batches
sys.path.insert(0, str(REPO / "tests" / "integrations" / "verl_cpu"))  # scaffold, the platform

RATIO = 0.3
LAYOUTS = ("v1", "legacy")
# micro-batching of the one mini-batch: fixed 4 rows, or dynamic sizes of <= 64 tokens a
# micro-batch (rows regrouped and reordered by length)
MICRO = {"fixed": {"use_dynamic_bsz": False}, "dynamic": {"use_dynamic_bsz": True}}
MAX_TOKEN_LEN = 64


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to torch.save the records")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--attn", choices=("sdpa", "eager", "flash_attention_2"), default="sdpa")
    parser.add_argument("--compute", choices=("float32", "bfloat16"), default="float32",
                        help="FSDP's param_dtype, which verl's forward autocasts to (verl's "
                        "default is bfloat16)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true", help="exit 1 unless the paths agree")
    parser.add_argument("--logprob-atol", type=float, default=1e-4)
    return parser.parse_args(argv)


def _platform(device: str, workdir: Path) -> None:
    """One-rank process group; on the CPU verl's platform from the test scaffolding."""
    if device == "cpu":
        os.environ["VERL_PLATFORM"] = "cpu"
        os.environ["VERL_ENGINE_DEVICE"] = "cuda"  # the FSDP engine is registered for cuda/npu
        import verl_cpu_platform  # noqa: F401  (registers the "cpu" platform)
    import torch

    if device == "cuda":
        torch.cuda.set_device(0)
    torch.distributed.init_process_group(
        "gloo" if device == "cpu" else "nccl",
        init_method=f"file://{workdir / 'process-group'}",
        rank=0,
        world_size=1,
    )


def _engine(model_dir: Path, remove_padding: bool, args: argparse.Namespace) -> Any:
    """verl's FSDP actor engine, built as ``TrainingWorker.__init__`` builds it."""
    from verl.trainer.config import CheckpointConfig
    from verl.workers.config import FSDPEngineConfig, FSDPOptimizerConfig, HFModelConfig
    from verl.workers.engine import EngineRegistry

    model_config = HFModelConfig(
        path=str(model_dir),
        use_remove_padding=remove_padding,
        override_config={"attn_implementation": args.attn},
    )
    model_config.model_type = "language_model"
    engine_config = FSDPEngineConfig(
        strategy="fsdp2",
        use_remove_padding=remove_padding,  # TrainingWorker copies the model's flag here
        use_torch_compile=False,  # verl compiles its entropy function; nothing to compare
        mixed_precision={"param_dtype": "fp32" if args.compute == "float32" else "bf16"},
    )
    engine = EngineRegistry.new(
        model_type="language_model",
        backend="fsdp2",
        model_config=model_config,
        engine_config=engine_config,
        optimizer_config=FSDPOptimizerConfig(lr=0.0),  # every case starts from the same weights
        checkpoint_config=CheckpointConfig(),
    )
    engine.initialize()
    return engine


@dataclasses.dataclass
class Reference:
    """Each answer alone through plain transformers (batch 1, no padding), float32."""

    logprobs: list  # per answer (P_i + R_i,): position j holds log p(token j + 1)
    entropy: list  # per answer (P_i + R_i,)


def _reference(model_dir: Path, answers: Any, device: str, attn: str) -> Reference:
    import torch
    from transformers import AutoModelForCausalLM

    attn = "sdpa" if attn == "flash_attention_2" else attn  # flash-attn has no float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=attn)
    model = model.to(device=device, dtype=torch.float32).eval()
    logprobs, entropy = [], []
    with torch.no_grad():
        for prompt, response in zip(answers.prompt_ids, answers.response_ids, strict=True):
            ids = torch.cat([prompt, response]).to(device)[None]  # (1, P + R)
            logits = model(input_ids=ids).logits[0].float()  # (P + R, V)
            log_softmax = torch.log_softmax(logits, dim=-1)
            next_ids = torch.roll(ids[0], -1)  # the engine's labels (the last one wraps, unused)
            logprobs.append(log_softmax.gather(-1, next_ids[:, None])[:, 0].cpu())
            entropy.append(-(log_softmax.exp() * log_softmax).sum(-1).cpu())
    return Reference(logprobs, entropy)


def _answers(seed: int, model_dir: Path, device: str, attn: str) -> tuple[Any, Reference]:
    """Groups of answers sharing a prompt, random lengths; old log-probs = the model's own plus
    a little noise (r near 1, a few clipped), reference log-probs further off (a KL term)."""
    import torch
    import verl_batches as vb

    answers = vb.make_answers(seed, groups=4, n=4, max_prompt=12, max_response=10)
    reference = _reference(model_dir, answers, device, attn)
    g = torch.Generator().manual_seed(seed + 1)
    noisy = [lp + 0.1 * torch.randn(len(lp), generator=g) for lp in reference.logprobs]
    ref = [lp + 0.3 * torch.randn(len(lp), generator=g) for lp in reference.logprobs]
    answers = dataclasses.replace(
        answers,
        old_logprobs=noisy,
        ref_logprobs=ref,
        current_logprobs=reference.logprobs,
        current_entropy=reference.entropy,
    )
    return answers, reference


def _mini_batch(layout: str, answers: Any, micro: str, row_boundaries: bool = True) -> Any:
    """The actor's one mini-batch as ``TrainingWorker.train_batch`` hands it to the engine.

    ``row_boundaries=False`` (the control that shows the checks can fail): the positions run on
    across rows instead of restarting at 0, so a packed forward no longer sees where one row
    ends (transformers finds packed rows by positions that restart).
    """
    import torch
    import verl_batches as vb
    from verl.utils import tensordict_utils as tu

    data = vb.BUILDERS[layout](answers)
    (mini,) = vb.mini_batches(data, len(answers), seed=0)
    if not row_boundaries:
        offsets = mini["position_ids"].offsets()
        continuous = torch.arange(int(offsets[-1]))  # (total_nnz,)
        mini["position_ids"] = torch.nested.nested_tensor_from_jagged(continuous, offsets)
    tu.assign_non_tensor(
        mini,
        # the V1 trainer's update extra_info (trainer_base.py, _update_actor)
        calculate_entropy=False,
        global_batch_size=len(answers),
        temperature=1.0,
        # TrainingWorker.train_batch's defaults (engine_workers.py); use_remove_padding is
        # set by _train from the engine's own config
        micro_batch_size_per_gpu=4,
        max_token_len_per_gpu=MAX_TOKEN_LEN,
        use_fused_kernels=False,
        **MICRO[micro],
    )
    return mini


def _train(engine: Any, mini: Any, loss_fn: Any) -> dict:
    """One actor update of ``mini`` through the engine, recorded."""
    from verl.utils import tensordict_utils as tu

    from gmts.integrations.verl import loss as gmts_loss

    tu.assign_non_tensor(mini, use_remove_padding=engine.engine_config.use_remove_padding)
    calls, statistics = [], {}
    forward = engine.module.forward

    def recording_forward(*args: Any, **kwargs: Any) -> Any:
        calls.append((tuple(kwargs["input_ids"].shape), kwargs.get("attention_mask") is not None))
        return forward(*args, **kwargs)

    current_statistics = gmts_loss.current_statistics

    def recording_statistics(engine_: Any, data: Any) -> tuple:
        logprobs, entropy = current_statistics(engine_, data)
        statistics.update(logprobs=logprobs.detach().cpu(), entropy=entropy.detach().cpu())
        return logprobs, entropy

    engine.module.forward = recording_forward
    gmts_loss.current_statistics = recording_statistics
    try:
        with engine.train_mode():
            output = engine.train_batch(mini, loss_function=loss_fn)
            grads = {
                name: param.grad.full_tensor().detach().float().cpu().clone()
                for name, param in engine.module.named_parameters()
            }
    finally:
        engine.module.forward = forward
        gmts_loss.current_statistics = current_statistics
    fields = gmts_loss.padded_response_fields(mini, ["response_mask", gmts_loss.SELECTED_KEY])
    metrics = output["metrics"]
    return {
        "calls": calls,
        "row_id": mini["row_id"].cpu().clone(),
        "response_mask": fields["response_mask"].bool().cpu(),
        "selected": fields[gmts_loss.SELECTED_KEY].bool().cpu(),
        "num_selected": tu.get_non_tensor_data(mini, gmts_loss.NUM_SELECTED_KEY, None),
        "logprobs": statistics["logprobs"],
        "entropy": statistics["entropy"],
        "losses": list(output["loss"]),
        "grad_norm": float(metrics["grad_norm"]),
        "selected_fraction": [float(v) for v in metrics["gmts/selected_fraction"]],
        "grads": grads,
    }


def run(args: argparse.Namespace) -> dict:
    """Every case on both paths; the records."""
    import scaffold
    import torch
    import verl_batches as vb

    torch.manual_seed(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="gmts-verl-rmpad-"))
    _platform(args.device, workdir)
    from verl.workers.engine import base as engine_base

    from gmts.core import SelectionConfig
    from gmts.integrations.verl import plugin
    from gmts.integrations.verl.loss import GMTSPolicyLoss
    from gmts.integrations.verl.settings import GMTSVerlSettings

    plugin.patch_base_engine(engine_base)  # what the verl.plugins entry point does in a worker
    folder = scaffold.prepare(workdir / "run")
    answers, reference = _answers(args.seed, folder / "model", args.device, args.attn)
    config = vb.actor_config(strategy="fsdp2", ppo_micro_batch_size_per_gpu=4, rollout_n=4)
    settings = GMTSVerlSettings(
        selection=SelectionConfig(score="gmts", ratio=RATIO, kl_tokens="selected")
    )
    engines = {rmpad: _engine(folder / "model", rmpad, args) for rmpad in (False, True)}
    cases = {}
    for layout in LAYOUTS:
        for micro in MICRO:
            cases[(layout, micro)] = {
                rmpad: _train(engine, _mini_batch(layout, answers, micro),
                              GMTSPolicyLoss(config, settings))
                for rmpad, engine in engines.items()
            }  # fmt: skip
    # the control: packed rows whose positions do not restart (the checks must catch it)
    broken = _train(engines[True], _mini_batch("v1", answers, "fixed", row_boundaries=False),
                    GMTSPolicyLoss(config, settings))  # fmt: skip
    torch.distributed.destroy_process_group()
    return {
        "args": {k: str(v) for k, v in vars(args).items()},
        "ratio": RATIO,
        "answers": {
            "prompt_ids": answers.prompt_ids,
            "response_ids": answers.response_ids,
        },
        "reference": dataclasses.asdict(reference),
        "cases": cases,
        "broken": broken,
    }


def padded_reference(records: dict, row_id: Any, key: str = "logprobs") -> Any:
    """The reference's ``key`` of the rows ``row_id`` (in that order) as ``(B, R)``, R the
    longest response: position t of row b = the value for response token t."""
    import torch

    prompts, responses = records["answers"]["prompt_ids"], records["answers"]["response_ids"]
    values = records["reference"][key]
    width = max(len(responses[int(i)]) for i in row_id)
    out = torch.zeros(len(row_id), width)
    for b, i in enumerate(int(i) for i in row_id):
        start, length = len(prompts[i]) - 1, len(responses[i])  # log p(response token t)
        out[b, :length] = values[i][start : start + length]
    return out


def compare(records: dict, padded: dict, packed: dict) -> dict:
    """How far two recorded updates of the same mini-batch are apart, and from the reference."""
    import torch

    mask = padded["response_mask"]
    want = padded_reference(records, padded["row_id"])
    return {
        "same_rows": bool(torch.equal(padded["row_id"], packed["row_id"])),
        "same_selection": bool(torch.equal(padded["selected"], packed["selected"])),
        "in_common": int((padded["selected"] & packed["selected"]).sum()),
        "k": int(padded["selected"].sum()),
        "logprob_gap": float((padded["logprobs"] - packed["logprobs"])[mask].abs().max()),
        "reference_gap": max(
            float((path["logprobs"] - want)[mask].abs().max()) for path in (padded, packed)
        ),
        "loss_gap": max(
            abs(a - b) for a, b in zip(padded["losses"], packed["losses"], strict=True)
        ),
    }


def summary(records: dict) -> tuple[list[str], bool]:
    """One line per case and whether every case agrees: the same rows and selection, log-probs
    within ``--logprob-atol`` of each other (and, in float32, of the float32 reference)."""
    atol = float(records["args"]["logprob_atol"])
    float32 = records["args"]["compute"] == "float32"
    lines, ok = [], True
    named = [
        (f"{layout:6s} {micro:7s}", paths) for (layout, micro), paths in records["cases"].items()
    ]
    named.append(
        (
            "control: packed, no row boundaries",
            {False: records["cases"][("v1", "fixed")][False], True: records["broken"]},
        )
    )
    for name, paths in named:
        padded, packed = paths[False], paths[True]
        c = compare(records, padded, packed)
        agrees = c["same_rows"] and c["same_selection"] and c["logprob_gap"] <= atol
        agrees = agrees and (c["reference_gap"] <= atol or not float32)
        if not name.startswith("control"):
            ok = ok and agrees
        lines.append(
            f"{name}: selected {c['in_common']}/{c['k']} in common, max |dlogp| padded-packed "
            f"{c['logprob_gap']:.2e}, vs the reference {c['reference_gap']:.2e}, max |dloss| "
            f"{c['loss_gap']:.2e}, grad norm {padded['grad_norm']:.6g} / "
            f"{packed['grad_norm']:.6g}: {'agree' if agrees else 'DIFFER'}"
        )
    calls = records["cases"][("v1", "fixed")]
    lines.append(f"model calls (input_ids shape, attention mask?): padded {calls[False]['calls']}")
    lines.append(f"  packed {calls[True]['calls']}")
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    import torch

    torch.set_num_threads(min(torch.get_num_threads(), 4) if args.device == "cpu" else 8)
    records = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(records, args.out)
    lines, ok = summary(records)
    print("\n".join(lines))
    print(f"records in {args.out}")
    return 1 if args.check and not ok else 0


if __name__ == "__main__":
    sys.exit(main())
