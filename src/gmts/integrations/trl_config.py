"""``GMTSGRPOConfig``: TRL's ``GRPOConfig`` plus the GMTS settings, generated from the core.

Every ``SelectionConfig`` field ``x`` is the argument ``gmts_x`` (with its help text, its type
and the note TRL adds: :data:`TRL_SUPPORT`'s refusals, :data:`TRL_NOTES`), and ``gmts_preset``
names a selection preset; nothing here lists the fields, so a new selection setting is one field
of ``SelectionConfig``. What TRL cannot run is declared once (:data:`TRL_SUPPORT`) and refused,
with TRL's own options GMTS cannot honour, by :func:`check_trl_args` before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import GRPOConfig

from gmts.configuration import DialectField, dialect_fields
from gmts.core.config import SELECTION_PRESETS, SelectionConfig
from gmts.core.support import GROUPS_SPLIT, EngineSupport, Unsupported
from gmts.integrations.trl_loss import TRLLossOptions

__all__ = [
    "GMTSGRPOConfig",
    "TRL_NOTES",
    "TRL_PREFIX",
    "TRL_SUPPORT",
    "check_trl_args",
    "gmts_args",
    "trl_fields",
]

TRL_PREFIX = "gmts_"

TRL_SUPPORT = EngineSupport(
    engine="GMTSGRPOTrainer",
    prefix=TRL_PREFIX,
    unsupported=(
        Unsupported("scope", ("group",), GROUPS_SPLIT, ("batch", "sequence")),
        Unsupported("normalize", ("per-group",), GROUPS_SPLIT, ("selected", "all"), always=True),
    ),
    missing={
        "logit_grad_norm": "TRL's forward (_get_per_token_logps_and_entropies) gives log-probs "
        "and entropies only"
    },
)
"""What GMTSGRPOTrainer cannot run of a SelectionConfig (the one declaration)."""

TRL_NOTES = {
    "unit": "In TRL the mini-batch is the optimizer step (all accumulated micro-batches); with "
    "gradient_accumulation_steps > 1 it costs one extra no-grad forward per step (none for a "
    "score that reads nothing of the model, such as random).",
    "seed": "None: the trainer's `seed`.",
}
"""What TRL adds to a field's help (besides the refusals of :data:`TRL_SUPPORT`)."""


def trl_fields() -> list[DialectField]:
    """The ``gmts_*`` arguments of :class:`GMTSGRPOConfig`: one per SelectionConfig field."""
    return dialect_fields(SelectionConfig, TRL_PREFIX, TRL_SUPPORT.notes(TRL_NOTES))


def _with_selection_fields(cls: type) -> type:
    """Give ``cls`` (before ``@dataclass``) a ``gmts_<x>: <type> | None = None`` field for every
    SelectionConfig field ``x``: None means the preset's value, else SelectionConfig's default
    (:meth:`GMTSGRPOConfig.gmts_selection_config` resolves them)."""
    annotations = cls.__dict__.get("__annotations__", {})
    for item in trl_fields():
        default = "the trainer's `seed`" if item.field == "seed" else repr(item.default)
        help_text = f"{item.help} Unset: gmts_preset's value, else {default}."
        annotations[item.key] = item.type | None
        setattr(cls, item.key, field(default=None, metadata={"help": help_text}))
    cls.__annotations__ = annotations
    return cls


@dataclass
@_with_selection_fields
class GMTSGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the GMTS token-selection settings (``gmts_*``: every
    ``SelectionConfig`` field, generated; ``gmts_preset``).

    Defaults are the paper's: GMTS score, top 20% of the tokens, normalised by the selected
    count, KL on the selected tokens. ``gmts_score="none"`` trains on every token (plain TRL
    loss computed by the core, useful as a control). After construction every ``gmts_*`` field
    holds the resolved value (the preset's, or SelectionConfig's default), ``gmts_seed`` None
    still meaning the trainer's ``seed``.
    """

    gmts_preset: str | None = field(
        default=None,
        metadata={
            "help": f"A selection preset ({', '.join(SELECTION_PRESETS)}: "
            "SelectionConfig.preset, docs/semantics.md section 7); the gmts_* arguments given "
            "override it."
        },
    )
    gmts_vespo_trl_padding: bool = field(
        default=False,
        metadata={
            "help": "loss_type='vespo' with a vLLM token IS range [C_min, C_max] that excludes "
            "1: reproduce TRL 1.16's loss exactly. TRL's VESPO weight then sums the log IS "
            "ratio over every position of the micro-batch, padding included, where its ratio "
            "is 1 clipped to the range (truncate) or 0 (mask: log 1e-8 each), so a row's "
            "weight depends on its padding. False: such a range is refused."
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        selection = self.gmts_selection_config()  # validates the gmts_* fields now
        for item in trl_fields():
            if item.field != "seed":  # None keeps following the trainer's seed
                setattr(self, item.key, getattr(selection, item.field))

    def gmts_selection_config(self) -> SelectionConfig:
        """The core ``SelectionConfig`` these arguments describe."""
        values = {
            item.field: getattr(self, item.key)
            for item in trl_fields()
            if getattr(self, item.key) is not None
        }
        values.setdefault("seed", int(self.seed))
        try:
            if self.gmts_preset is not None:
                return SelectionConfig.preset(self.gmts_preset, **values)
            return SelectionConfig(**values)
        except ValueError as err:
            raise ValueError(f"invalid gmts_* setting: {err}") from err


def gmts_args(selection: SelectionConfig) -> dict[str, Any]:
    """The ``gmts_*`` keyword arguments of :class:`GMTSGRPOConfig` for a core SelectionConfig
    (e.g. ``GMTSGRPOConfig(**trl_kwargs, **gmts_args(SelectionConfig.preset("trl")))``)."""
    return {item.key: getattr(selection, item.field) for item in trl_fields()}


def check_trl_args(args: Any) -> None:
    """Raise ``ValueError`` listing every setting GMTSGRPOTrainer cannot honour: the
    selection's (:data:`TRL_SUPPORT`) and TRL's own options.

    Args:
        args: a ``GMTSGRPOConfig``.
    """
    if not isinstance(args, GMTSGRPOConfig):
        raise ValueError(
            f"GMTSGRPOTrainer needs args=GMTSGRPOConfig(...), got {type(args).__name__}"
        )
    selection = args.gmts_selection_config()
    problems = TRLLossOptions.from_args(args).problems()
    if args.top_entropy_quantile < 1.0:
        problems.append(
            "top_entropy_quantile < 1 is TRL's own entropy mask, which the GMTS selection "
            "replaces; set it to 1.0 and use gmts_preset='trl' with gmts_score='entropy' and "
            "gmts_ratio to reproduce TRL's loss"
        )
    if (
        selection.unit == "mini-batch"
        and selection.enabled
        and args.steps_per_generation is not None
        and args.steps_per_generation % args.gradient_accumulation_steps != 0
    ):
        problems.append(
            "gmts_unit='mini-batch' needs steps_per_generation to be a multiple of "
            "gradient_accumulation_steps (an optimizer step must not span two generations)"
        )
    TRL_SUPPORT.check(selection, more=problems)
