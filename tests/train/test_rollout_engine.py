"""rollout.engine without a GPU or vLLM (runs in .venv): the config section and its errors, the
checks made before any model loads, the hf engine, the training wrapper's weight sync and
sleep around a sampler that holds its own weights (the vllm sampler on a fake engine), the
records that carry the engine's log-probs, the log-prob gap metric against a plain loop, and
the memory plan's engine parts. The real engine's tests are in tests/vllm (they run in
.venv-vllm)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
import torch

from gmts.train.config import load_config

from file_modules import load_module

HERE = Path(__file__).resolve().parent
_tiny = load_module(HERE / "_tiny.py", "_tiny")


def test_engine_section_defaults_and_overrides(tmp_path):
    cfg = load_config(None, [])
    assert cfg.rollout.engine == "hf" and cfg.rollout.vllm.tensor_parallel_size == 1
    cfg = load_config(
        None,
        [
            "rollout.engine=vllm",
            "rollout.vllm.gpu_memory_utilization=0.3",
            "rollout.vllm.kv_cache_gib=2",
            "rollout.vllm.sleep_level=1",
            "rollout.vllm.engine_kwargs={block_size: 32}",
        ],
    )
    v = cfg.rollout.vllm
    assert (v.gpu_memory_utilization, v.kv_cache_gib, v.sleep_level) == (0.3, 2.0, 1)
    assert v.engine_kwargs == {"block_size": 32}
    from gmts.configuration import read_yaml
    from gmts.train.config import dump_yaml

    saved = tmp_path / "config.yaml"  # a run's config.yaml reads back to the same settings
    saved.write_text(dump_yaml(cfg))
    assert load_config(saved).rollout == cfg.rollout
    assert read_yaml(saved)["rollout"]["vllm"]["engine_kwargs"] == {"block_size": 32}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("rollout.engine=sglang", "rollout.engine: expected one of \\['hf', 'vllm'\\]"),
        ("rollout.vllm.gpu_memory_utilization=1.5", "rollout.vllm: gpu_memory_utilization must"),
        ("rollout.vllm.kv_cache_gib=0", "rollout.vllm: kv_cache_gib must be > 0"),
        ("rollout.vllm.max_num_seqs=0", "rollout.vllm: max_num_seqs must be >= 1"),
        ("rollout.vllm.sleep_level=3", "rollout.vllm.sleep_level: expected one of \\[1, 2\\]"),
        ("rollout.vllm.sleep_mode=maybe", "rollout.vllm.sleep_mode: expected bool \\| 'auto'"),
        ("rollout.vllm.enforce_eager=1", "rollout.vllm.enforce_eager: expected bool \\| 'auto'"),
        ("rollout.vllm.dtype=int8", "rollout.vllm.dtype: expected one of"),
        ("rollout.vllm.tensor_parallel_size=2", "rollout.vllm: tensor_parallel_size must be 1"),
        ("rollout.vllm.engine_kwargs={enforce_eager: true}", "engine_kwargs must not set"),
        ("rollout.vllm.engine_kwargs=[1]", "engine_kwargs must be a mapping"),
        ("rollout.vllm.nope=1", "unknown config key 'rollout.vllm.nope'"),
    ],
)
def test_bad_engine_settings_name_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(None, [override])


def _trainer_must_not_load(monkeypatch, cfg):
    """Build a Trainer whose every model load or warm start fails the test."""
    import gmts.train.policy as policy_module
    import gmts.train.trainer as trainer_module

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the error")

    monkeypatch.setattr(policy_module, "load_policy", no_load)  # the weights
    monkeypatch.setattr(policy_module, "resolve_model_path", no_load)  # model.path
    return trainer_module.Trainer(cfg)


def test_vllm_missing_errors_before_loading(monkeypatch, tmp_path):
    import gmts.sampling.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    cfg = _tiny.small_config(tmp_path / "m", tmp_path / "run", "rollout.engine=vllm")
    with pytest.raises(ValueError, match="needs the vllm package.*setup.sh vllm"):
        _trainer_must_not_load(monkeypatch, cfg)


def test_sleep_mode_on_a_cpu_errors_before_loading(monkeypatch, tmp_path):
    import gmts.sampling.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    cfg = _tiny.small_config(
        tmp_path / "m",
        tmp_path / "run",
        "rollout.engine=vllm",
        "rollout.vllm.sleep_mode=true",
        "model.device=cpu",
    )
    with pytest.raises(ValueError, match="rollout.vllm.sleep_mode=true: vLLM's sleep mode needs"):
        _trainer_must_not_load(monkeypatch, cfg)


def test_multiprocess_engine_errors_before_loading(monkeypatch, tmp_path):
    import gmts.sampling.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: True)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    cfg = _tiny.small_config(tmp_path / "m", tmp_path / "run", "rollout.engine=vllm")
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1"):
        _trainer_must_not_load(monkeypatch, cfg)


def test_sleep_and_eager_resolve_by_machine():
    from gmts.sampling.vllm_engine import VLLMConfig

    auto = VLLMConfig()
    assert auto.sleeps(on_gpu=True) and not auto.sleeps(on_gpu=False)
    assert auto.eager(on_gpu=False) and not auto.eager(on_gpu=True)
    assert not VLLMConfig(sleep_mode=False).sleeps(on_gpu=True)
    assert VLLMConfig(sleep_mode=True).sleeps(on_gpu=True)
    with pytest.raises(ValueError, match="sleep_mode=true: vLLM's sleep mode needs a GPU"):
        VLLMConfig(sleep_mode=True).sleeps(on_gpu=False)
    assert VLLMConfig(enforce_eager=False).eager(on_gpu=False) is False


def test_request_seeds_are_distinct_and_stable():
    from gmts.sampling.vllm_engine import request_seeds

    a = request_seeds(7, 64)
    assert a == request_seeds(7, 64) and a[:10] == request_seeds(7, 10)
    b = request_seeds(8, 64)
    assert len(set(a) | set(b)) == 128  # seed + i would share 63 of them
    assert all(0 <= s < 2**63 for s in a)


def _roll(folder: Path, seed: int = 0):
    """(model, tokenizer, 3 addition problems, their rollout: 2 answers each, 6 tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts.embedded.tasks import get_task
    from gmts.sampling.rollout import generate_rollouts

    model_dir = _tiny.save_tiny_model(folder / "model")

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    problems = get_task("addition").sample(3, random.Random(seed))
    return (
        model,
        tokenizer,
        problems,
        generate_rollouts(model, tokenizer, problems, num_samples=2, max_new_tokens=6, seed=seed),
    )


def _engine(model, tokenizer, *overrides: str):
    """The trainer's rollout engine of ``overrides`` around ``model`` (replicated, on the CPU)."""
    from gmts.scale.distributed import DistInfo
    from gmts.scale.precision import Precision
    from gmts.scale.strategy import make_strategy
    from gmts.train.rollout_engine import EngineInputs, make_engine

    return make_engine(
        EngineInputs(
            cfg=load_config(None, list(overrides)),
            model=model,
            tokenizer=tokenizer,
            strategy=make_strategy("replicate", DistInfo(), Precision(), torch.device("cpu")),
            info=DistInfo(),
            device=torch.device("cpu"),
            model_path="unused",
            model_config=model.config,
            prompt_tokens=8,
            max_new_tokens=6,
        )
    )


def test_hf_engine_is_the_kv_cached_sampler(tmp_path):
    from gmts.sampling.rollout import generate_rollouts, resolve_stop_ids
    from gmts.sampling.sampler import Sampler

    model, tokenizer, problems, _ = _roll(tmp_path)
    reference = generate_rollouts(
        model, tokenizer, problems, num_samples=2, max_new_tokens=6, seed=0, batch_size=2
    )
    engine = _engine(model, tokenizer, "rollout.generation_batch_size=2")
    assert isinstance(engine, Sampler) and engine.name == "hf" and engine.metrics() == {}
    assert engine.stop_token_ids == resolve_stop_ids(tokenizer, model.generation_config)
    with engine.session():
        roll = engine.sample(problems, num_samples=2, max_new_tokens=6, temperature=1.0, seed=0)
    assert roll.completions == reference.completions  # rollout.generation_batch_size rows at once
    assert torch.equal(roll.response_ids, reference.response_ids)
    assert roll.engine_logprobs is None


class _FakeVLLMEngine:
    """:class:`gmts.sampling.vllm_engine.VLLMEngine`'s bookkeeping without vLLM, as on a GPU (sleep
    mode unless ``sleep_mode=false``): what sleeps, and every call in order (``events``)."""

    def __init__(self, model_path, config, *, dtype, seed, on_gpu, **kwargs) -> None:
        self.config = config
        self.sleeps = config.sleep_mode is not False
        self.asleep: set[str] = set()
        self.events: list[str] = []
        self.loaded: dict[str, torch.dtype] = {}
        self.torch_dtype = torch.bfloat16
        self.generation_config = None
        self.started = (str(model_path), kwargs["kv_cache_bytes"])

    def sleep(self) -> None:
        if self.sleeps and not self.asleep:
            self.asleep = {"weights", "kv_cache"}
            self.events.append("sleep")

    def wake_up(self, tags=None) -> None:
        parts = self.asleep & set(tags or self.asleep)
        if parts:
            self.events.append("wake " + "+".join(sorted(parts)))
            self.asleep -= parts

    def load_weights(self, weights) -> None:
        assert "weights" not in self.asleep  # as the real engine refuses
        self.loaded = {name: tensor.dtype for name, tensor in weights}
        self.events.append("load")

    def sample_rollouts(self, tokenizer, problems, **kw):
        assert not self.asleep and kw["stop_token_ids"] == [tokenizer.eos_token_id]
        self.events.append("sample")
        return "rollout"


SYNC = ["wake weights", "load"]  # the weights wake alone, the KV cache sleeps on
ROUND = ["wake kv_cache", "sample", "sleep"]


@pytest.mark.parametrize(
    ("overrides", "start", "first", "later"),
    [
        # level 2 drops the weights it started with: every session sends them
        (["rollout.vllm.sleep_level=2"], ["sleep"], SYNC + ROUND, SYNC + ROUND),
        # level 1 keeps them aside: the first session has them
        (["rollout.vllm.sleep_level=1"], ["sleep"], ["wake kv_cache+weights", "sample", "sleep"],
         SYNC + ROUND),
        # no sleep mode: nothing sleeps, the weights are sent after every update
        (["rollout.vllm.sleep_mode=false"], [], ["sample"], ["load", "sample"]),
    ],
)  # fmt: skip
def test_the_engine_syncs_and_sleeps_a_sampler_with_its_own_weights(
    tmp_path, monkeypatch, overrides, start, first, later
):
    """The vllm sampler (a fake engine under it) in the training wrapper: the calls the former
    vllm rollout engine made, in its order; the policy's weights sent whole, cast to the
    engine's dtype (a tied weight under each of its names); ``time/weight_sync_s`` set when
    they were sent."""
    import gmts.sampling.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "VLLMEngine", _FakeVLLMEngine)
    model, tokenizer, problems, _ = _roll(tmp_path)
    engine = _engine(model, tokenizer, "rollout.engine=vllm", *overrides)
    fake = engine.sampler.engine
    assert fake.started[0] == "unused" and fake.started[1] > 0  # a CPU run sizes the KV cache
    assert fake.events == start
    kw = dict(num_samples=2, max_new_tokens=6, temperature=1.0, seed=0)
    for expected in (first, later):
        fake.events.clear()
        with engine.session():
            assert engine.sample(problems, **kw) == "rollout"
        assert fake.events == expected
        assert (engine.metrics()["time/weight_sync_s"] > 0) == ("load" in expected)
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]  # tied: both names
    assert fake.loaded == dict.fromkeys(names, torch.bfloat16)


