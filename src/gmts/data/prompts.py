"""Prompt templates of the GMTS paper (Appendix A.3, "Dialogue template"), by name.

A template turns one benchmark question into chat messages (an optional system turn and a user
turn). :func:`format_prompt` renders them through the tokenizer's chat template when it has one
(``apply_chat_template(..., add_generation_prompt=True)``, e.g. Qwen's ChatML), and as plain
text otherwise. The registered templates:

==================== ===================================================================
``math``             system "Please reason step by step, and put your final answer within
                     \\boxed{}."; user = the question (paper: math and commonsense)
``commonsense_choice`` same system prompt; user = the question, then lettered choices
                     ("A. ...", unless already in the question) and a request for the
                     letter (CommonsenseQA)
``commonsense_yesno`` same system prompt; user = the question and "Answer yes or no."
                     (CommonsenseQA 2.0)
``code``             system "You are Qwen, created by Alibaba Cloud. You are a helpful
                     assistant."; user = the task and a request for a self-contained Python
                     script in a markdown code block (paper: code)
``plain``            no system turn; user = the question verbatim
==================== ===================================================================

``auto`` (:data:`AUTO_TEMPLATE`, the default of a user's file: ``data.template``, ``gmts eval
--template``, ``gmts analyze --template``) is not a template but picks one for the model
(:func:`resolve_template`): ``plain`` when its tokenizer has a chat template (the question as
the user turn of the model's own chat format, with the model's default system turn), ``math``
when it has none but can encode the math system prompt (a base model: that instruction is its
only cue), else ``plain`` (the embedded model reads only its task alphabet).

The paper's copy lost the literal dialogue text; the system prompts above are the ones it
names, and the user-turn wording for choices, yes/no and code is ours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gmts._registry import Registry

MATH_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
CODE_SYSTEM_PROMPT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

CHOICE_INSTRUCTION = "Answer with the letter of the correct choice."
YESNO_INSTRUCTION = "Answer yes or no."
CODE_INSTRUCTION = (
    "Write a self-contained Python script that solves the task above. "
    "Put the complete script in a single markdown code block:\n```python\n# your code\n```"
)

# A minimal ChatML template in the layout Qwen2.5 uses (<|im_start|>role\n...<|im_end|>\n).
# Set ``tokenizer.chat_template = CHATML_TEMPLATE`` to give a tokenizer without one the Qwen
# chat format (its vocabulary should hold <|im_start|> and <|im_end|> as special tokens).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

Choices = Sequence[str] | Sequence[tuple[str, str]] | Mapping[str, str]
Message = dict[str, str]


def format_choices(choices: Choices) -> str:
    """Render answer choices one per line as ``"A. text"``.

    ``choices`` is a list of texts (lettered A, B, ... in order), a list of ``(label, text)``
    pairs, or a mapping label -> text (kept in its order).
    """
    if isinstance(choices, Mapping):
        pairs = [(str(k), str(v)) for k, v in choices.items()]
    else:
        items = list(choices)
        if items and all(isinstance(c, tuple | list) and len(c) == 2 for c in items):
            pairs = [(str(k), str(v)) for k, v in items]
        elif all(isinstance(c, str) for c in items):
            if len(items) > 26:
                raise ValueError(f"choices: at most 26 choices can be lettered, got {len(items)}")
            pairs = [(chr(ord("A") + i), c) for i, c in enumerate(items)]
        else:
            raise ValueError(
                "choices must be a list of strings, a list of (label, text) pairs or a mapping "
                f"label -> text; got {choices!r}"
            )
    if not pairs:
        raise ValueError("choices is empty")
    return "\n".join(f"{label}. {text}" for label, text in pairs)


@dataclass(frozen=True)
class PromptTemplate:
    """One dialogue template: an optional system prompt and how the user turn is written.

    Attributes:
        name: registry name.
        system: system prompt, or None for no system turn.
        instruction: text appended to the user turn after a blank line ("" for none).
        uses_choices: whether the user turn lists lettered choices (``choices=``; None means
            they are already written in the question).
    """

    name: str
    system: str | None
    instruction: str = ""
    uses_choices: bool = False

    def user_message(self, question: str, choices: Choices | None = None) -> str:
        """The text of the user turn for ``question``."""
        if not isinstance(question, str):
            raise ValueError(f"question must be a str, got {type(question).__name__}")
        parts = [question.strip()]
        if self.uses_choices:
            if choices is not None:  # None: the options are already written in the question
                parts.append(format_choices(choices))
        elif choices is not None:
            raise ValueError(f"template {self.name!r} takes no choices; got {choices!r}")
        if self.instruction:
            parts.append(self.instruction)
        return "\n\n".join(parts)

    def messages(self, question: str, choices: Choices | None = None) -> list[Message]:
        """Chat messages ``[{"role": "system", ...}, {"role": "user", ...}]``."""
        out: list[Message] = []
        if self.system is not None:
            out.append({"role": "system", "content": self.system})
        out.append({"role": "user", "content": self.user_message(question, choices)})
        return out

    def plain_text(self, question: str, choices: Choices | None = None) -> str:
        """The prompt for a tokenizer without a chat template: turns joined by blank lines.

        ``plain`` gives the question verbatim (no added newline), so a model trained on raw
        prompts sees exactly its training format.
        """
        if self.system is None and not self.instruction and not self.uses_choices:
            return question
        return "\n\n".join(m["content"] for m in self.messages(question, choices)) + "\n\n"


_TEMPLATES = Registry[PromptTemplate]("prompt template")


register_template = _TEMPLATES.register
get_template = _TEMPLATES.get
available_templates = _TEMPLATES.names


register_template(PromptTemplate("math", MATH_SYSTEM_PROMPT))
register_template(
    PromptTemplate("commonsense_choice", MATH_SYSTEM_PROMPT, CHOICE_INSTRUCTION, uses_choices=True)
)
register_template(PromptTemplate("commonsense_yesno", MATH_SYSTEM_PROMPT, YESNO_INSTRUCTION))
register_template(PromptTemplate("code", CODE_SYSTEM_PROMPT, CODE_INSTRUCTION))
register_template(PromptTemplate("plain", None))


def has_chat_template(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` carries a chat template (``tokenizer.chat_template`` set)."""
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


