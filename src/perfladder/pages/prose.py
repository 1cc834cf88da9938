"""The book's prose read as a checker reads it (framework-free, no notebook kernel).

Every page's prose (the markdown cells of a notebook, a text page's paragraphs) must insert its
numbers and tie its claims to checks. This module says precisely what that means:

* a **typed number** is a number written into the prose rather than inserted: digits outside
  code, math, glue roles, link targets and names (rung names such as ``R2a``, dtypes such as
  ``bf16``, GPUs such as ``H200`` or ``RTX 4090``, section references such as "Section 13.4"),
  and spelled-out multiples ("four times", "twofold", "about half", "a third");
* a **claim sentence** is a sentence with one of ``CLAIM_WORDS`` (a comparison or a verdict
  about a measurement: pays, faster, loses, busy, waits, barely, ...); it is **checked** when it
  inserts a glue key whose value is a check or is computed from the runs (``CHECKED_PREFIXES``:
  ``c_`` checks, ``s_`` machine-dependent stories, ``v_`` verdict phrases, ``sp_`` the spread
  across runs, ``ch_`` the chapter's transcribed numbers, ``mg_`` the committed multi-GPU run,
  ``hw_`` the peak table, ``claim_`` the comparison page's checked statements);
* a paragraph that defines or describes (a technique, a method, the timer) rather than reading a
  run is marked by a MyST comment line ``% definitional: <why>`` right before it: its claim
  words are not claims about a run (a typed number is still refused there).

``problems(markdown)`` lists the typed numbers and unchecked claim sentences of one page's
prose; ``render(markdown, values)`` replaces its glue roles with values (as the built page
shows them), so a test can read what a page prints for any run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

GLUE = re.compile(r"\{glue(?::md|:text|:any)?\}`([^`]+)`")
CHECKED_PREFIXES = ("c_", "s_", "v_", "sp_", "ch_", "mg_", "hw_", "claim_")
DEFINITIONAL = "% definitional"
CLAIMS = "% claims"          # ends a definitional mark before the next heading
# a fold of prose (MyST's colon-fenced dropdown and admonitions): its title and body are read as
# prose, so text moved into a fold is held to the same rules as text left outside it
PROSE_FOLD = re.compile(r":{3,}\{(?:dropdown|admonition|note|tip|important|warning|seealso)\}\s*(.*)")
CLAIM_WORDS = (
    "pay", "pays", "paid", "faster", "slower", "fastest", "slowest", "lose", "loses", "lost",
    "beat", "beats", "gain", "gains", "gained", "costs time", "cost time", "cheaper", "busy", "waits",
    "waiting", "host-bound", "memory-bound", "compute-bound", "overhead-bound", "sets the pace",
    "keeps up", "barely", "exactly", "of linear", "largest", "biggest", "smallest", "shrink",
    "shrinks", "grew", "grows", "saves", "rises", "falls", "learns", "nothing measurable",
    "no faster", "not faster", "close to", "nearly free", "about as", "cliff", "rescue", "wins",
    "costliest",
)
# names, not claims: the configuration the ladder ends on is called its fastest everywhere
NAMED = re.compile(r"fastest (?:single-GPU )?(?:configurations?|recipes?|step|settled rung)", re.IGNORECASE)
# a claim word right before an inserted value reads that value ("busy {R2_busy}", "rises
# {cumulative}"): a number stated, not a claim made
QUOTES = re.compile(r"(?<![\w-])(?:" + "|".join(re.escape(w) for w in CLAIM_WORDS)
                    + r")\s+(?:only\s+)?(?=\{glue)", re.IGNORECASE)
_CLAIM = re.compile(r"(?<![\w-])(" + "|".join(re.escape(w) for w in CLAIM_WORDS) + r")(?![\w-])",
                    re.IGNORECASE)
_NAMES = [
    re.compile(r"Sections? \d+(?:\.\d+)*(?:(?:, | and | to )\d+(?:\.\d+)*)*"),   # section references
    re.compile(r"\bRTX \d{4}s?\b"),
    re.compile(r"\b[A-Za-z]+[A-Za-z_]*\d+[\w.]*"),        # R2a, B14, bf16, H200, FSDP2, sm90, k2
    re.compile(r"(?<![\w.])\d+(?:st|nd|rd|th)\b"),        # 1st, 2nd
]
_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_SPELLED = re.compile(
    r"\b(?:(?:about|roughly|nearly|almost|some|over|under)\s+)?"
    r"(?:two|three|four|five|six|seven|eight|nine|ten|twenty|hundred|thousand)(?:\s+times|fold)\b"
    r"|\b(?:twofold|threefold|fourfold|tenfold|hundredfold|twice as|half as|a third|a quarter)\b"
    r"|\b(?:about|roughly|nearly|almost)\s+(?:half|a third|a quarter|double|halved)\b",
    re.IGNORECASE)


@dataclass(frozen=True)
class Problem:
    kind: str          # "typed number" | "unchecked claim"
    found: str         # the number, or the claim word
    sentence: str

    def __str__(self) -> str:
        return f"{self.kind} {self.found!r}: {self.sentence[:160]}"


def paragraphs(markdown: str) -> list[tuple[bool, str]]:
    """The prose paragraphs of a page, each with whether it is marked definitional (a
    ``% definitional`` line marks the paragraphs after it up to the next heading); code blocks,
    directive fences and their options, display math and comments are not prose, but a
    dropdown's (or an admonition's) title and body are."""
    out, para, definitional, pending = [], [], False, False
    fence = None

    def close():
        nonlocal para, definitional
        if para:
            out.append((definitional, " ".join(para)))
        para, definitional = [], False
    for line in markdown.splitlines():
        s = line.strip()
        if fence is not None:
            if (fence == "$$" and s.startswith("$$")) or (s.startswith(fence) and s.strip("`:~") == ""):
                fence = None
            continue
        fold = PROSE_FOLD.match(s)
        if fold or (s.startswith(":::") and s.strip(":") == ""):
            close()                     # a fold opens (its title a paragraph of its own) or closes
            if fold and fold.group(1):
                out.append((pending, fold.group(1)))
            continue
        if re.match(r":[\w-]+:", s) and not para:
            continue                    # a directive's option line (``:open:``), not prose
        if s.startswith(("```", "~~~", ":::")):
            close()
            fence = re.match(r"[`~:]+", s).group(0)
            continue
        if s.startswith("$$"):          # display math, to its closing $$ (a one-line $$...$$ closes itself)
            close()
            if s.count("$$") < 2:
                fence = "$$"
            continue
        if s.startswith("%"):
            close()
            pending = s.startswith(DEFINITIONAL) or (pending and not s.startswith(CLAIMS))
            continue
        if not s:
            close()
            continue
        if s.startswith("#"):
            close()
            pending = False
            out.append((False, s.lstrip("#").strip()))
            continue
        if not para:
            definitional = pending
        para.append(re.sub(r"^\d+\.\s+", "", s))      # an ordered list's numbers are not quantities
    close()
    return out


def sentences(paragraph: str) -> list[str]:
    """A paragraph cut into sentences (and list items)."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z*(`{])|\s+(?=\* )", paragraph)
    return [p.strip() for p in parts if p.strip()]


