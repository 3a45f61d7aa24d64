"""docs/architecture.md's API block is generated from the code's own signatures, so it cannot
drift: this test renders it with ``inspect.signature`` and compares. After changing a listed
signature, regenerate the block with ``python tests/docs/test_architecture_api.py``.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
START, END = "<!-- api:start -->", "<!-- api:end -->"

# module -> the public names whose signatures are the contracts between the layers
API: dict[str, tuple[str, ...]] = {
    "gmts.core.logprobs": (
        "token_logprobs_and_entropy",
        "token_logprobs_and_entropy_from_hidden",
        "token_statistics",
        "token_statistics_from_hidden",
        "TokenStatistics",
    ),
    "gmts.core.objectives": (
        "ObjectiveConfig",
        "ObjectiveConfig.preset",
        "Objective",
        "register_objective",
        "ObjectiveInputs.of",
        "objective_terms",
        "gradient_coefficient",
        "loss_omega",
        "TokenObjective",
        "KLEstimator",
        "register_kl_estimator",
    ),
    "gmts.core.loss": (
        "LossConfig",
        "LossConfig.of",
        "LossConfig.aggregation",
        "LossConfig.denominators",
        "LossDenominators",
        "TokenSums.count",
        "TokenSums.all_reduce",
        "TokenSums.reduced",
        "TokenSums.metrics",
        "policy_loss",
    ),
    "gmts.core.aggregation": ("Aggregation", "get_aggregation", "register_aggregation"),
    "gmts.core.scores": (
        "ScoreInputs",
        "register_score",
        "get_score",
        "score_requirements",
        "compute_scores",
    ),
    "gmts.core.selection": ("select_tokens", "selection_threshold", "selection_count"),
    "gmts.core.config": ("SelectionConfig", "SelectionConfig.preset"),
    "gmts.core.step": (
        "selection_step",
        "UpdateBatch",
        "UpdateLayout",
        "OwnDivisor",
        "SelectionStep",
        "SelectionStep.part",
        "select_for_update",
        "SelectionResult",
    ),
    "gmts.core.support": ("EngineSupport", "Unsupported", "refuse"),
    "gmts.core.advantages": ("group_advantages", "dynamic_sampling_keep"),
    "gmts.core.metrics": ("average_at_k", "pass_at_k"),
    "gmts.configuration": (
        "read_yaml",
        "apply_overrides",
        "build",
        "coerce",
        "field_reference",
        "dialect_fields",
    ),
    "gmts.rewards.registry": ("register_reward", "get_reward", "reward_runs_code"),
    "gmts.rewards.verifiers": ("Verifier", "register_verifier", "get_verifier"),
    "gmts.rewards.math_verifier": ("math_reward",),
    "gmts.rewards.sandbox": ("check_sandbox", "run_sandboxed", "code_reward"),
    "gmts.data.benchmarks": ("Benchmark", "register_benchmark", "load_benchmark"),
    "gmts.data.datasets": ("Example", "load_jsonl_dataset"),
    "gmts.data.prompts": ("format_prompt",),
    "gmts.sampling.rollout": ("generate_rollouts", "Rollout", "rollout_from_responses"),
    "gmts.sampling.vllm_engine": ("VLLMConfig", "VLLMEngine", "VLLMEngine.sample_rollouts"),
    "gmts.sampling.sampler": ("SamplerInputs", "Sampler.sample", "make_sampler"),
    "gmts.embedded.tokenizer": ("build_char_tokenizer",),
    "gmts.embedded.tiny_model": ("TinyModelConfig", "build_tiny_model"),
    "gmts.embedded.tasks": ("get_task", "register_task"),
    "gmts.embedded.evaluation": ("evaluate_task", "held_out_metrics"),
    "gmts.embedded.warmstart": ("warm_start", "load_warm_start"),
    "gmts.models.loading": ("resolve_model_path", "pick_device", "load_tokenizer", "load_model"),
    "gmts.models.context": ("check_fits",),
    "gmts.models.lora": ("LoraConfig", "add_adapters", "merged_weights"),
    "gmts.scale.strategy": ("make_strategy", "Strategy.full_parameters"),
    "gmts.scale.memory_plan": ("plan_memory",),
    "gmts.eval.backends": ("BackendOptions", "make_backend"),
    "gmts.eval.harness": ("EvalConfig", "evaluate"),
    "gmts.train.config": ("load_config",),
    "gmts.train.rollout_engine": ("EngineInputs", "RolloutEngine", "make_engine"),
    "gmts.train.evaluation": ("evaluate_held_out", "evaluate_start"),
    "gmts.train.trainer": ("train",),
}


def _annotation(value: object, item_type: str | None = None) -> str:
    text = value if isinstance(value, str) else inspect.formatannotation(value)
    return item_type if item_type and text == "T" else text


def _item_type(obj: object) -> str | None:
    """A registry's item type, for a public function that is a registry's method
    (``register_task = _TASKS.register``): its ``T`` is written as the type."""
    from gmts._registry import Registry

    registry = getattr(obj, "__self__", None)
    if not isinstance(registry, Registry) or registry.item_type is None:
        return None
    return getattr(registry.item_type, "__name__", str(registry.item_type))


def _signature(obj: object) -> str:
    """``(a: int, *, b: str = 'x') -> R`` with the annotations as the source writes them."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    sig = inspect.signature(target)
    item_type = _item_type(obj)
    parts = []
    star_done = False
    params = list(sig.parameters.values())
    if inspect.isclass(obj) or (params and params[0].name == "self"):
        params = params[1:]  # (classmethods reached through the class are already bound)
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.kind is p.VAR_POSITIONAL:
            star_done = True
        text = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation, item_type)}"
        if p.default is not p.empty:
            text += f" = {p.default!r}" if p.annotation is not p.empty else f"={p.default!r}"
        parts.append(text)
    out = f"({', '.join(parts)})"
    if not inspect.isclass(obj) and sig.return_annotation is not sig.empty:
        out += f" -> {_annotation(sig.return_annotation, item_type)}"
    return out


