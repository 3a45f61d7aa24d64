"""The append-only JSONL file that makes ``gmts eval`` resumable.

Line 1 is a header ``{"gmts_eval": 1, "settings": {...}}`` with everything that changes what
a completion would be (model, n, temperature, budget, seed, prompts' template, ...). Each
further line is one finished question (:class:`QuestionRecord`). A run appends a question's
line as soon as it is scored and flushes it to disk, so a killed run loses at most the
questions being generated. Reopening the file with the same settings skips the recorded
questions; with different settings it refuses (mixing two settings in one table would be a
silent wrong result). A torn last line (killed mid-write) is dropped on reopening.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1


@dataclass(frozen=True)
class QuestionRecord:
    """One evaluated question.

    Attributes:
        benchmark: benchmark name.
        id: question id.
        question: question text.
        answer: gold answer.
        completions: ``n`` model outputs.
        rewards: ``n`` rewards in [0, 1], aligned with completions.
        extracted: ``n`` extracted final answers (None where nothing was found).
    """

    benchmark: str
    id: str
    question: str
    answer: str
    completions: list[str]
    rewards: list[float]
    extracted: list[Any]

    def __post_init__(self) -> None:
        if not (len(self.completions) == len(self.rewards) == len(self.extracted)):
            raise ValueError(
                f"record {self.benchmark}/{self.id}: completions, rewards and extracted "
                "must have the same length"
            )

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> QuestionRecord:
        return cls(
            benchmark=str(data["benchmark"]),
            id=str(data["id"]),
            question=str(data["question"]),
            answer=str(data["answer"]),
            completions=list(data["completions"]),
            rewards=[float(r) for r in data["rewards"]],
            extracted=list(data["extracted"]),
        )


class SettingsMismatchError(ValueError):
    """The partial-results file was written with other settings."""


class ResultsStore:
    """Open (or create) the JSONL partial-results file for ``settings``.

    Args:
        path: the JSONL file.
        settings: JSON-serialisable dict; must equal the stored header's to resume.
        fresh: discard an existing file and start over.
    """

    def __init__(
        self, path: str | os.PathLike[str], settings: dict[str, Any], *, fresh: bool = False
    ):
        self.path = Path(path)
        self.settings = self.normalise(settings)
        self.records: dict[tuple[str, str], QuestionRecord] = {}
        if fresh and self.path.exists():
            self.path.unlink()
        if self.path.exists() and self.path.stat().st_size > 0:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            header = {"gmts_eval": FORMAT_VERSION, "settings": self.settings}
            with open(self.path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(header) + "\n")
                fh.flush()
                os.fsync(fh.fileno())

    @staticmethod
    def normalise(settings: dict[str, Any]) -> dict[str, Any]:
        """``settings`` as they read back from JSON (tuples become lists, ...)."""
        return json.loads(json.dumps(settings))

    def _load(self) -> None:
        with open(self.path, "rb") as fh:
            raw = fh.read()
        lines = raw.split(b"\n")
        good_bytes = 0
        parsed: list[dict[str, Any]] = []
        for i, line in enumerate(lines):
            complete = i < len(lines) - 1  # followed by a newline
            if not line.strip():
                good_bytes += len(line) + (1 if complete else 0)
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None
            if obj is None or not complete:
                if i >= len(lines) - 2 and i > 0:  # a torn final line: drop it
                    break
                raise ValueError(f"{self.path}: line {i + 1} is not valid JSON; delete the file")
            parsed.append(obj)
            good_bytes += len(line) + 1
        if good_bytes < len(raw):  # cut the torn tail so appends start on a fresh line
            with open(self.path, "r+b") as fh:
                fh.truncate(good_bytes)
        if not parsed or parsed[0].get("gmts_eval") != FORMAT_VERSION:
            raise ValueError(
                f"{self.path} is not a gmts eval results file; delete it or use another"
            )
        stored = parsed[0].get("settings")
        if stored != self.settings:
            diff = sorted(
                k
                for k in set(stored or {}) | set(self.settings)
                if (stored or {}).get(k) != self.settings.get(k)
            )
            raise SettingsMismatchError(
                f"{self.path} holds results for other settings (differs in: {', '.join(diff)}); "
                "pass --fresh to start over or choose another --out"
            )
        for obj in parsed[1:]:
            record = QuestionRecord.from_json(obj)
            self.records[(record.benchmark, record.id)] = record

    def get(self, benchmark: str, question_id: str) -> QuestionRecord | None:
        return self.records.get((benchmark, question_id))

    def add(self, records: list[QuestionRecord]) -> None:
        """Append finished questions and flush them to disk."""
        if not records:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record.to_json(), ensure_ascii=False) + "\n")
                self.records[(record.benchmark, record.id)] = record
            fh.flush()
            os.fsync(fh.fileno())
