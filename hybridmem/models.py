"""Typed values hybridmem takes and returns: never raw dicts or Chroma's lists of lists.

Input validation lives here (pydantic), so every entry point — library, CLI, REST — refuses the same
bad input with the same :class:`~hybridmem.errors.InvalidInputError`.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
)

from hybridmem.errors import InvalidInputError, InvalidUserIdError

__all__ = [
    "validate_as_of",
    "validate_limit",
    "MAX_LIMIT",
    "MAX_PATHS",
    "MAX_SAFE_INT",
    "MAX_TEXT_CHARS",
    "AddRequest",
    "ChatReply",
    "Context",
    "ContextLine",
    "Entity",
    "Extraction",
    "GRAPH_FORMATS",
    "GraphEntity",
    "GraphFormat",
    "GraphPath",
    "GraphRelation",
    "HistoryEvent",
    "Hit",
    "Kind",
    "Knowledge",
    "MAX_ENTITIES",
    "MAX_NAME_CHARS",
    "MAX_RELATIONS",
    "MemoryItem",
    "MemoryStatus",
    "MetadataValue",
    "Relation",
    "ScoreBreakdown",
    "Section",
    "Text",
    "UpdateRequest",
    "Usage",
    "UserStats",
    "new_id",
    "pydantic_message",
    "to_request",
    "utcnow",
    "validate_memory_id",
    "validate_metadata",
    "validate_text",
    "validate_user_id",
]

#: Longest memory text accepted (characters). Longer input is refused, not truncated.
MAX_TEXT_CHARS = 20_000
#: Most results one list or search call returns.
MAX_LIMIT = 1000
#: Longest user id accepted (characters).
MAX_USER_ID_CHARS = 256
MAX_METADATA_KEYS = 64
#: Most entities, and most relations, a caller may state with one memory.
MAX_ENTITIES = 50
MAX_RELATIONS = 50
#: Longest entity name (and relation end) a caller may state; predicates and types: 100.
MAX_NAME_CHARS = 200
MAX_PREDICATE_CHARS = 100
#: Most paths one ``query_path(..., k=)`` returns.
MAX_PATHS = 10

#: Largest metadata int magnitude: beyond 2**53 a JSON number (and Chroma) loses precision.
MAX_SAFE_INT = 2**53
MetadataValue = Union[str, int, float, bool, None]
#: Never in an id: C0 and C1 controls, DEL, path separators, bidi controls (they make an id
#: print as another), the replacement character (what undecodable bytes become), non-characters.
_FORBIDDEN_USER_ID = re.compile(
    "[\x00-\x1f\x7f-\x9f/\\\\\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ufffd\ufffe\uffff]"
)
_FORBIDDEN_ID = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff\ufffd\ufffe\uffff]"
)
#: Longest memory id accepted (ours are 32 hex digits; imports may bring their own).
MAX_MEMORY_ID_CHARS = 128
_METADATA_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC (all stored times are UTC)."""
    return datetime.now(timezone.utc)


def new_id() -> str:
    """A fresh memory id (uuid4, hex)."""
    return uuid.uuid4().hex


