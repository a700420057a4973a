"""The rule extractor's English: its word lists, its regular expressions and its verb table.

Data only, compiled once at import; :mod:`~hybridmem.extract.spans` and
:mod:`~hybridmem.extract.rules` decide what to do with it. Word lists are lower-case frozensets.

Word lists

- :data:`DET`, :data:`APPROX` — determiners and approximations an object phrase sheds in front.
- :data:`PRONOUNS` — words that stand for a thing without naming it.
- :data:`TRAILING` — words that end an object without belonging to it ("... in Berlin now").
- :data:`STARTERS` — capitalised words that open a sentence without being names (determiners,
  pronouns, :data:`COMMON` fillers and verbs, :data:`IMPERATIVES`).
- :data:`CALENDAR` — month and weekday names, never an entity of their own.
- :data:`PRODUCT_NOUNS`, :data:`BRANDS`, :data:`ORG_SUFFIX` — what makes a run a product or an org.
- :data:`JUNK` — roles, units and contractions that are never entities ("Agent", "GHz").
- :data:`PLACE_CUES`, :data:`PERSON_CUES`, :data:`PERSON_NEXT` — neighbours that type a name.
- :data:`VERBISH_NEXT` — words after a sentence's first word that make that word a verb.
- :data:`NOT_SPEAKERS` — labels that open a line like a speaker's name ("Note: ...").

Patterns

- :data:`SENTENCE`, :data:`SPEAKER` — sentence breaks; a turn's leading ``"Name: "``.
- :data:`DATE`, :data:`AMOUNT` — dates and amounts, masked before names are looked for.
- :data:`TOKEN` — the words of a sentence, as the span finder sees them.
- :data:`GREETING`, :data:`CLOSES` — what surrounds a name that is only the person addressed.
- :data:`CUT`, :data:`CLAUSE_BREAK`, :data:`OBJECT_PREFIX`, :data:`IS_OBJECT` — where an object
  ends, where a clause starts, what precedes an object, what an object of "is" looks like.
- :data:`LEAD`, :data:`I_END`, :data:`MY_ATTR` — a sentence's filler opening; a subject "I/we"
  just before a verb; "my <attribute>" just before "is".
- :data:`NEGATION`, :data:`WOULD` — a negated verb; "would like" (a want, not a like).

The verb table

- :data:`VERB_TABLE` — predicate, first-person forms, third-person forms.
- :data:`FIRST`, :data:`THIRD` — each form to its predicate; :data:`VERB` finds any form.
"""

from __future__ import annotations

import re

__all__ = [
    "AMOUNT",
    "APPROX",
    "BRANDS",
    "CALENDAR",
    "CLAUSE_BREAK",
    "CLOSES",
    "COMMON",
    "CUT",
    "DATE",
    "DET",
    "FIRST",
    "GREETING",
    "IMPERATIVES",
    "IS_OBJECT",
    "I_END",
    "JUNK",
    "LEAD",
    "MY_ATTR",
    "NEGATION",
    "NOT_SPEAKERS",
    "OBJECT_PREFIX",
    "ORG_SUFFIX",
    "PERSON_CUES",
    "PERSON_NEXT",
    "PLACE_CUES",
    "PRONOUNS",
    "PRODUCT_NOUNS",
    "SENTENCE",
    "SPEAKER",
    "STARTERS",
    "THIRD",
    "TOKEN",
    "TRAILING",
    "VERB",
    "VERBISH_NEXT",
    "VERB_TABLE",
    "WOULD",
]


def _words(text: str) -> frozenset[str]:
    """A word list from one space-separated string."""
    return frozenset(text.split())