def test_engine_logprobs_travel_with_the_rows(tmp_path):
    """Rollout.select / concat / to and TrainBatch keep ``engine_logprobs`` aligned with the
    response tokens (padding 0)."""
    from gmts.sampling.rollout import Rollout
    from gmts.train.batch import TrainBatch

    *_, roll = _roll(tmp_path, 1)
    marked = roll.response_ids.float() * 0.01 - 1.0  # a value per token, recognisable
    roll = dataclasses.replace(roll, engine_logprobs=marked.masked_fill(~roll.response_mask, 0))
    picked = roll.select(torch.tensor([2, 3]))
    assert torch.equal(
        picked.engine_logprobs, roll.engine_logprobs[2:4, : picked.response_ids.shape[1]]
    )
    both = Rollout.concat([picked, roll.select(torch.tensor([0, 1]))])
    expect = both.response_ids.float() * 0.01 - 1.0
    assert torch.equal(both.engine_logprobs, expect.masked_fill(~both.response_mask, 0))
    batch = TrainBatch.from_rollout(both.to("cpu"), torch.zeros(4), torch.zeros(4))
    assert torch.equal(batch.rows(slice(1, 3)).engine_logprobs, both.engine_logprobs[1:3])
    from gmts.core.logprobs import TokenStatistics

    stats = TokenStatistics(torch.zeros_like(expect), torch.zeros_like(expect))
    assert torch.equal(batch.scored(stats, None).engine_logprobs, both.engine_logprobs)
    with pytest.raises(ValueError, match="engine_logprobs has shape"):
        dataclasses.replace(roll, engine_logprobs=torch.zeros(1, 1))
    with pytest.raises(ValueError, match="all have engine_logprobs"):
        Rollout.concat([picked, dataclasses.replace(picked, engine_logprobs=None)])