def render() -> str:
    """The API block of docs/architecture.md."""
    lines = ["```python"]
    for module_name, names in API.items():
        module = importlib.import_module(module_name)
        package = Path(module.__file__).name == "__init__.py"
        suffix = "/ (a package)" if package else ".py"
        lines.append(f"# {module_name.replace('.', '/')}{suffix}")
        for name in names:
            obj = module
            for part in name.split("."):
                obj = getattr(obj, part)
            lines.append(f"{name}{_signature(obj)}")
        lines.append("")
    lines[-1] = "```"
    return "\n".join(lines)


def documented() -> str:
    text = ARCHITECTURE.read_text()
    match = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert match, f"docs/architecture.md has no {START} ... {END} block"
    return match.group(1)


def test_the_documented_api_is_the_code():
    assert documented() == render(), (
        "docs/architecture.md's API block differs from the code: regenerate it with "
        "`python tests/docs/test_architecture_api.py`"
    )


def test_the_renderer_shows_defaults_and_keyword_only_arguments():
    def sample(a: int, *, b: str = "x") -> float:  # noqa: ARG001
        return 0.0

    assert _signature(sample) == "(a: int, *, b: str = 'x') -> float"


if __name__ == "__main__":  # rewrite the block in docs/architecture.md
    text = ARCHITECTURE.read_text()
    block = f"{START}\n{render()}\n{END}"
    pattern = re.escape(START) + r"\n.*?\n" + re.escape(END)
    if re.search(pattern, text, re.S):
        text = re.sub(pattern, lambda _: block, text, flags=re.S)
    else:
        sys.exit(f"add a {START} / {END} pair to {ARCHITECTURE} first")
    ARCHITECTURE.write_text(text)
    print(f"wrote the API block of {ARCHITECTURE}")