# -- word lists ------------------------------------------------------------------------------------
DET = _words(
    "a an the my our your his her their new brand-new some this that these those another its "
    "latest old"
)
PRONOUNS = _words(
    "i me you he him she her it we us they them this that these those there here one something "
    "anything everything nothing someone somebody everyone what which who whom myself itself more "
    "lot lots all both each"
)
COMMON = _words(
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
TRAILING = _words(
    "of to a now today anymore again too yet already lately currently instead either as well "
    "these days nowadays here there though"
)
#: Imperative verbs that open instructions ("Turn off ...", "Try the ...") without being names.
IMPERATIVES = _words(
    "turn try check make sure use open close press hold restart reset update install remove "
    "plug unplug connect disconnect switch set keep send call email contact click select choose "
    "go see look note add put take bring let"
)
#: Capitalised words that start sentences (or follow "I") without being names.
STARTERS = (DET - {"new", "old", "latest", "brand-new"}) | PRONOUNS | COMMON | IMPERATIVES

_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December|"
    "Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
CALENDAR = _words(
    _MONTHS.lower().replace("|", " ") + " monday tuesday wednesday thursday friday saturday sunday"
)

PRODUCT_NOUNS = _words(
    "laptop laptops notebook monitor monitors display screen tv television phone phones smartphone "
    "tablet mouse mice keyboard keyboards headphones headphone headset earbuds earphones speakers "
    "camera lens printer router console controller watch smartwatch charger cable dock ssd gpu "
    "cpu chair desk lamp bike car shoes sneakers jacket bag backpack vacuum fridge blender kettle "
    "drone mic microphone webcam projector ereader kindle stand hub adapter case"
)
BRANDS = _words(
    "apple samsung sony dell hp lenovo asus acer msi logitech razer corsair microsoft google "
    "amazon nintendo lg bose jbl canon nikon xiaomi huawei oneplus nvidia amd intel rog alienware "
    "philips dyson ikea nike adidas steelseries hyperx benq viewsonic garmin fitbit gopro anker"
)
ORG_SUFFIX = _words(
    "inc ltd llc corp corporation company co gmbh sa group bank university college school hospital "
    "institute foundation agency studio studios labs technologies airlines"
)
#: Names that are roles, units or fillers, never entities ("Agent", "GHz", "We've").
JUNK = _words(
    "agent user assistant customer client support admin bot system team staff operator rep "
    "representative moderator hz khz mhz ghz w kw v mah wh gb tb mb kb mm cm km kg lb lbs oz "
    "ms fps mp px dpi rpm inch inches ft we've we'll we're we'd you've you'll you're they've "
    "they'll they're he's she's i'll i'd let's"
)

PLACE_CUES = _words("in from near visited visiting visit around across")
PERSON_CUES = _words(
    "with named called friend sister brother mom dad mother father wife husband mr mrs ms dr met "
    "told asked hey hi hello thanks dear"
)
PERSON_NEXT = _words("is was has had said says told went and 's will can")
VERBISH_NEXT = _words(
    "a an the my your our his her their some it me you him them this that to up out"
)

NOT_SPEAKERS = _words(
    "note update re fwd ps q a edit warning tip summary subject title answer question important "
    "example step tldr"
)
APPROX = _words("around about approximately roughly nearly almost under over just only")


# -- sentences, speakers, dates and amounts --------------------------------------------------------
SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
SPEAKER = re.compile(r"^\s*([A-Z][\w'.-]*(?:[ \t]+[A-Z][\w'.-]*){0,2})[ \t]*:\s+(\S.*)$", re.S)

DATE = re.compile(
    rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?(?:{_MONTHS})\b\.?(?:,?\s+\d{{4}}\b)?"
    rf"|\b(?:{_MONTHS})\b\.?\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?\s+\d{{4}}\b)?"
    rf"|\b(?:{_MONTHS})\s+\d{{4}}\b"
)
AMOUNT = re.compile(
    r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|K|m|M|bn)\b)?"
    r"|\b\d[\d,]*(?:\.\d+)?\s?"
    r"(?:(?:USD|EUR|GBP|JPY|CHF|CAD|AUD|dollars?|euros?|pounds?|bucks)\b|[€£])"
)