AUTO_TEMPLATE = "auto"
"""The template that fits the model (:func:`resolve_template`): a user's file's default."""


def template_choices() -> list[str]:
    """What a template setting accepts: ``auto`` and the registered templates."""
    return [AUTO_TEMPLATE, *available_templates()]


def check_template(name: str, key: str) -> None:
    """ValueError naming ``key`` unless ``name`` is ``auto`` or a registered template."""
    if name not in template_choices():
        raise ValueError(f"{key}: unknown template {name!r}; available: {template_choices()}")


def _can_encode(tokenizer: Any, text: str) -> bool:
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:  # byte-level vocabularies encode every string
        return True
    return unk not in tokenizer(text, add_special_tokens=False)["input_ids"]


def resolve_template(name: str, tokenizer: Any) -> str:
    """The registered template ``name`` means for ``tokenizer``: ``name`` itself, or for
    ``auto``: ``plain`` when the tokenizer has a chat template, ``math`` when it has none but
    encodes the math system prompt, else ``plain`` (the embedded model's tokenizer)."""
    if name != AUTO_TEMPLATE:
        return name
    if has_chat_template(tokenizer):
        return "plain"
    if tokenizer is None or _can_encode(tokenizer, MATH_SYSTEM_PROMPT):
        return "math"
    return "plain"


def why_template(name: str, tokenizer: Any) -> str:
    """Why ``name`` resolves as it does for ``tokenizer`` ("" for a template named outright):
    the note of the settings line every command prints."""
    if name != AUTO_TEMPLATE:
        return ""
    if has_chat_template(tokenizer):
        return "auto: the question in the model's chat template"
    if resolve_template(name, tokenizer) == "math":
        return "auto: no chat template, the math instruction as plain text"
    return "auto: the tokenizer cannot read an instruction, the question as is"


def format_prompt(
    tokenizer: Any,
    question: str,
    *,
    template: str = "math",
    choices: Choices | None = None,
    chat: bool | None = None,
) -> str:
    """Render ``question`` with the named template into the prompt string given to the model.

    Args:
        tokenizer: a Hugging Face tokenizer, or None. When it has a chat template the messages
            go through ``apply_chat_template(..., add_generation_prompt=True)``; otherwise
            the plain-text form (:meth:`PromptTemplate.plain_text`) is returned.
        question: the question text.
        template: a registered template name (:func:`available_templates`), or ``auto``
            (:func:`resolve_template`).
        choices: answer options for ``commonsense_choice`` (see :func:`format_choices`).
        chat: None = use the chat template when there is one; False = always plain text;
            True = require a chat template (ValueError without one).

    Returns:
        The prompt text (special tokens of the chat template included as text).
    """
    tpl = get_template(resolve_template(template, tokenizer))
    if chat is True and not has_chat_template(tokenizer):
        raise ValueError("chat=True but the tokenizer has no chat_template")
    use_chat = has_chat_template(tokenizer) if chat is None else chat
    if not use_chat:
        return tpl.plain_text(question, choices)
    rendered = tokenizer.apply_chat_template(
        tpl.messages(question, choices), tokenize=False, add_generation_prompt=True
    )
    if not isinstance(rendered, str):  # defensive: some tokenizers ignore tokenize=False
        raise TypeError(f"apply_chat_template returned {type(rendered).__name__}, expected str")
    return rendered