def as_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def is_valid_unicode(text: str) -> bool:
    """False when ``text`` holds a lone surrogate (valid in JSON and Python, not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_unicode(text: str, what: str) -> str:
    """``text`` if it is valid Unicode, else :class:`InvalidInputError` naming ``what``."""
    if not is_valid_unicode(text):
        raise InvalidInputError(f"{what} is not valid Unicode (it holds a lone surrogate)")
    return text


def validate_memory_id(memory_id: object) -> str:
    """Return ``memory_id`` if it is a plausible id: 1-128 characters of valid Unicode, no
    controls of any kind (C0, C1, bidi); :class:`InvalidInputError` otherwise."""
    if not isinstance(memory_id, str) or not memory_id.strip():
        raise InvalidInputError("memory_id must be a non-empty string")
    if len(memory_id) > MAX_MEMORY_ID_CHARS:
        raise InvalidInputError(f"memory_id is longer than {MAX_MEMORY_ID_CHARS} characters")
    check_unicode(memory_id, "memory_id")
    if _FORBIDDEN_ID.search(memory_id):
        raise InvalidInputError("memory_id must not contain control or bidi characters")
    return memory_id


def validate_user_id(user_id: object) -> str:
    """Return ``user_id`` if it is safe to store under; raise :class:`InvalidUserIdError` otherwise.

    User ids never reach a path or a collection name raw (both are derived from a hash), but ids that
    look like paths or carry control characters are refused anyway, so logs and exports stay sane.
    """
    if not isinstance(user_id, str):
        raise InvalidUserIdError(f"user_id must be a string, got {type(user_id).__name__}")
    if not user_id.strip():
        raise InvalidUserIdError("user_id must not be empty or blank")
    if len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidUserIdError(f"user_id is longer than {MAX_USER_ID_CHARS} characters")
    if not is_valid_unicode(user_id):
        raise InvalidUserIdError("user_id is not valid Unicode (it holds a lone surrogate)")
    if _FORBIDDEN_USER_ID.search(user_id):
        raise InvalidUserIdError(
            "user_id must not contain '/', '\\', control or bidi characters, or U+FFFD"
        )
    if user_id in {".", ".."} or ".." in user_id:
        raise InvalidUserIdError("user_id must not contain '..'")
    return user_id


def validate_text(text: object, *, what: str = "text") -> str:
    """Return ``text`` if it is a non-blank string of at most :data:`MAX_TEXT_CHARS` characters."""
    if not isinstance(text, str):
        raise InvalidInputError(f"{what} must be a string, got {type(text).__name__}")
    if not text.strip():
        raise InvalidInputError(f"{what} must not be empty or blank")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidInputError(
            f"{what} has {len(text)} characters, more than the limit of {MAX_TEXT_CHARS}; split it"
        )
    if "\x00" in text:
        raise InvalidInputError(f"{what} must not contain NUL characters")
    return check_unicode(text, what)


def validate_as_of(as_of: object) -> datetime | None:
    """``as_of`` as an aware UTC time (naive times are UTC), or None."""
    if as_of is None:
        return None
    if not isinstance(as_of, datetime):
        raise InvalidInputError(f"as_of must be a datetime, got {type(as_of).__name__}")
    return as_utc(as_of)


def validate_limit(limit: object, name: str = "limit") -> int:
    """``limit`` as an int between 1 and :data:`MAX_LIMIT` (bools refused)."""
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"{name} must be an integer between 1 and {MAX_LIMIT}, got {limit!r}")
    return limit


def validate_metadata(metadata: object) -> dict[str, MetadataValue]:
    """Return a copy of ``metadata`` if it is a flat dict of JSON scalars with simple keys."""
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(
            f"metadata must be a mapping of names to JSON scalars, got {type(metadata).__name__}"
        )
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidInputError(f"metadata has more than {MAX_METADATA_KEYS} keys")
    out: dict[str, MetadataValue] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not _METADATA_KEY.match(key):
            raise InvalidInputError(
                f"metadata key {key!r} is invalid: use letters, digits, '_', '.', '-' "
                "(starting with a letter or '_', at most 64 characters)"
            )
        if value is not None and not isinstance(value, (str, int, float, bool)):
            raise InvalidInputError(
                f"metadata[{key!r}] must be a JSON scalar (str, int, float, bool or None), "
                f"got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(f"metadata[{key!r}] must be a finite number")
        if isinstance(value, int) and not isinstance(value, bool) and (
            abs(value) > MAX_SAFE_INT
        ):
            raise InvalidInputError(
                f"metadata[{key!r}] is beyond ±2**53, where numbers lose precision; "
                "store it as a string"
            )
        if isinstance(value, str) and len(value) > 2_000:
            raise InvalidInputError(f"metadata[{key!r}] is longer than 2000 characters")
        if isinstance(value, str):
            check_unicode(value, f"metadata[{key!r}]")
        out[key] = value
    return out


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


Unit = Annotated[float, Field(ge=0.0, le=1.0)]
#: What a memory is: a fact, a conversation turn, a summary of turns (an episode), or a procedure
#: (how-to steps that worked, e.g. "to reset the router: hold the button 10 s, then ...").
Kind = Literal["fact", "turn", "summary", "procedure"]
#: The sections of a context, in the order they are rendered.
Section = Literal["facts", "relations", "procedures", "episodes", "memories"]
#: The file formats a user's entity graph is exported in (see :meth:`Memory.export_graph`).
GraphFormat = Literal["node-link", "graphml", "gexf"]
#: Each graph export format and the media type a file in it is served as.
GRAPH_FORMATS: dict[str, str] = {
    "node-link": "application/json",
    "graphml": "application/graphml+xml",
    "gexf": "application/gexf+xml",
}


class MemoryItem(_Model):
    """One stored memory: a fact, a conversation turn, a summary or a procedure, with its lifecycle
    fields.

    The lifecycle fields (``valid_from``, ``invalid_at``, ``superseded_by``, ``expires_at``, access
    counters) exist from the start so that dedup, supersession and decay need no migration.
    """

    id: str
    user_id: str
    text: str
    kind: Kind = "fact"
    category: str = "general"
    importance: Unit = 0.5
    confidence: Unit = 1.0
    source: str = "user"
    created_at: datetime
    updated_at: datetime
    valid_from: datetime | None = None
    invalid_at: datetime | None = None
    superseded_by: str | None = None
    expires_at: datetime | None = None
    mention_count: int = 1
    access_count: int = 0
    last_accessed_at: datetime | None = None
    needs_extraction: bool = False
    extractor: str | None = None
    key: str | None = None  # set by Memory.remember(): one current value per key
    metadata: dict[str, MetadataValue] = Field(default_factory=dict)
    #: The entities and relations the caller stated with the memory (kept so that a re-extraction
    #: or a merge that rewrites the text cannot lose them); None when the caller stated none.
    knowledge: Knowledge | None = None

    @property
    def is_current(self) -> bool:
        """True unless the memory was superseded or invalidated."""
        return self.invalid_at is None and self.superseded_by is None

    def __repr__(self) -> str:
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"MemoryItem(id={self.id[:8]}, category={self.category!r}, text={text!r})"

    __str__ = __repr__


class HistoryEvent(_Model):
    """One change to a memory: what happened, when and why (the audit log)."""

    id: str = Field(default_factory=lambda: new_id())
    memory_id: str | None = None
    action: Literal[
        "add", "merge", "update", "supersede", "expire", "delete", "import", "access"
    ]
    at: datetime = Field(default_factory=lambda: utcnow())
    cause: str = ""
    text: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)

    def __repr__(self) -> str:
        return f"HistoryEvent({self.action} {self.memory_id} at {self.at:%Y-%m-%d %H:%M} {self.cause!r})"


class ScoreBreakdown(_Model):
    """The signals that made a hit's score; ``None`` means the signal did not find this memory."""

    vector: float | None = None  # cosine similarity
    vector_rank: int | None = None  # 1-based
    lexical: float | None = None  # bm25 score (higher is better)
    lexical_rank: int | None = None
    graph: float | None = None  # proximity in (0, 1]: 1 / (1 + hops), damped
    graph_hops: int | None = None
    graph_path: str | None = None  # e.g. "client_123 -bought-> ROG laptop"
    recency: float | None = None  # 0.5 ** (days since the last write / half_life)
    age_days: float | None = None
    frequency: float | None = None  # log-scaled restatements + accesses, in [0, 1]
    importance: float | None = None
    confidence: float | None = None
    fused: float = 0.0