def _bare(sentence: str) -> str:
    """The sentence without what is not prose: glue roles, inline code, math, link targets,
    HTML tags, and names with digits in them."""
    s = GLUE.sub(" ", sentence)
    s = re.sub(r"`[^`]*`", " ", s)
    s = re.sub(r"\$[^$]*\$", " ", s)
    s = re.sub(r"\]\([^)]*\)", "]", s)
    s = re.sub(r"<[^>]+>", " ", s)
    for pattern in _NAMES:
        s = pattern.sub(" ", s)
    return s


def typed_numbers(sentence: str) -> list[str]:
    bare = _bare(sentence)
    return _NUMBER.findall(bare) + [m.group(0) for m in _SPELLED.finditer(bare)]


def claim_word(sentence: str) -> str | None:
    m = _CLAIM.search(_bare(NAMED.sub(" ", QUOTES.sub(" ", sentence))))
    return m.group(1) if m else None


def checked(sentence: str) -> bool:
    """Does the sentence insert a check, or a value computed from the runs it describes?"""
    return any(k.split("::")[-1].split(":")[0].startswith(CHECKED_PREFIXES) for k in GLUE.findall(sentence))


def problems(markdown: str) -> list[Problem]:
    """The typed numbers and the unchecked claim sentences of one page's prose."""
    out = []
    for definitional, para in paragraphs(markdown):
        for s in sentences(para):
            out += [Problem("typed number", n, s) for n in typed_numbers(s)]
            word = claim_word(s)
            if word and not definitional and not checked(s):
                out.append(Problem("unchecked claim", word, s))
    return out


def story_problems(text: str) -> list[Problem]:
    """Typed numbers in one version of a ``Story`` (its ``{key}`` fields are inserted values; its
    claims are checked by the version's own test)."""
    as_glue = re.sub(r"\{(\w+)\}", r"{glue:md}`\1`", text)
    return [Problem("typed number", n, s) for s in sentences(as_glue) for n in typed_numbers(s)]


def render(markdown: str, values: dict[str, str]) -> str:
    """The prose as a built page prints it: every glue role replaced by its value (a key the
    values lack stays visible as ``<missing key>``), comments dropped."""
    text = GLUE.sub(lambda m: values.get(m.group(1), f"<missing {m.group(1)}>"), markdown)
    return "\n".join(ln for ln in text.splitlines() if not ln.strip().startswith("%"))
