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
    from gmts.eval.backends import BackendOptions, make_backend
    from gmts.rewards.registry import get_reward

    for lookup, kind in (
        (get_score, "score"),
        (get_reward, "reward"),
        (get_template, "prompt template"),
        (get_task, "task"),
        (lambda name: make_backend(name, BackendOptions("model")), "backend"),
    ):
        with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; valid {kind}s: "):
            lookup("nope")