class Hit(_Model):
    """A search result: the memory, its final score and why it was chosen."""

    item: MemoryItem
    score: float
    breakdown: ScoreBreakdown = Field(default_factory=ScoreBreakdown)
    why: str = ""

    def __repr__(self) -> str:
        return f"Hit(score={self.score:.3f}, item={self.item!r}, why={self.why!r})"

    __str__ = __repr__


class Entity(_Model):
    """An entity found in text; ``name`` is the surface form, the graph canonicalises it."""

    name: str = Field(min_length=1, max_length=200)
    type: str = "thing"


class Relation(_Model):
    """A directed relation ``subject -predicate-> object`` with the extractor's confidence."""

    subject: str = Field(min_length=1, max_length=200)
    predicate: str = Field(min_length=1, max_length=100)
    object: str = Field(min_length=1, max_length=200)
    confidence: Unit = 1.0

    def __repr__(self) -> str:
        return f"Relation({self.subject} -{self.predicate}-> {self.object})"


def _caller_name(value: str, what: str, limit: int) -> str:
    """A name the caller states (an entity, a relation end, a predicate, a type): non-blank, at
    most ``limit`` characters of valid Unicode, no control or bidi characters — it becomes a node
    of the graph and is printed in paths and ``why``."""
    if not value.strip():
        raise InvalidInputError(f"{what} must not be empty or blank")
    if len(value) > limit:
        raise InvalidInputError(f"{what} {value[:40]!r}... is longer than {limit} characters")
    check_unicode(value, what)
    if _FORBIDDEN_ID.search(value):
        raise InvalidInputError(f"{what} {value!r} must not contain control or bidi characters")
    return value