# -- names -----------------------------------------------------------------------------------------
TOKEN = re.compile(r"[^\W_][\w'’&+.-]*[\w+]|[^\W_]")

# A name that is only the person spoken to ("Thanks, Mel!", "Hey Jon, ..."), an English vocative:
# after an opening greeting, or after a comma at the end of the sentence.
GREETING = re.compile(
    r"^\W*(?:(?:hi|hey|hello|hiya|yo|dear|thanks|thank\s+you|thx|bye|goodbye|congrats|"
    r"congratulations|cheers|welcome|wow|whoa|oh|ah|aw+|yes|yeah|yep|no|nope|sure|sorry|ok|okay|"
    r"great|awesome|haha|lol|good\s+(?:morning|afternoon|evening|night|luck|job))\b"
    r"(?:\s+(?:so\s+much|a\s+lot|again|too))?[\s,!.]*)+$",
    re.I,
)
CLOSES = re.compile(r"^[\s!?.,]*$")


# -- clauses, subjects and objects -----------------------------------------------------------------
CUT = re.compile(
    r"[,;:!?()\"$€£]|\.(?:\s|$)|\s(?:and|but|because|for|since|so|which|who|that|when|while|with|"
    r"from|at|in|on|as|if|until|after|before|to|or|over|than|instead|like|yesterday|today|"
    r"tomorrow|last|next|this\s+(?:week|month|year|morning|evening))\b",
    re.I,
)
CLAUSE_BREAK = re.compile(
    r"[,;:()]|\b(?:and|but|because|that|which|who|so|when|while|although|though|if|then)\b", re.I
)
OBJECT_PREFIX = re.compile(r"^to\s+(?:buy|get|have|try|order|see|visit|find)\s+", re.I)
IS_OBJECT = re.compile(r"(?:an?\s+\S|[A-Z])")

LEAD = re.compile(r"\s*(?:(?:just|also|finally|recently|today|yesterday|so|and|then)\s+)*", re.I)
_ADV = (
    r"(?:am|'m|’m|have|'ve|’ve|had|'d|’d|was|will|would|just|really|also|recently|finally|"
    r"actually|totally|absolutely|definitely|still|already|never|always|usually|often|do|did|"
    r"don't|don’t|didn't|didn’t|do\s+not|did\s+not|no\s+longer|not|now|currently|truly)"
)
I_END = re.compile(rf"(?:^|\s)(?:I|we)(?:'m|’m|'ve|’ve|'d|’d)?(?:\s+{_ADV})*\s*$", re.I)
MY_ATTR = re.compile(r"(?:^|\s)[Mm]y\s+([a-z][a-z-]*(?:\s+[a-z][a-z-]*){0,3})\s*$")

NEGATION = re.compile(r"n't|n’t|\bnot\b|\bnever\b|\bno\s+longer\b", re.I)
WOULD = re.compile(r"(?:'d|’d|\bwould)(?:\s+really)?\s*$", re.I)


# -- the verb table --------------------------------------------------------------------------------
#: predicate: (first-person forms, third-person forms), comma-separated verb phrases.
VERB_TABLE: tuple[tuple[str, str, str], ...] = (
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
#: A first-person verb form ("live in") -> its predicate ("lives_in").
FIRST: dict[str, str] = {
    form: pred for pred, first, _ in VERB_TABLE for form in first.split(",") if form
}
#: A third-person verb form ("lives in") -> its predicate ("lives_in").
THIRD: dict[str, str] = {
    form: pred for pred, _, third in VERB_TABLE for form in third.split(",") if form
}
#: Any verb form of either table, longest first, followed by the start of its object.
VERB = re.compile(
    r"(?<![\w'’])("
    + "|".join(
        re.escape(f).replace(r"\ ", r"\s+")
        for f in sorted(set(FIRST) | set(THIRD), key=len, reverse=True)
    )
    + r")\s+(?=\S)",
    re.I,
)
