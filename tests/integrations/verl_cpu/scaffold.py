"""Test scaffolding for running verl 0.9.1's real trainer on CPU: a tiny model, data, reward.

:func:`prepare` writes into one folder everything a verl run needs and nothing from a hub:

- ``model/``: a randomly initialised 2-layer Qwen2 (hidden 64) with a byte-level BPE tokenizer
  without merges (every byte one token, so Qwen's newline is one token, as verl's agent loop
  checks) and a ChatML template;
- ``train.parquet`` / ``test.parquet``: arithmetic questions of different lengths in verl's
  RL dataset format (``prompt`` messages, ``data_source``, ``reward_model.ground_truth``);
- ``reward.py``: a ``compute_score`` fixed by the answer text (a checksum in [0, 1]), so a
  random policy gets non-zero advantages.

:func:`command` returns the launcher command line (``python -m gmts.integrations.verl`` wrapping
``verl.trainer.main_ppo``) with the CPU overrides, and :func:`environment` its environment
(``VERL_USE_EXTERNAL_MODULES`` loads the platform, the rollout and the recorder in every
process; Ray stays on 127.0.0.1). Not product code.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODULES = "verl_cpu_platform,verl_cpu_hf_rollout,verl_cpu_gmts_dump"

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """A number in [0, 1] fixed by the answer's text: two different answers to one question
    almost always score differently, so a random policy gets non-zero GRPO advantages."""
    text = solution_str or ""
    return (sum(ord(c) * (i + 1) for i, c in enumerate(text)) % 101) / 100
'''


def _tokenizer(folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 byte symbols
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return tokenizer


TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def _model(folder: Path, tokenizer, shape: dict | None = None) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    eos, pad = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen2Config(
        # the tokenizer's ids only: a random model must never sample an id it cannot decode
        **{"vocab_size": len(tokenizer), **(shape or TINY)},
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    GenerationConfig(eos_token_id=eos, pad_token_id=pad).save_pretrained(folder)


def _data(folder: Path, rows: int) -> None:
    import pandas as pd

    records = []
    for i in range(rows):
        a, b = 3 + 7 * i, 11 * (i + 1) ** 2  # operands of different lengths
        question = f"What is {a} + {b}?" + " Think." * (i % 3)
        records.append(
            {
                "data_source": "gmts_cpu_arithmetic",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                "extra_info": {"index": i, "split": "train"},
            }
        )
    frame = pd.DataFrame(records)
    frame.to_parquet(folder / "train.parquet")
    frame.to_parquet(folder / "test.parquet")


def prepare(folder: Path, rows: int = 16, shape: dict | None = None) -> Path:
    """Write model/, train.parquet, test.parquet and reward.py into ``folder``.

    ``shape``: Qwen2 configuration fields of the random model (default :data:`TINY`).
    """
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / "model"
    model.mkdir(exist_ok=True)
    _model(model, _tokenizer(model), shape)
    _data(folder, rows)
    (folder / "reward.py").write_text(REWARD)
    (folder / "dump").mkdir(exist_ok=True)
    return folder


def command(folder: Path, *, use_v1: bool, steps: int = 2, extra: list[str] = ()) -> list[str]:
    """The launcher's command line with the overrides that run verl 0.9.1 on one CPU.

    An override of ``extra`` replaces the default one of the same key (Hydra refuses a key
    given twice)."""
    defaults = [
        "gmts.score=gmts", "gmts.ratio=0.5", "gmts.kl_tokens=selected",
        "algorithm.adv_estimator=grpo",
        f"trainer.use_v1={str(use_v1).lower()}",
        f"data.train_files={folder / 'train.parquet'}",
        f"data.val_files={folder / 'test.parquet'}",
        "data.train_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=12",
        "data.filter_overlong_prompts=false", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={folder / 'model'}",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.05",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",  # GRPO's eq. 1
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.agent.num_workers=1", "reward.num_workers=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        f"reward.custom_reward_function.path={folder / 'reward.py'}",
        "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "trainer.logger=console", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", f"trainer.total_training_steps={steps}", "trainer.total_epochs=1",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={folder / 'checkpoints'}",
        "ray_kwargs.ray_init.num_cpus=16", "+ray_kwargs.ray_init.num_gpus=1",
        "+ray_kwargs.ray_init.include_dashboard=false",
        "+ray_kwargs.ray_init._node_ip_address=127.0.0.1",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]  # fmt: skip
    replaced = {_key(item) for item in extra}
    kept = [item for item in defaults if _key(item) not in replaced]
    return [sys.executable, "-m", "gmts.integrations.verl", *kept, *extra]


def _key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` and ``a.b=2`` both set ``a.b``)."""
    return override.split("=", 1)[0].lstrip("+~")


REAL_REWARD = '''
from gmts.rewards.registry import get_reward

_MATH = get_reward("math")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """gmts's ``math`` reward: the last boxed answer, else the last number, against the answer."""
    return float(_MATH(solution_str or "", ground_truth))
'''


def prepare_real(folder: Path, questions: list[tuple[str, str]]) -> Path:
    """For a run on a real model (its path given as an override): ``train.parquet`` /
    ``test.parquet`` of ``questions`` (question, answer) in verl's RL dataset format, and
    ``reward.py`` scoring with gmts's ``math`` reward."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    records = [
        {
            "data_source": "gmts_real_arithmetic",
            "prompt": [{"role": "user", "content": question}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"index": i, "split": "train"},
        }
        for i, (question, answer) in enumerate(questions)
    ]
    frame = pd.DataFrame(records)
    frame.to_parquet(folder / "train.parquet")
    frame.to_parquet(folder / "test.parquet")
    (folder / "reward.py").write_text(REAL_REWARD)
    (folder / "dump").mkdir(exist_ok=True)
    return folder


def environment(folder: Path) -> dict[str, str]:
    """The run's environment: the scaffolding importable, verl on the CPU platform, offline."""
    src = str(Path(__file__).resolve().parents[3] / "src")
    paths = [str(HERE), src, os.environ.get("PYTHONPATH", "")]
    tag = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]  # one per run folder
    ray_tmp = Path("/tmp") / f"gmts-ray-{tag}"  # short: Ray's socket paths are limited
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
        "VERL_USE_EXTERNAL_MODULES": MODULES,
        "VERL_PLATFORM": "cpu",
        "VERL_ENGINE_DEVICE": "cuda",  # picks the FSDP engine (registered for cuda/npu only)
        "GMTS_TEST_DUMP_DIR": str(folder / "dump"),
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keeps Ray's node address on 127.0.0.1
        "RAY_TMPDIR": str(ray_tmp),
        "RAY_USAGE_STATS_ENABLED": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "WANDB_MODE": "disabled",
    }


QWEN25_MATH_15B = {  # Qwen2.5-Math-1.5B's config.json, vocabulary aside (259 byte-level ids)
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}

if __name__ == "__main__":  # python scaffold.py DIR [tiny|qwen2.5-math-1.5b]: write the inputs
    shapes = {"tiny": TINY, "qwen2.5-math-1.5b": QWEN25_MATH_15B}
    out = prepare(Path(sys.argv[1]), rows=64, shape=shapes[(sys.argv[2:] or ["tiny"])[0]])
    print(json.dumps({"folder": str(out)}))