def _as_entity(value: object) -> object:
    """A bare name stands for ``{"name": name}``."""
    return {"name": value} if isinstance(value, str) else value


def _as_relation(value: object) -> object:
    """A ``[subject, predicate, object]`` triple stands for the relation it spells."""
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return dict(zip(("subject", "predicate", "object"), value))
    return value


def _check_entities(entities: list[Entity]) -> list[Entity]:
    for e in entities:
        _caller_name(e.name, "entity name", MAX_NAME_CHARS)
        _caller_name(e.type, "entity type", MAX_PREDICATE_CHARS)
    return entities


def _check_relations(relations: list[Relation]) -> list[Relation]:
    for r in relations:
        _caller_name(r.subject, "relation subject", MAX_NAME_CHARS)
        _caller_name(r.predicate, "relation predicate", MAX_PREDICATE_CHARS)
        _caller_name(r.object, "relation object", MAX_NAME_CHARS)
    return relations


#: Entities a caller states: at most :data:`MAX_ENTITIES`, each a name or ``{"name", "type"}``.
CallerEntities = Annotated[
    list[Annotated[Entity, BeforeValidator(_as_entity)]],
    Field(max_length=MAX_ENTITIES), AfterValidator(_check_entities),
]
#: Relations a caller states: at most :data:`MAX_RELATIONS`, each ``{"subject", "predicate",
#: "object"}`` (optionally ``confidence``) or a ``[subject, predicate, object]`` triple.
CallerRelations = Annotated[
    list[Annotated[Relation, BeforeValidator(_as_relation)]],
    Field(max_length=MAX_RELATIONS), AfterValidator(_check_relations),
]


class Knowledge(_Model):
    """What a caller who already knows the entities (a catalogue, a CRM) states with a memory.

    It joins the graph exactly as an extraction does — the same name resolution, the memory as
    the evidence — and is merged with what the extractor finds in the text (the caller's types
    first). Limits: :data:`MAX_ENTITIES` entities and :data:`MAX_RELATIONS` relations, names of
    at most :data:`MAX_NAME_CHARS` characters, no control or bidi characters."""

    entities: CallerEntities = Field(default_factory=list)
    relations: CallerRelations = Field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.entities or self.relations)

    def __or__(self, other: Knowledge | None) -> Knowledge:
        """Both statements, each entity and relation once (the first type given wins). What a
        memory holds stays within the limits: a union beyond them is refused
        (:class:`InvalidInputError`), before anything is written."""
        if not other:
            return self
        entities = _unique(self.entities, other.entities, lambda e: e.name)
        relations = _unique(self.relations, other.relations,
                            lambda r: (r.subject, r.predicate, r.object))
        if len(entities) > MAX_ENTITIES or len(relations) > MAX_RELATIONS:
            raise InvalidInputError(
                f"the memory this repeats would hold {len(entities)} stated entities and "
                f"{len(relations)} relations, more than {MAX_ENTITIES} and {MAX_RELATIONS}; "
                "state the new ones with a memory of their own")
        return Knowledge(entities=entities, relations=relations)

    def over(self, extraction: Extraction) -> Extraction:
        """``extraction`` with this knowledge merged in, the caller's statements first (so a new
        node takes the caller's type)."""
        if not self:
            return extraction
        return extraction.model_copy(update={
            "entities": [*self.entities, *extraction.entities],
            "relations": [*self.relations, *extraction.relations],
        })


