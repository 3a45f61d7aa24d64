"""Prompt templates: registry, plain-text and chat-template rendering."""

from __future__ import annotations

import pytest

from gmts.data.prompts import (
    AUTO_TEMPLATE,
    CHATML_TEMPLATE,
    CODE_SYSTEM_PROMPT,
    MATH_SYSTEM_PROMPT,
    PromptTemplate,
    available_templates,
    format_choices,
    format_prompt,
    get_template,
    register_template,
    resolve_template,
    template_choices,
    why_template,
)


def test_registry_names_and_errors():
    assert set(available_templates()) >= {
        "math",
        "commonsense_choice",
        "commonsense_yesno",
        "code",
        "plain",
    }
    with pytest.raises(ValueError, match="valid prompt templates: .*math"):
        get_template("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_template(PromptTemplate("math", None))


def test_paper_system_prompts():
    assert MATH_SYSTEM_PROMPT == (
        "Please reason step by step, and put your final answer within \\boxed{}."
    )
    assert CODE_SYSTEM_PROMPT == (
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    )
    assert get_template("math").system == MATH_SYSTEM_PROMPT
    assert get_template("commonsense_choice").system == MATH_SYSTEM_PROMPT
    assert get_template("commonsense_yesno").system == MATH_SYSTEM_PROMPT
    assert get_template("code").system == CODE_SYSTEM_PROMPT
    assert get_template("plain").system is None


def test_plain_text_without_chat_template(byte_tokenizer):
    assert not getattr(byte_tokenizer, "chat_template", None)
    text = format_prompt(byte_tokenizer, "What is 1+1?", template="math")
    assert text == MATH_SYSTEM_PROMPT + "\n\nWhat is 1+1?\n\n"
    # "plain" is the question verbatim, with or without a tokenizer
    assert format_prompt(byte_tokenizer, "037+485=", template="plain") == "037+485="
    assert format_prompt(None, "037+485=", template="plain") == "037+485="


def test_chatml_rendering(chat_tokenizer):
    text = format_prompt(chat_tokenizer, "What is 1+1?", template="math")
    assert text == (
        "<|im_start|>system\n" + MATH_SYSTEM_PROMPT + "<|im_end|>\n"
        "<|im_start|>user\nWhat is 1+1?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # special tokens of the template are single tokens of the tokenizer
    ids = chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == chat_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids.count(chat_tokenizer.convert_tokens_to_ids("<|im_end|>")) == 2
    # chat=False forces plain text even with a chat template
    assert format_prompt(chat_tokenizer, "q", template="plain", chat=False) == "q"


def test_chat_true_requires_template(byte_tokenizer):
    with pytest.raises(ValueError, match="no chat_template"):
        format_prompt(byte_tokenizer, "q", chat=True)


def test_choices_formatting():
    expected = "A. bank\nB. library\nC. mall"
    assert format_choices(["bank", "library", "mall"]) == expected
    assert format_choices({"A": "bank", "B": "library", "C": "mall"}) == expected
    assert format_choices([("A", "bank"), ("B", "library"), ("C", "mall")]) == expected
    with pytest.raises(ValueError, match="empty"):
        format_choices([])
    with pytest.raises(ValueError, match="choices must be"):
        format_choices([1, 2])


def test_choice_and_yesno_and_code_user_turns(chat_tokenizer):
    text = format_prompt(
        None, "Where is money kept?", template="commonsense_choice", choices=["bank", "mall"]
    )
    assert "Where is money kept?\n\nA. bank\nB. mall\n\nAnswer with the letter" in text
    # choices already written in the question: only the instruction is added
    inline = format_prompt(None, "Where?\nA. bank\nB. mall", template="commonsense_choice")
    assert inline.endswith(
        "Where?\nA. bank\nB. mall\n\nAnswer with the letter of the correct choice.\n\n"
    )
    with pytest.raises(ValueError, match="takes no choices"):
        format_prompt(None, "q", template="math", choices=["a"])
    yn = format_prompt(chat_tokenizer, "Is water wet?", template="commonsense_yesno")
    assert "Is water wet?\n\nAnswer yes or no.<|im_end|>" in yn
    code = format_prompt(chat_tokenizer, "def f(x):\n    pass", template="code")
    assert code.startswith("<|im_start|>system\n" + CODE_SYSTEM_PROMPT)
    assert "self-contained Python script" in code and "```python" in code
    assert code.endswith("<|im_start|>assistant\n")


def test_bad_question_type():
    with pytest.raises(ValueError, match="question must be a str"):
        format_prompt(None, 3, template="math")  # type: ignore[arg-type]


def test_auto_picks_the_template_each_tokenizer_reads(make_byte_tokenizer) -> None:
    from gmts.embedded.tokenizer import build_char_tokenizer

    chat, base = make_byte_tokenizer(CHATML_TEMPLATE), make_byte_tokenizer()
    chars = build_char_tokenizer()
    assert resolve_template(AUTO_TEMPLATE, chat) == "plain"  # the model's own chat format
    assert resolve_template(AUTO_TEMPLATE, base) == "math"  # byte-level: reads the instruction
    assert resolve_template(AUTO_TEMPLATE, chars) == "plain"  # the embedded model's alphabet
    assert resolve_template("code", chars) == "code"  # a template named outright stays
    assert why_template("code", chars) == ""
    assert "chat template" in why_template(AUTO_TEMPLATE, chat)
    # and the prompts themselves follow: auto renders as the template it resolves to
    for tokenizer in (chat, base, chars):
        assert format_prompt(tokenizer, "1+2=", template=AUTO_TEMPLATE) == format_prompt(
            tokenizer, "1+2=", template=resolve_template(AUTO_TEMPLATE, tokenizer)
        )
    assert MATH_SYSTEM_PROMPT in format_prompt(base, "1+2=", template=AUTO_TEMPLATE)
    assert format_prompt(chars, "1+2=", template=AUTO_TEMPLATE) == "1+2="


def test_auto_is_accepted_where_a_template_is_and_unknown_names_list_it() -> None:
    from gmts.eval.benchmarks import FileFields
    from gmts.train.config import load_config

    assert template_choices()[0] == AUTO_TEMPLATE
    assert FileFields().template == AUTO_TEMPLATE
    assert load_config(None, ["data.dataset=x.jsonl"]).data.template == AUTO_TEMPLATE
    with pytest.raises(ValueError, match=r"data.template: unknown template 'nope'.*'auto'"):
        load_config(None, ["data.dataset=x.jsonl", "data.template=nope"])
