"""RuleExtractor: offline, deterministic entity and relation extraction with regular expressions.

It runs on every ``add``, so it must be fast (tens of microseconds a sentence), with no model and no
network. It is *approximate* by design: it finds capitalised and product-like spans, dates, amounts
and a fixed set of first- and third-person relations ("I bought X", "X pairs well with Y", ...).
It misses paraphrases and can mistype entities; the LLM extractor is the upgrade when an endpoint
is configured.

How it reads a sentence: the entities come from :mod:`~hybridmem.extract.spans` (dates and
amounts, then names and products), the topic phrases from :mod:`~hybridmem.extract.concepts`.
Relations hang on a fixed verb table (:data:`~hybridmem.extract.lexicon.VERB_TABLE`): "I/we
<verb>" or a verb opening the sentence use the speaker as subject; otherwise the subject is the
name or short noun phrase just before the verb, or the last product for "it". Objects are cut at
the first clause boundary, lose their determiners and keep their last six words. Negated likes
become "dislikes"; other negated facts are skipped.

Names are compared by :func:`hybridmem.text.entity_key`, the graph's node key: "the ROG laptop"
and "ROG Laptop." are one entity here exactly when they are one node there.

- :class:`RuleExtractor` — the extractor: speakers, entities, vocatives, relations.
- :func:`_clean_object` — the object noun phrase after a verb.
- :func:`_subject_np` — the third-person subject just before a verb.
- :func:`_object_type` — the entity type of an object, from the spans and the predicate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hybridmem.extract.concepts import concepts
from hybridmem.extract.lexicon import (
    APPROX,
    BRANDS,
    CLAUSE_BREAK,
    CLOSES,
    CUT,
    DET,
    FIRST,
    GREETING,
    I_END,
    IS_OBJECT,
    JUNK,
    LEAD,
    MY_ATTR,
    NEGATION,
    NOT_SPEAKERS,
    OBJECT_PREFIX,
    PRODUCT_NOUNS,
    PRONOUNS,
    SENTENCE,
    SPEAKER,
    STARTERS,
    THIRD,
    TRAILING,
    VERB,
    WOULD,
)
from hybridmem.extract.spans import Span, find_masks, find_spans
from hybridmem.models import Entity, Extraction, Relation
from hybridmem.text import entity_key, predicate_key

__all__ = ["RuleExtractor"]

#: An object keeps its last words, up to this many (the head noun is last).
_MAX_OBJECT_WORDS = 6
#: The longest entity name, in characters.
_MAX_NAME = 200
#: The entity type a predicate gives its object ("lives_in" a place).
_PRED_TYPE = {"lives_in": "place", "works_at": "org", "name": "person"}
#: A relation's confidence by how its subject was found.
_CONFIDENCE = {"first": 0.9, "elliptic": 0.7, "third": 0.6, "it": 0.5}


def _clean_object(rest: str) -> str | None:
    """The object noun phrase: cut at a clause boundary, no determiners, its last 6 words."""
    rest = OBJECT_PREFIX.sub("", rest)
    cut = CUT.search(rest)
    words = (rest[: cut.start()] if cut else rest).split()
    while words and words[0].lower() in DET | APPROX:
        words = words[1:]
    words = [w.strip("\"'“”‘’.") for w in words[-_MAX_OBJECT_WORDS:]]  # the head noun is last
    while words and words[-1].lower() in DET | TRAILING:
        words.pop()

    if (
        not words
        or words[0].lower() in {"to", "not", "be", "been", "no", "any", "got"}
        or all(w.lower() in PRONOUNS for w in words)
    ):
        return None
    if len(words) == 1 and words[0].lower() in STARTERS:
        return None
    text = " ".join(w for w in words if w)
    return text[:_MAX_NAME] or None


def _subject_np(
    sentence: str, clause_start: int, verb_start: int, spans: list[Span]
) -> Span | None:
    """The third-person subject just before a verb: a known span, else the last short phrase."""
    for s in reversed(spans):
        if (
            clause_start <= s.start
            and s.end <= verb_start
            and not sentence[s.end : verb_start].strip()
        ):
            return s

    words = sentence[clause_start:verb_start].split()[-4:]
    dets = [k for k, w in enumerate(words) if w.lower() in DET]
    if dets:
        words = words[dets[-1] + 1 :]
    words = [w.strip("\"'“”.") for w in words]
    if not words or any(w.lower() in PRONOUNS or w.lower() in STARTERS for w in words):
        return None
    if not all(w.replace("-", "").isalnum() for w in words):
        return None
    return Span(verb_start, verb_start, " ".join(words), "thing")


def _object_type(obj: str, pred: str, spans: Sequence[Span]) -> str:
    """The entity type of an object: its span's, unless the predicate implies one, else a guess."""
    low, key = obj.lower(), entity_key(obj)
    implied = _PRED_TYPE.get(pred)
    for s in spans:
        if entity_key(s.text) == key:
            if implied and s.type in {"thing", "person", "place", "org"}:
                return implied
            return s.type

    words = low.split()
    if any(ch.isdigit() for ch in low) or words[-1] in PRODUCT_NOUNS or words[0] in BRANDS:
        return "product"
    return implied or "thing"