def test_logprob_gap_metrics_match_a_plain_loop():
    from gmts.core.logprobs import TokenStatistics
    from gmts.scale.distributed import DistInfo
    from gmts.train.batch import TrainBatch
    from gmts.train.rollout_engine import logprob_gap_metrics

    g = torch.Generator().manual_seed(0)
    B, T = 5, 7
    lengths = torch.tensor([7, 3, 1, 5, 6])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    engine = -torch.rand(B, T, generator=g)
    trainer = engine + 0.01 * torch.randn(B, T, generator=g)
    trainer[0, 6] = engine[0, 6] + 0.5  # the largest gap, on a valid token
    trainer[1, 5] = engine[1, 5] + 9.0  # larger, but padding: must not count
    batch = TrainBatch(
        prompt_ids=torch.zeros(B, 2, dtype=torch.long),
        prompt_mask=torch.ones(B, 2, dtype=torch.bool),
        response_ids=torch.zeros(B, T, dtype=torch.long),
        response_mask=mask,
        rewards=torch.zeros(B),
        advantages=torch.zeros(B),
        group_ids=torch.arange(B),
        engine_logprobs=engine,
    ).scored(TokenStatistics(trainer, torch.zeros(B, T)), None)
    gaps = [
        abs(float(trainer[b, t]) - float(engine[b, t]))
        for b in range(B)
        for t in range(T)
        if t < int(lengths[b])
    ]
    out = logprob_gap_metrics(batch, DistInfo())
    assert out["rollout/logprob_gap_max"] == pytest.approx(max(gaps), rel=1e-6)
    assert out["rollout/logprob_gap_mean"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-6)
    no_engine = dataclasses.replace(batch, engine_logprobs=None)
    assert logprob_gap_metrics(no_engine, DistInfo()) == {}


