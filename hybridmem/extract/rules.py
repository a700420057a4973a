"""RuleExtractor: offline, deterministic entity and relation extraction with regular expressions.

It runs on every ``add``, so it must be fast (tens of microseconds a sentence), with no model and no
network. It is *approximate* by design: it finds capitalised and product-like spans, dates, amounts
and a fixed set of first- and third-person relations ("I bought X", "X pairs well with Y", ...).
It misses paraphrases and can mistype entities; the LLM extractor is the upgrade when an endpoint
is configured.

How it reads a sentence: dates and amounts are masked first; capitalised runs become names, with
a sentence-initial word kept only when it does not look like a verb or filler ("Bought a ...");
runs with digits, camel case or a product noun become products ("Dell 4K monitor", "iPhone 15").
Relations hang on a fixed verb table: "I/we <verb>" or a verb opening the sentence use the speaker
as subject; otherwise the subject is the name or short noun phrase just before the verb, or the
last product for "it". Objects are cut at the first clause boundary, lose their determiners and
keep their last six words. Negated likes become "dislikes"; other negated facts are skipped.

Names are compared by :func:`hybridmem.text.entity_key`, the graph's node key: "the ROG laptop"
and "ROG Laptop." are one entity here exactly when they are one node there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hybridmem.extract.concepts import concepts
from hybridmem.models import Entity, Extraction, Relation
from hybridmem.text import entity_key, predicate_key

__all__ = ["RuleExtractor"]

_MAX_OBJECT_WORDS = 6
_MAX_NAME = 200


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_DET = _words(
    "a an the my our your his her their new brand-new some this that these those another its "
    "latest old"
)
_PRONOUNS = _words(
    "i me you he him she her it we us they them this that these those there here one something "
    "anything everything nothing someone somebody everyone what which who whom myself itself more "
    "lot lots all both each"
)
_COMMON = _words(
    "and but or so if when while then also just yes no not ok okay hi hello hey thanks "
    "thank please yesterday today tomorrow tonight last next oh well wow why how where "
    "after before because since although maybe actually really sure great good nice anyway "
    "btw lol let let's do does did is are was were have has had can could would should will "
    "i'm i've i'd i'll it's that's there's what's got get bought buy love loved need needed "
    "want wanted went go like liked hate prefer returned ordered purchased visited moved "
    "live lived working work finally recently still even only every any many most much such "
    "dear sorry hmm um"
)
#: Words that end an object without belonging to it ("I live in Berlin now").
_TRAILING = _words(
    "of to a now today anymore again too yet already lately currently instead either as well "
    "these days nowadays here there though"
)
#: Imperative verbs that open instructions ("Turn off ...", "Try the ...") without being names.
_IMPERATIVES = _words(
    "turn try check make sure use open close press hold restart reset update install remove "
    "plug unplug connect disconnect switch set keep send call email contact click select choose "
    "go see look note add put take bring let"
)
#: Capitalised words that start sentences (or follow "I") without being names.
_STARTERS = (_DET - {"new", "old", "latest", "brand-new"}) | _PRONOUNS | _COMMON | _IMPERATIVES
_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December|"
    "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
_CALENDAR = _words(
    _MONTHS.lower().replace("|", " ") + " monday tuesday wednesday thursday friday saturday sunday"
)
_PRODUCT_NOUNS = _words(
    "laptop laptops notebook monitor monitors display screen tv television phone phones smartphone "
    "tablet mouse mice keyboard keyboards headphones headphone headset earbuds earphones speakers "
    "camera lens printer router console controller watch smartwatch charger cable dock ssd gpu "
    "cpu chair desk lamp bike car shoes sneakers jacket bag backpack vacuum fridge blender kettle "
    "drone mic microphone webcam projector ereader kindle stand hub adapter case"
)
_BRANDS = _words(
    "apple samsung sony dell hp lenovo asus acer msi logitech razer corsair microsoft google "
    "amazon nintendo lg bose jbl canon nikon xiaomi huawei oneplus nvidia amd intel rog alienware "
    "philips dyson ikea nike adidas steelseries hyperx benq viewsonic garmin fitbit gopro anker"
)
_ORG_SUFFIX = _words(
    "inc ltd llc corp corporation company co gmbh sa group bank university college school hospital "
    "institute foundation agency studio studios labs technologies airlines"
)
#: Names that are roles, units or fillers, never entities ("Agent", "GHz", "We've").
_JUNK = _words(
    "agent user assistant customer client support admin bot system team staff operator rep "
    "representative moderator hz khz mhz ghz w kw v mah wh gb tb mb kb mm cm km kg lb lbs oz "
    "ms fps mp px dpi rpm inch inches ft we've we'll we're we'd you've you'll you're they've "
    "they'll they're he's she's i'll i'd let's"
)
_PLACE_CUES = _words("in from near visited visiting visit around across")
_PERSON_CUES = _words(
    "with named called friend sister brother mom dad mother father wife husband mr mrs ms dr met "
    "told asked hey hi hello thanks dear"
)
_PERSON_NEXT = _words("is was has had said says told went and 's will can")
_VERBISH_NEXT = _words(
    "a an the my your our his her their some it me you him them this that to up out"
)

_DATE = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b\.?(?:,?\s+\d{{4}}\b)?"
    rf"|\b(?:{_MONTHS})\b\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?\s+\d{{4}}\b)?"
    rf"|\b(?:{_MONTHS})\s+\d{{4}}\b"
)
_AMOUNT = re.compile(
    r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|K|m|M|bn)\b)?"
    r"|\b\d[\d,]*(?:\.\d+)?\s?(?:(?:USD|EUR|GBP|JPY|CHF|CAD|AUD|dollars?|euros?|pounds?|bucks)\b|[€£])"
)
_SPEAKER = re.compile(r"^\s*([A-Z][\w'.-]*(?:[ \t]+[A-Z][\w'.-]*){0,2})[ \t]*:\s+(\S.*)$", re.S)
_NOT_SPEAKERS = _words(
    "note update re fwd ps q a edit warning tip summary subject title answer question important "
    "example step tldr"
)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
# A name that is only the person spoken to ("Thanks, Mel!", "Hey Jon, ..."), an English vocative:
# after an opening greeting, or after a comma at the end of the sentence.
_GREETING = re.compile(
    r"^\W*(?:(?:hi|hey|hello|hiya|yo|dear|thanks|thank\s+you|thx|bye|goodbye|congrats|"
    r"congratulations|cheers|welcome|wow|whoa|oh|ah|aw+|yes|yeah|yep|no|nope|sure|sorry|ok|okay|"
    r"great|awesome|haha|lol|good\s+(?:morning|afternoon|evening|night|luck|job))\b"
    r"(?:\s+(?:so\s+much|a\s+lot|again|too))?[\s,!.]*)+$",
    re.I,
)
_CLOSES = re.compile(r"^[\s!?.,]*$")
_TOKEN = re.compile(r"[^\W_][\w'’&+.-]*[\w+]|[^\W_]")
_CUT = re.compile(
    r"[,;:!?()\"$€£]|\.(?:\s|$)|\s(?:and|but|because|for|since|so|which|who|that|when|while|with|"
    r"from|at|in|on|as|if|until|after|before|to|or|over|than|instead|like|yesterday|today|"
    r"tomorrow|last|next|this\s+(?:week|month|year|morning|evening))\b",
    re.I,
)
_CLAUSE_BREAK = re.compile(
    r"[,;:()]|\b(?:and|but|because|that|which|who|so|when|while|although|though|if|then)\b", re.I
)
_ADV = (
    r"(?:am|'m|’m|have|'ve|’ve|had|'d|’d|was|will|would|just|really|also|recently|finally|"
    r"actually|totally|absolutely|definitely|still|already|never|always|usually|often|do|did|"
    r"don't|don’t|didn't|didn’t|do\s+not|did\s+not|no\s+longer|not|now|currently|truly)"
)
_I_END = re.compile(rf"(?:^|\s)(?:I|we)(?:'m|’m|'ve|’ve|'d|’d)?(?:\s+{_ADV})*\s*$", re.I)
_NEGATION = re.compile(r"n't|n’t|\bnot\b|\bnever\b|\bno\s+longer\b", re.I)
_WOULD = re.compile(r"(?:'d|’d|\bwould)(?:\s+really)?\s*$", re.I)
_MY_ATTR = re.compile(r"(?:^|\s)[Mm]y\s+([a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,3})\s*$")

# predicate: (first-person forms, third-person forms), comma-separated verb phrases.
_VERB_TABLE: tuple[tuple[str, str, str], ...] = (
    ("bought", "bought,buy,purchased,ordered,got,picked up", "bought,purchased,ordered,buys"),
    (
        "lives_in",
        "live in,lived in,living in,moved to,move to,relocated to,reside in,based in",
        "lives in,lived in,moved to,moves to,resides in,relocated to,is based in",
    ),
    ("prefers", "prefer,preferred", "prefers,preferred"),
    ("loves", "love,loved,adore", "loves,loved,adores"),
    ("likes", "like,liked,enjoy,enjoyed", "likes,enjoys,enjoyed"),
    ("hates", "hate,hated,dislike,disliked,can't stand", "hates,hated,dislikes,disliked"),
    (
        "works_at",
        "work at,worked at,working at,work for,worked for,working for,employed at",
        "works at,worked at,works for,worked for,is employed at,is employed by",
    ),
    ("returned", "returned,return,sent back", "returned"),
    ("wants", "want,wanted,need,needed,looking for", "wants,wanted,needs,needed,is looking for"),
    ("went_to", "went to,attended,visited", "went to,attended,visited"),
    ("owns", "have,own,owned", "owns,owned"),
    ("has", "", "has,comes with,includes,features"),
    ("uses", "use,used,am using", "uses,used,is using"),
    ("recommends", "recommend,recommended,suggest,suggested", "recommends,recommended,suggests"),
    ("is", "am", "is,was"),
    (
        "complements",
        "",
        "complements,complement,pairs well with,pair well with,pairs with,"
        "pair with,goes with,go with,goes well with,go well with,works with,work with,"
        "works well with,work well with,matches,match,fits",
    ),
    ("compatible_with", "", "is compatible with,are compatible with"),
)
_FIRST: dict[str, str] = {}
_THIRD: dict[str, str] = {}
for _pred, _first, _third in _VERB_TABLE:
    _FIRST.update({f: _pred for f in _first.split(",") if f})
    _THIRD.update({f: _pred for f in _third.split(",") if f})
_VERB = re.compile(
    r"(?<![\w'’])("
    + "|".join(
        re.escape(f).replace(r"\ ", r"\s+")
        for f in sorted(set(_FIRST) | set(_THIRD), key=len, reverse=True)
    )
    + r")\s+(?=\S)",
    re.I,
)
_LEAD = re.compile(r"\s*(?:(?:just|also|finally|recently|today|yesterday|so|and|then)\s+)*", re.I)
_PRED_TYPE = {"lives_in": "place", "works_at": "org", "name": "person"}
_OBJECT_PREFIX = re.compile(r"^to\s+(?:buy|get|have|try|order|see|visit|find)\s+", re.I)
_APPROX = _words("around about approximately roughly nearly almost under over just only")
_IS_OBJECT = re.compile(r"(?:an?\s+\S|[A-Z])")
_CONFIDENCE = {"first": 0.9, "elliptic": 0.7, "third": 0.6, "it": 0.5}


@dataclass(frozen=True)
class _Span:
    start: int
    end: int
    text: str
    type: str


def _is_cap(tok: str) -> bool:
    """Capitalised, camel-cased (iPhone) or a model-like mix of letters and digits (4K, XM5)."""
    c = tok[0]
    if c.isupper():
        return tok.lower() not in {"i", "i'm", "i've", "i'd", "i'll", "i’m", "ok"}
    if c.islower():
        return any(ch.isupper() for ch in tok[1:])
    return any(ch.isalpha() for ch in tok)  # starts with a digit and has letters


def _masks(sentence: str) -> list[_Span]:
    """Dates and amounts, found first so that "May" or "1,899" never become names."""
    out = [
        _Span(m.start(), m.end(), m.group().rstrip("."), "date") for m in _DATE.finditer(sentence)
    ]
    out += [
        _Span(m.start(), m.end(), m.group(), "amount")
        for m in _AMOUNT.finditer(sentence)
        if not any(s.start <= m.start() < s.end for s in out)
    ]
    return out


def _type_run(words: list[str], prev: str, nxt: str, extended: bool) -> str:
    lower = [w.lower() for w in words]
    if extended or any(w[0].islower() or any(ch.isdigit() for ch in w) for w in words):
        return "product"
    if any(w[1:] != w[1:].lower() and not w.isupper() for w in words):
        return "product"  # PlayStation, MacBook
    if lower[-1] in _ORG_SUFFIX:
        return "org"
    if lower[0] in _BRANDS:
        return "product" if len(words) > 1 else "org"
    if prev in _PLACE_CUES:
        return "place"
    verbish = len(nxt) > 3 and nxt.endswith(("ed", "s"))
    cue = 2 <= len(words) <= 3 or prev in _PERSON_CUES or nxt in _PERSON_NEXT or verbish
    if cue and all(w.isalpha() and w[0].isupper() and w[1:].islower() for w in words):
        return "person"
    return "thing"


def _spans(sentence: str, masks: list[_Span]) -> list[_Span]:
    """Capitalised runs ("Alice Martin"), product-like runs ("Dell 4K monitor", "iPhone 15")."""
    toks = [
        m
        for m in _TOKEN.finditer(sentence)
        if not any(s.start < m.end() and m.start() < s.end for s in masks)
    ]
    words = [m.group() for m in toks]
    lows = [w.lower() for w in words]
    first = 0
    while first < len(toks) and lows[first] in {"just", "also", "so", "and", "oh", "well"}:
        first += 1

    def joined(i: int) -> bool:  # token i follows token i-1 separated by whitespace only
        return i > 0 and sentence[toks[i - 1].end() : toks[i].start()].isspace()

    out: list[_Span] = []
    i, n = 0, len(toks)
    while i < n:
        if not _is_cap(words[i]):
            i += 1
            continue
        j = i + 1
        while j < n and joined(j):
            w = words[j]
            if _is_cap(w) or (w.isdigit() and len(w) <= 4):
                j += 1
            elif (
                lows[j] in {"of", "de", "&"}
                and j + 1 < n
                and joined(j + 1)
                and _is_cap(words[j + 1])
            ):
                j += 2
            else:
                break
        start = i
        while start < j and lows[start] in _STARTERS:
            start += 1
        i = j
        if start >= j:
            continue
        run = list(range(start, j))
        extended = False
        for k in (j, j + 1):  # "ROG laptop", "Logitech wireless mouse"
            if (
                k < n
                and lows[k] in _PRODUCT_NOUNS
                and all(joined(x) and words[x].islower() for x in range(j, k + 1))
            ):
                run = list(range(start, k + 1))
                extended = True
                i = k + 1
                break
        core = [words[x] for x in run]
        if all(lows[x] in _CALENDAR for x in run):
            continue
        if not extended and all(
            not w[0].isupper() and not (w[0].islower() and not w.islower()) for w in core
        ):
            continue  # only "2nd", "10am", "4K" on their own
        prev = lows[run[0] - 1] if run[0] > 0 else ""
        nxt = lows[run[-1] + 1] if run[-1] + 1 < n else ""
        if len(run) == 1 and run[0] == first and not extended:
            low = lows[run[0]]
            if low.endswith(("ed", "ing", "ly")) or nxt in _VERBISH_NEXT:
                continue  # "Bought a ...", "Loving the ..." at a sentence start
        if all(lows[x] in _JUNK or lows[x].isdigit() for x in run):
            continue  # roles, units, bare numbers
        if len(run) == 1 and run[0] == first and not extended and lows[run[0]] not in _BRANDS:
            acts = nxt in _PERSON_NEXT or (len(nxt) > 3 and nxt.endswith(("ed", "s")))
            if not acts and words[run[0]][1:].islower():
                continue  # a capitalised sentence opener ("Found ...", "Drop ..."), not a name
        text = sentence[toks[run[0]].start() : toks[run[-1]].end()]
        if text.endswith(("'s", "’s")):
            text = text[:-2]
        out.append(
            _Span(
                toks[run[0]].start(),
                toks[run[-1]].end(),
                text,
                _type_run(core, prev, nxt, extended),
            )
        )
    return out


def _clean_object(rest: str) -> str | None:
    """The object noun phrase: cut at a clause boundary, no determiners, its last 6 words."""
    rest = _OBJECT_PREFIX.sub("", rest)
    cut = _CUT.search(rest)
    words = (rest[: cut.start()] if cut else rest).split()
    while words and words[0].lower() in _DET | _APPROX:
        words = words[1:]
    words = [w.strip("\"'“”‘’.") for w in words[-_MAX_OBJECT_WORDS:]]  # the head noun is last
    while words and words[-1].lower() in _DET | _TRAILING:
        words.pop()
    if (
        not words
        or words[0].lower() in {"to", "not", "be", "been", "no", "any", "got"}
        or all(w.lower() in _PRONOUNS for w in words)
    ):
        return None
    if len(words) == 1 and words[0].lower() in _STARTERS:
        return None
    text = " ".join(w for w in words if w)
    return text[:_MAX_NAME] or None


def _subject_np(
    sentence: str, clause_start: int, verb_start: int, spans: list[_Span]
) -> _Span | None:
    """The third-person subject just before a verb: a known span, else the last short phrase."""
    for s in reversed(spans):
        if (
            clause_start <= s.start
            and s.end <= verb_start
            and not sentence[s.end : verb_start].strip()
        ):
            return s
    words = sentence[clause_start:verb_start].split()[-4:]
    dets = [k for k, w in enumerate(words) if w.lower() in _DET]
    if dets:
        words = words[dets[-1] + 1 :]
    words = [w.strip("\"'“”.") for w in words]
    if not words or any(w.lower() in _PRONOUNS or w.lower() in _STARTERS for w in words):
        return None
    if not all(w.replace("-", "").isalnum() for w in words):
        return None
    return _Span(verb_start, verb_start, " ".join(words), "thing")


def _object_type(obj: str, pred: str, spans: Sequence[_Span]) -> str:
    low, key = obj.lower(), entity_key(obj)
    implied = _PRED_TYPE.get(pred)
    for s in spans:
        if entity_key(s.text) == key:
            if implied and s.type in {"thing", "person", "place", "org"}:
                return implied
            return s.type
    words = low.split()
    if any(ch.isdigit() for ch in low) or words[-1] in _PRODUCT_NOUNS or words[0] in _BRANDS:
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
        m = _SPEAKER.match(text)
        turn_of: str | None = None
        if (
            m
            and m.group(1).lower() not in _NOT_SPEAKERS
            and (speaker is None or entity_key(speaker) == entity_key(m.group(1)))
        ):
            speaker, text, turn_of = m.group(1), m.group(2), m.group(1)
        elif m and m.group(1).lower() in _JUNK:
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

        for sentence in _SENTENCE.split(text):
            if not sentence.strip():
                continue
            masks = _masks(sentence)
            spans = _spans(sentence, masks)
            for s in masks + spans:
                entity(s.text, s.type, False)
                if self.speakers and s.type in {"person", "thing"}:
                    before, after = sentence[: s.start], sentence[s.end :]
                    vocative = _CLOSES.match(after[:1] or " ") is not None and (
                        (_GREETING.match(before) is not None and before.strip() != "")
                        or (before.rstrip().endswith(",") and _CLOSES.match(after) is not None)
                    )
                    (addressed if vocative else mentioned).add(entity_key(s.text))
            if self.concepts:
                for phrase in concepts(sentence, _STARTERS):
                    if entity_key(phrase) not in entities:
                        entity(phrase, "concept", False)
            self._relations(sentence, who, masks, spans, entity, relate, last_product)
            last_product = next(
                (e.name for e in reversed(entities.values()) if e.type == "product"), last_product
            )
        # A span inside a longer entity of the same text ("LGBTQ" in "LGBTQ support group") is
        # noise. This asks whether the words are *written* inside another name, not whether two
        # names are one entity, so it reads the surface forms: "Alice" is not a piece of
        # "Alice's laptop", although the key of the latter is "alice laptop".
        for key in addressed - mentioned - endpoints:
            entities.pop(key, None)
        if turn_of is not None and self.speakers:
            entity(turn_of, "person", True)
            endpoints.add(entity_key(turn_of))
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
        masks: list[_Span],
        spans: list[_Span],
        entity: Callable[[str, str, bool], None],
        relate: Callable[[str, str, str, float], None],
        earlier_product: str | None,
    ) -> None:
        """Verb-anchored relations of one sentence (first person, elliptic, third person)."""
        last_subject: tuple[str, str] | None = None
        lead = _LEAD.match(sentence)
        lead_end = lead.end() if lead else 0
        for vm in _VERB.finditer(sentence):
            form = " ".join(vm.group(1).lower().split())
            clause = 0
            for b in _CLAUSE_BREAK.finditer(sentence, 0, vm.start()):
                clause = b.end()
            prefix = sentence[clause : vm.start()]
            subj: tuple[str, str] | None = None
            kind = "third"
            if form in _FIRST and _I_END.search(prefix):
                subj, kind = (who, "person"), "first"
            elif form in _FIRST and vm.start() == lead_end and form not in {"am", "is"}:
                subj, kind = (who, "person"), "elliptic"
            elif form in _THIRD:
                if not prefix.strip() and clause > 0 and last_subject is not None:
                    subj = last_subject  # "..., and returned the mouse"
                elif (my := _MY_ATTR.search(prefix)) and _THIRD[form] == "is":
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
            pred = _FIRST[form] if kind in {"first", "elliptic"} else _THIRD[form]
            if kind.startswith("my:"):
                pred, kind = kind[3:], "first"
            neg = _NEGATION.search(prefix)
            if neg:
                if pred not in {"likes", "loves", "prefers"}:
                    continue
                pred = "dislikes"
            if pred in {"likes", "loves"} and _WOULD.search(prefix):
                pred = "wants"
            rest = sentence[vm.end() :]
            mask = next((s for s in masks if s.start == vm.end()), None)
            obj = mask.text if mask else _clean_object(rest)
            if obj is None:
                continue
            if pred == "is" and not (mask or _IS_OBJECT.match(rest)):
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