class RuleExtractor:
    """The offline :class:`~hybridmem.protocols.Extractor`: regexes only, approximate and fast.

    ``speaker`` is the subject of first-person statements ("I bought X" -> speaker -bought-> X);
    without one, a leading ``"Name: "`` (a conversation turn) names the speaker, else ``"user"``.
    A turn's named speaker is an entity of it (``speakers``), so what a person said links to them
    even when no relation mentions them; a name that is only the person addressed ("Thanks, Mel!")
    is not an entity of the turn: it says who listened, not what the turn is about.
    """

    name = "rules"
    offline = True

    def __init__(self, *, concepts: bool = True, speakers: bool = True) -> None:
        #: Also emit topic phrases ("pottery class") as ``concept`` entities (see :func:`concepts`).
        self.concepts = concepts
        #: Link a turn to its "Name: " speaker, and drop names only addressed (see above).
        self.speakers = speakers

    def extract(self, text: str, *, speaker: str | None = None) -> Extraction:
        """Entities (with types) and relations found in ``text``; never raises on odd input."""
        m = SPEAKER.match(text)
        turn_of: str | None = None
        if (
            m
            and m.group(1).lower() not in NOT_SPEAKERS
            and (speaker is None or entity_key(speaker) == entity_key(m.group(1)))
        ):
            speaker, text, turn_of = m.group(1), m.group(2), m.group(1)
        elif m and m.group(1).lower() in JUNK:
            text = m.group(2)  # "Agent: ..." said by the assistant: the label is a role, not a name
        elif speaker and text.casefold().startswith(speaker.casefold() + ":"):
            text = text[len(speaker) + 1 :].lstrip()  # "client_123: ..." (a lower-case id)
        who = (speaker or "user").strip()[:_MAX_NAME] or "user"

        entities: dict[str, Entity] = {}
        relations: dict[tuple[str, str, str], Relation] = {}
        endpoints: set[str] = set()
        last_product: str | None = None  # what "it" most likely means in the next sentence
        addressed: set[str] = set()  # keys only ever used as a vocative
        mentioned: set[str] = set()  # keys used otherwise at least once

        def entity(name: str, type_: str, force: bool = False) -> None:
            key = entity_key(name)
            old = entities.get(key)
            if old is None or force or (old.type == "thing" and type_ != "thing"):
                entities[key] = Entity(name=name, type=type_)

        def relate(subj: str, pred: str, obj: str, conf: float) -> None:
            s_key, o_key = entity_key(subj), entity_key(obj)
            if s_key != o_key:
                relations.setdefault(
                    (s_key, pred, o_key),
                    Relation(subject=subj, predicate=pred, object=obj, confidence=conf),
                )
                endpoints.update((s_key, o_key))

        for sentence in SENTENCE.split(text):
            if not sentence.strip():
                continue
            masks = find_masks(sentence)
            spans = find_spans(sentence, masks)

            for s in masks + spans:
                entity(s.text, s.type, False)
                if self.speakers and s.type in {"person", "thing"}:
                    before, after = sentence[: s.start], sentence[s.end :]
                    vocative = CLOSES.match(after[:1] or " ") is not None and (
                        (GREETING.match(before) is not None and before.strip() != "")
                        or (before.rstrip().endswith(",") and CLOSES.match(after) is not None)
                    )
                    (addressed if vocative else mentioned).add(entity_key(s.text))

            if self.concepts:
                for phrase in concepts(sentence, STARTERS):
                    if entity_key(phrase) not in entities:
                        entity(phrase, "concept", False)

            self._relations(sentence, who, masks, spans, entity, relate, last_product)
            last_product = next(
                (e.name for e in reversed(entities.values()) if e.type == "product"), last_product
            )

        for key in addressed - mentioned - endpoints:
            entities.pop(key, None)
        if turn_of is not None and self.speakers:
            entity(turn_of, "person", True)
            endpoints.add(entity_key(turn_of))

        # A span inside a longer entity of the same text ("LGBTQ" in "LGBTQ support group") is
        # noise. This asks whether the words are *written* inside another name, not whether two
        # names are one entity, so it reads the surface forms: "Alice" is not a piece of
        # "Alice's laptop", although the key of the latter is "alice laptop".
        surface = {k: e.name.lower() for k, e in entities.items()}
        kept = [
            e
            for k, e in entities.items()
            if k in endpoints
            or not any(
                k != o and f" {surface[k]} " in f" {name} " for o, name in surface.items()
            )
        ]
        return Extraction(entities=kept, relations=list(relations.values()), extractor=self.name)

    @staticmethod
    def _relations(
        sentence: str,
        who: str,
        masks: list[Span],
        spans: list[Span],
        entity: Callable[[str, str, bool], None],
        relate: Callable[[str, str, str, float], None],
        earlier_product: str | None,
    ) -> None:
        """Verb-anchored relations of one sentence (first person, elliptic, third person)."""
        last_subject: tuple[str, str] | None = None
        lead = LEAD.match(sentence)
        lead_end = lead.end() if lead else 0

        for vm in VERB.finditer(sentence):
            form = " ".join(vm.group(1).lower().split())
            clause = 0
            for b in CLAUSE_BREAK.finditer(sentence, 0, vm.start()):
                clause = b.end()
            prefix = sentence[clause : vm.start()]

            # The subject: the speaker, the previous subject, "my <attribute>", a noun phrase
            # before the verb, or the last product for "it".
            subj: tuple[str, str] | None = None
            kind = "third"
            if form in FIRST and I_END.search(prefix):
                subj, kind = (who, "person"), "first"
            elif form in FIRST and vm.start() == lead_end and form not in {"am", "is"}:
                subj, kind = (who, "person"), "elliptic"
            elif form in THIRD:
                if not prefix.strip() and clause > 0 and last_subject is not None:
                    subj = last_subject  # "..., and returned the mouse"
                elif (my := MY_ATTR.search(prefix)) and THIRD[form] == "is":
                    subj, kind = (who, "person"), "my:" + predicate_key(my.group(1))
                else:
                    np = _subject_np(sentence, clause, vm.start(), spans)
                    subj = (np.text, np.type) if np else None
                    if np is None and prefix.strip().lower() == "it":
                        before = [
                            x.text for x in spans if x.type == "product" and x.end <= vm.start()
                        ]
                        it = before[-1] if before else earlier_product
                        subj, kind = ((it, "product"), "it") if it else (None, kind)
            if subj is None:
                continue
            last_subject = subj

            # The predicate, turned by "my", a negation or "would".
            pred = FIRST[form] if kind in {"first", "elliptic"} else THIRD[form]
            if kind.startswith("my:"):
                pred, kind = kind[3:], "first"
            neg = NEGATION.search(prefix)
            if neg:
                if pred not in {"likes", "loves", "prefers"}:
                    continue
                pred = "dislikes"
            if pred in {"likes", "loves"} and WOULD.search(prefix):
                pred = "wants"

            # The object: a date or amount right after the verb, else the cleaned phrase.
            rest = sentence[vm.end() :]
            mask = next((s for s in masks if s.start == vm.end()), None)
            obj = mask.text if mask else _clean_object(rest)
            if obj is None:
                continue
            if pred == "is" and not (mask or IS_OBJECT.match(rest)):
                continue  # "X is great" is an opinion, not a fact worth a node
            otype = mask.type if mask else _object_type(obj, pred, masks + spans)

            entity(subj[0], subj[1], False)
            entity(obj, otype, pred in _PRED_TYPE)
            relate(subj[0], pred, obj, _CONFIDENCE[kind] if pred != "is" else 0.5)
            if pred in {"bought", "returned"}:
                after = [s for s in masks if s.start >= vm.end()]
                price = next((s for s in after if s.type == "amount"), None)
                when = next((s for s in after if s.type == "date"), None)
                if price:
                    relate(obj, "price", price.text, 0.6)
                if when:
                    relate(obj, f"{pred}_on", when.text, 0.6)