def _unique(first: Sequence[Any], second: Sequence[Any], key: Any) -> list[Any]:
    seen: dict[Any, Any] = {}
    for value in [*first, *second]:
        seen.setdefault(key(value), value)
    return list(seen.values())


class GraphPath(_Model):
    """One path between two entities of a user's graph: its entities in order and, per hop, the
    predicates of the edge (in the edge's own direction, which ``edges`` shows)."""

    entities: list[str]
    predicates: list[list[str]]
    edges: list[str]  # "Alice -bought-> ROG laptop", one per hop

    @property
    def hops(self) -> int:
        return len(self.edges)

    def __repr__(self) -> str:
        return f"GraphPath({' | '.join(self.edges)})"

    __str__ = __repr__


class GraphEntity(Entity):
    """A node of a user's graph: the entity, its canonical ``key``, the surface forms it was seen
    under and the memories that mention it."""

    name: str = Field(min_length=1)
    key: str
    aliases: list[str] = Field(default_factory=list)
    memory_ids: list[str] = Field(default_factory=list)
    mentions: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None

    def __repr__(self) -> str:
        return f"GraphEntity({self.name!r}, type={self.type!r}, mentions={self.mentions})"


class GraphRelation(Relation):
    """An edge of a user's graph for one predicate, with its nodes' keys and supporting memories
    (``confidence`` is the highest any of them gave)."""

    subject: str = Field(min_length=1)
    object: str = Field(min_length=1)
    subject_key: str
    object_key: str
    memory_ids: list[str] = Field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.subject} -{self.predicate}-> {self.object}"


class UserStats(_Model):
    """What :meth:`Memory.stats` counts for one user."""

    user_id: str
    memories: int  # current and superseded
    current: int
    entities: int
    relations: int  # one per (edge, predicate)
    #: an erasure in this data dir (any user's) awaits the background purge (see purge_delay)
    purge_pending: bool = False


class Usage(_Model):
    """Token usage reported by an endpoint (zeros for offline work)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            total_tokens=self.total_tokens + other.total_tokens,
        )


class MemoryStatus(_Model):
    """What :meth:`Memory.status` reports of a Memory as a whole, for a service's metrics:
    counts only, never a user id or any stored text."""

    #: users whose memories the vector store holds open now (None: the store does not say)
    open_users: int | None = None
    #: reads the vector store's in-memory record copy answered, and those it could not
    #: (None: no copy, as with a Chroma server)
    record_cache_hits: int | None = None
    record_cache_misses: int | None = None
    #: an erasure in the data dir awaits the background purge (see purge_delay)
    purge_pending: bool = False
    #: token usage of every model call so far (see :attr:`Memory.usage`)
    usage: Usage = Field(default_factory=Usage)


class Extraction(_Model):
    """What an extractor found in one text. ``extractor`` names who found it (shown in ``why``)."""

    entities: list[Entity] = Field(default_factory=list)
    relations: list[Relation] = Field(default_factory=list)
    extractor: str = "none"
    usage: Usage = Field(default_factory=Usage)


class ContextLine(_Model):
    """One line of a built context, with the memory it came from and why it was chosen."""

    section: Section
    text: str
    memory_id: str | None = None
    why: str = ""
    tokens: int = 0


class Context(_Model):
    """A context string that fits a token budget; ``tokens`` is its exact tiktoken count."""

    text: str
    tokens: int
    max_tokens: int
    lines: list[ContextLine] = Field(default_factory=list)
    encoding: str = "o200k_base"

    def __repr__(self) -> str:
        return f"Context(tokens={self.tokens}/{self.max_tokens}, lines={len(self.lines)})"

    __str__ = __repr__


class ChatReply(_Model):
    """The model's answer, the context that was sent with it, and the token usage."""

    text: str
    context: Context
    usage: Usage = Field(default_factory=Usage)
    model: str = ""

    def __repr__(self) -> str:
        text = self.text if len(self.text) <= 60 else self.text[:57] + "..."
        return f"ChatReply(model={self.model!r}, text={text!r}, usage={self.usage.total_tokens})"


