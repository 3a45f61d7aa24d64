"""The one registry type behind scores, rewards, prompts, tasks, benchmarks and backends."""

from __future__ import annotations

import pytest

from gmts._registry import Registry


def test_add_get_list_and_order() -> None:
    reg: Registry[int] = Registry("widget")
    assert reg.add("b", 2) == 2
    reg.decorator("a")(1)
    assert reg.get("a") == 1 and reg.get("b") == 2
    assert reg.names() == ["a", "b"]  # sorted
    assert list(reg) == ["b", "a"]  # registration order
    assert "a" in reg and "c" not in reg and len(reg) == 2
    assert reg.remove("a") == 1 and reg.names() == ["b"]


def test_errors_name_the_problem() -> None:
    reg: Registry[int] = Registry("widget", reserved=("none",))
    reg.add("x", 1)
    with pytest.raises(ValueError, match="widget 'x' is already registered"):
        reg.add("x", 2)
    with pytest.raises(ValueError, match="reserved"):
        reg.add("none", 3)
    with pytest.raises(ValueError, match="non-empty string"):
        reg.add("", 4)
    with pytest.raises(ValueError, match=r"unknown widget 'y'; valid widgets: x"):
        reg.get("y")
    with pytest.raises(ValueError, match="unknown widget"):
        reg.get(["not", "hashable"])  # type: ignore[arg-type]
    assert reg.get("x") == 1  # failed adds changed nothing


def test_library_registries_share_the_wording() -> None:
    from gmts.core.scores import get_score
    from gmts.data.prompts import get_template
    from gmts.embedded.tasks import get_task
    from gmts.rewards.registry import get_reward
    from gmts.sampling.sampler import SamplerInputs, make_sampler

    for lookup, kind in (
        (get_score, "score"),
        (get_reward, "reward"),
        (get_template, "prompt template"),
        (get_task, "task"),
        (lambda name: make_sampler(name, SamplerInputs(None)), "sampler"),
    ):
        with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; valid {kind}s: "):
            lookup("nope")


def test_register_by_own_name_and_item_type() -> None:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Widget:
        name: str

    reg = Registry[Widget]("widget")
    register, get = reg.register, reg.get  # how a kind exports its public functions
    w = register(Widget("w"))
    assert get("w") is w and reg.item_type is Widget
    assert Registry("untyped").item_type is None
    with pytest.raises(ValueError, match="widget 'w' is already registered"):
        register(Widget("w"))
    with pytest.raises(TypeError, match=r"needs a \.name"):
        reg.register(3)  # type: ignore[arg-type]


def test_public_register_functions_are_the_registries() -> None:
    """The one-line exports (``register_task = _TASKS.register``) reach the same tables."""
    from gmts.core.aggregation import available_aggregations, get_aggregation
    from gmts.core.objectives import get_objective, register_objective
    from gmts.embedded.tasks import available_tasks, get_task

    assert get_objective("ppo").name == "ppo"
    assert get_task(available_tasks()[0]).name == available_tasks()[0]
    assert get_aggregation(available_aggregations()[0]).name == available_aggregations()[0]
    with pytest.raises(ValueError, match="objective 'ppo' is already registered"):
        register_objective(get_objective("ppo"))