def test_memory_plan_counts_the_engine():
    """The engine's weights copy and KV cache replace the sampling copy in the rollout; they
    stay in every phase unless the engine sleeps; a known GPU size gives vLLM its fraction."""
    from gmts.scale.known_models import model_config
    from gmts.scale.memory_plan import GIB, PlanSettings, engine_kv_cache_bytes, plan_memory
    from gmts.scale.model_cost import ModelShape

    config, _ = model_config("Qwen/Qwen2.5-Math-1.5B")
    shape = ModelShape.from_config(config)

    def plan(*overrides, gpu=True, device_bytes=None):
        cfg = load_config(None, ["model.dtype=bfloat16", "distributed.strategy=fsdp", *overrides])
        settings = PlanSettings.from_config(
            cfg,
            world_size=1,
            prompt_length=1024,
            response_length=3072,
            gpu=gpu,
            device_bytes=device_bytes,
        )
        return settings, plan_memory(config, settings)

    _, hf = plan()
    settings, asleep = plan("rollout.engine=vllm", "rollout.vllm.max_num_seqs=64")
    rollout = asleep.phases["rollout"]
    assert "sampling copy" in hf.phases["rollout"] and "sampling copy" not in rollout
    assert rollout["engine weights"] == shape.params * 2  # bf16 copy
    kv = 64 * 4096 * 2 * shape.layers * shape.kv_heads * shape.head_dim * 2
    assert rollout["engine KV cache"] == engine_kv_cache_bytes(shape, settings) == kv
    assert all("vllm engine" not in asleep.phases[p] for p in ("scoring", "update", "step"))
    _, awake = plan("rollout.engine=vllm", "rollout.vllm.sleep_mode=false")
    engine = awake.phases["rollout"]["engine weights"] + awake.phases["rollout"]["engine KV cache"]
    for phase in ("scoring", "update", "step"):
        assert awake.phases[phase]["vllm engine"] == engine
        assert awake.total(phase) == pytest.approx(hf.total(phase) + engine)
    _, sized = plan("rollout.engine=vllm", device_bytes=80 * GIB)
    parts = sized.phases["rollout"]
    assert parts["engine weights"] + parts["engine KV cache"] == pytest.approx(0.5 * 80 * GIB)
    _, fixed = plan("rollout.engine=vllm", "rollout.vllm.kv_cache_gib=3", device_bytes=80 * GIB)
    assert fixed.phases["rollout"]["engine KV cache"] == 3 * GIB
    _, fp32 = plan("rollout.engine=vllm", "rollout.vllm.dtype=float32")
    assert fp32.phases["rollout"]["engine weights"] == shape.params * 4