#: A memory text, a query or a message: non-blank, at most :data:`MAX_TEXT_CHARS`, no NUL.
Text = Annotated[str, AfterValidator(validate_text)]
#: A flat dict of JSON scalars with simple keys (see :func:`validate_metadata`).
Metadata = Annotated[dict[str, MetadataValue], BeforeValidator(validate_metadata)]
#: A category or source label.
Label = Annotated[
    str, Field(min_length=1, max_length=64), AfterValidator(lambda v: check_unicode(v, "label"))
]
#: A time; naive times are taken as UTC.
UtcTime = Annotated[datetime, AfterValidator(as_utc)]


class AddRequest(BaseModel):
    """Validated input of :meth:`Memory.add` (also the REST body of one memory)."""

    model_config = ConfigDict(extra="forbid")

    text: Text
    kind: Kind = "fact"
    category: Label = "general"
    importance: Unit = 0.5
    confidence: Unit = 1.0
    source: Label = "user"
    created_at: UtcTime | None = None
    expires_at: UtcTime | None = None
    metadata: Metadata = Field(default_factory=dict)
    #: What the caller knows the text is about, merged with what the extractor finds (see
    #: :class:`Knowledge`): entities as names or ``{"name", "type"}``, relations as
    #: ``{"subject", "predicate", "object"}`` or ``[subject, predicate, object]``.
    entities: CallerEntities = Field(default_factory=list)
    relations: CallerRelations = Field(default_factory=list)

    @property
    def knowledge(self) -> Knowledge | None:
        """The caller's entities and relations, None when it stated none."""
        if not (self.entities or self.relations):
            return None
        return Knowledge(entities=self.entities, relations=self.relations)


class UpdateRequest(BaseModel):
    """Validated input of :meth:`Memory.update` (also its REST body): the fields to change; those
    left out (or None) keep their value. ``metadata`` replaces the whole dict."""

    model_config = ConfigDict(extra="forbid")

    text: Text | None = None
    category: Label | None = None
    importance: Unit | None = None
    confidence: Unit | None = None
    metadata: Metadata | None = None
    expires_at: UtcTime | None = None


def to_request(item: object) -> AddRequest:
    """One memory to add — a text, a dict of :meth:`Memory.add`'s fields or an AddRequest —
    validated, or :class:`InvalidInputError` naming the field."""
    if isinstance(item, AddRequest):
        return item
    if isinstance(item, str):
        item = {"text": item}
    if not isinstance(item, Mapping):
        raise InvalidInputError("each memory must be a text or a dict with a 'text' field")
    try:
        return AddRequest.model_validate({k: v for k, v in item.items() if v is not None})
    except ValidationError as exc:
        raise InvalidInputError(pydantic_message(exc.errors())) from exc


def pydantic_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """Pydantic's error list (``exc.errors()``) as one readable line ("field: problem; ...")."""
    parts = []
    for e in errors:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{loc}: {e.get('msg', '')}" if loc else str(e.get("msg", "")))
    return "; ".join(parts)
