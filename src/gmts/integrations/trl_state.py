"""What :class:`gmts.integrations.trl.GMTSGRPOTrainer` reads of TRL's ``GRPOTrainer`` at a
micro-batch, with TRL 1.16's attribute names (several private) in one place.

Kept apart from the trainer so that a TRL release renaming one of them breaks one line here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gmts.integrations.trl_loss import DivisorInputs

__all__ = ["TRLStepState"]


@dataclass(frozen=True)
class TRLStepState:
    """TRL's position in its optimizer step and generation batch.

    Attributes:
        step: micro-batches trained so far (TRL's private ``_step``).
        accumulation: micro-batches of this optimizer step
            (``current_gradient_accumulation_steps``).
        steps_per_generation: micro-batches per generation batch (``args.steps_per_generation``).
        buffered_inputs: the generation batch's micro-batches, by slot (TRL's private
            ``_buffered_inputs``).
        num_processes: accelerate's processes.
        max_completion_length: TRL's response budget.
    """

    step: int
    accumulation: int
    steps_per_generation: int
    buffered_inputs: Sequence[dict[str, Any]]
    num_processes: int
    max_completion_length: int

    @classmethod
    def of(cls, trainer: Any) -> TRLStepState:
        """Read now from a live ``GRPOTrainer`` (the only place its attributes are named)."""
        return cls(
            step=int(trainer._step),
            accumulation=int(trainer.current_gradient_accumulation_steps),
            steps_per_generation=int(trainer.args.steps_per_generation),
            buffered_inputs=getattr(trainer, "_buffered_inputs", None) or (),
            num_processes=int(trainer.accelerator.num_processes),
            max_completion_length=int(trainer.max_completion_length),
        )

    @property
    def window_start(self) -> int:
        """The first micro-batch (TRL step) of this optimizer step."""
        return self.step - self.step % self.accumulation

    @property
    def slot(self) -> int:
        """This micro-batch's place in the buffered generation batch."""
        return self.step % self.steps_per_generation

    def window_slots(self) -> list[int]:
        """The buffered slots of every micro-batch of this optimizer step, in order."""
        start = self.window_start
        return [(start + i) % self.steps_per_generation for i in range(self.accumulation)]

    def divisor_inputs(self, *, rows: int, num_items_in_batch: Any, train: bool) -> DivisorInputs:
        """What the loss type's divisor reads for a micro-batch of ``rows`` rows."""
        return DivisorInputs(
            rows=rows,
            num_items_in_batch=num_items_in_batch,
            num_processes=self.num_processes,
            accumulation=self.accumulation,
            steps_per_generation=self.steps_per_generation,
            max_completion_length=self.max_completion_length,
            train=train,
        )
