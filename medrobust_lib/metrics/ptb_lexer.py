"""A Python port of Stanford CoreNLP 3.4.1's ``PTBLexer`` (the JFlex grammar behind ``PTBTokenizer``).

pycocoevalcap 1.2 tokenizes captions by running ``java edu.stanford.nlp.process.PTBTokenizer
-preserveLines -lowerCase`` from ``stanford-corenlp-3.4.1.jar`` on all captions joined by ``\\n``.
This module reproduces that program without Java: :func:`tokenize_document` returns the token lines
the Java program prints for a document. The rules, their order and their actions are those of
``src/edu/stanford/nlp/process/PTBLexer.flex`` at tag ``v3.4.1`` (default options plus
``tokenizeNLs``); JFlex semantics are kept: at every position the rule with the longest match wins
(trailing context ``r1/r2`` counts towards the length, only ``r1`` becomes the token), ties go to
the earlier rule; ``%caseless`` applies to literal text but not to character classes.

JFlex 1.4 classifies characters with the Unicode tables of the JDK that generated the lexer (Unicode
6.2) and only in the Basic Multilingual Plane; :mod:`medrobust_lib.metrics.ptb_unicode` holds those
classes as explicit ranges (derived from the Java program, so later Unicode letters are deleted as
there). Characters outside the BMP are untokenizable (deleted) in both; Java sees them as two
surrogates, which only matters inside URL/e-mail tokens. A token never spans a line break except an
SGML tag whose quoted attribute contains one; such a tag is cut at the line end here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property, lru_cache

import regex

from medrobust_lib.metrics.ptb_unicode import DIGIT_CLASS, LETTER_CLASS, UPPERCASE_CLASS

NEWLINE_TOKEN = "*NL*"

# --- macros (JFlex names); literal text is wrapped in (?i:...) because of %caseless ----------------

# JFlex [:letter:], [:uppercase:], [:digit:] as compiled into the 3.4.1 jar (Unicode 6.2, BMP only),
# generated from the Java tokenizer's own behaviour by ``tools/caption_reference.py --unicode-table``.
_BMP_L = LETTER_CLASS
_BMP_LU = UPPERCASE_CLASS
_BMP_ND = DIGIT_CLASS

SGML = (r"<(?:[!?][A-Za-z\-][^>\r\n]*|[A-Za-z][A-Za-z0-9_:.\-]*(?:[ ]+(?:[A-Za-z][A-Za-z0-9_:.\-]*"
        r"|[A-Za-z][A-Za-z0-9_:.\-]*[ ]*=[ ]*(?:'[^']*'|\"[^\"]*\")))*[ ]*/?|/[A-Za-z][A-Za-z0-9_:.\-]*)[ ]*>")
SPMDASH = r"&(?i:MD|mdash|ndash);|[\u0096\u0097\u2013\u2014\u2015]"
SPAMP = r"&(?i:amp);"
SPPUNC = r"&(?:(?i:HT|TL|UR|LR|QC|QL|QR|odq|cdq)|#[0-9]+);"
SPLET = r"&[aeiouAEIOU](?i:acute|grave|uml);"
SPACE = r"[ \t\u00a0\u2000-\u200a\u3000]"
SPACES = rf"{SPACE}+"
NEWLINE = r"(?:\r|\r?\n|\u2028|\u2029|\x0b|\x0c|\x85)"
SPACENL = rf"(?:{SPACE}|{NEWLINE})"
SPACENLS = rf"{SPACENL}+"
SENTEND = rf"{SPACENL}(?:{SPACENL}|{_BMP_LU}|{SGML})"
DIGIT = rf"(?:{_BMP_ND}|[\u07c0-\u07c9])"
DATE = rf"{DIGIT}{{1,2}}[\-/]{DIGIT}{{1,2}}[\-/]{DIGIT}{{2,4}}"
NUM = rf"(?:{DIGIT}+|{DIGIT}*(?:[.:,\u00ad\u066b\u066c]{DIGIT}+)+)"
NUMBER = rf"[\-+]?{NUM}"
SUBSUPNUM = r"[\u207a\u207b\u208a\u208b]?(?:[\u2070\u00b9\u00b2\u00b3\u2074-\u2079]+|[\u2080-\u2089]+)"
FRAC = rf"(?:{DIGIT}{{1,4}}[\- \u00a0])?{DIGIT}{{1,4}}(?:\\?/|\u2044){DIGIT}{{1,4}}"
FRAC2 = r"[\u00bc\u00bd\u00be\u2153-\u215e]"
DOLSIGN = r"(?:[A-Z]*\$|#)"
DOLSIGN2 = r"[\u00a2\u00a3\u00a4\u00a5\u0080\u20a0\u20ac\u060b\u0e3f\u20a4\uffe0\uffe1\uffe5\uffe6]"
LETTER = (
    rf"(?:{_BMP_L}|{SPLET}|[\u00ad\u0237-\u024f\u02c2-\u02c5\u02d2-\u02df\u02e5-\u02ff\u0300-\u036f"
    r"\u0370-\u037d\u0384\u0385\u03cf\u03f6\u03fc-\u03ff\u0483-\u0487\u04cf\u04f6-\u04ff\u0510-\u0525"
    r"\u055a-\u055f\u0591-\u05bd\u05bf\u05c1\u05c2\u05c4\u05c5\u05c7\u0615-\u061a\u063b-\u063f"
    r"\u064b-\u065e\u0670\u06d6-\u06ef\u06fa-\u06ff\u070f\u0711\u0730-\u074f\u0750-\u077f"
    r"\u07a6-\u07b1\u07ca-\u07f5\u07fa\u0900-\u0903\u093c\u093e-\u094e\u0951-\u0955\u0962-\u0963"
    r"\u0981-\u0983\u09bc-\u09c4\u09c7\u09c8\u09cb-\u09cd\u09d7\u09e2\u09e3\u0a01-\u0a03\u0a3c"
    r"\u0a3e-\u0a4f\u0a81-\u0a83\u0abc-\u0acf\u0b82\u0bbe-\u0bc2\u0bc6-\u0bc8\u0bca-\u0bcd"
    r"\u0c01-\u0c03\u0c3e-\u0c56\u0d3e-\u0d44\u0d46-\u0d48\u0e30-\u0e3a\u0e47-\u0e4e\u0eb1-\u0ebc"
    r"\u0ec8-\u0ecd])"
)
_LD = rf"(?:{LETTER}|{DIGIT})"
WORD = rf"{LETTER}{_LD}*(?:[.!?]{LETTER}{_LD}*)*"
FILENAME_EXT = (r"(?i:bat|bmp|c|class|cgi|cpp|dll|doc|docx|exe|gif|gz|h|htm|html|jar|java|jpeg|jpg|mov|mp3"
                r"|pdf|php|pl|png|ppt|ps|py|sql|tar|txt|wav|x|xml|zip)")
FILENAME = rf"{_LD}+(?:[.]{_LD}+)*(?:[.]{FILENAME_EXT})"
APOS = r"(?:['\u0092\u2019]|&(?i:apos);)"
APOSETCETERA = rf"(?:{APOS}|[`\u0091\u2018\u201b])"
HYPHEN = r"[\-_\u058a\u2010\u2011]"
_PLD = rf"(?:{_BMP_L}|{_BMP_ND})"  # [:letter:]|[:digit:]
THING = (rf"(?:[dDoOlL]{APOSETCETERA}{_PLD})?{_PLD}+"
         rf"(?:{HYPHEN}(?:[dDoOlL]{APOSETCETERA}{_PLD})?{_PLD}+)*")
THINGA = rf"[A-Z]+(?:(?:[+&]|{SPAMP})[A-Z]+)+"
THING3 = r"[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}(?:\\?/[A-Za-z0-9]+(?:-[A-Za-z]+){0,2}){1,2}"
_ACRO_SPECIAL = r"(?i:(?:Canada|Sino|Korean|EU|Japan|non)-U\.S|U\.S\.-(?:U\.K|U\.S\.S\.R))"
ACRO = rf"(?:[A-Za-z](?:\.[A-Za-z])*|{_ACRO_SPECIAL})"
ACRO2 = rf"(?:[A-Za-z](?:\.[A-Za-z])+|{_ACRO_SPECIAL})"
HTHING = rf"[A-Za-z0-9][A-Za-z0-9.,\u00ad]*(?:-(?:[A-Za-z0-9\u00ad]+|{ACRO2}\.))+"
REDAUX = rf"{APOS}(?:[msdMSD]|(?i:re|ve|ll))"
SWORD = r"[A-Za-z\u00ad]*[A-MO-Za-mo-z]\u00ad*"
SREDAUX = rf"(?i:n){APOSETCETERA}(?i:t)"
APOWORD = (
    rf"(?:{APOS}(?i:n){APOS}?|[lLdDjJ]{APOS}|(?i:Dunkin){APOS}|(?i:somethin){APOS}|(?i:ol){APOS}"
    rf"|{APOS}(?i:em)|[A-HJ-XZn]{APOSETCETERA}{_BMP_L}{{2}}{_BMP_L}*|{APOS}[2-9]0(?i:s)|{APOS}(?i:till?)"
    rf"|{_BMP_L}{_BMP_L}*[aeiouyAEIOUY]{APOSETCETERA}[aeiouA-Z]{_BMP_L}*|{APOS}(?i:cause)"
    r"|(?i:cont'd)\.?|(?i:'twas)|(?i:nor'easter)|(?i:c'mon)|(?i:e'er)|(?i:s'mores)|(?i:ev'ry)|(?i:li'l)"
    rf"|(?i:nat'l)|(?i:O){APOSETCETERA}(?i:o))"
)
APOWORD2 = rf"(?i:y){APOS}"
FULLURL = r"(?i:https?)://[^ \t\n\f\r\"<>|(){}]+[^ \t\n\f\r\"<>|.!?(){},\-]"
LIKELYURL = (r"(?:(?:(?i:www)\.(?:[^ \t\n\f\r\"<>|.!?(){},]+\.)+[a-zA-Z]{2,4})"
             r"|(?:(?:[^ \t\n\f\r\"`'<>|.!?(){}\u002c-\u005f$]+\.)+(?i:com|net|org|edu)))"
             r"(?:/[^ \t\n\f\r\"<>|()]+[^ \t\n\f\r\"<>|.!?(){},\-])?")
EMAIL = (r"(?:&(?i:lt);|<)?[a-zA-Z0-9][^ \t\n\f\r\"<>|()\u00a0{}]*@(?:[^ \t\n\f\r\"<>|(){}.\u00a0]+\.)*"
         r"(?:[^ \t\n\f\r\"<>|(){}.\u00a0]+)(?:&(?i:gt);|>)?")
TWITTER = rf"(?:@[a-zA-Z_][a-zA-Z_0-9]*|#{LETTER}+)"
ABMONTH = r"(?i:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)"
ABDAYS = r"(?i:Mon|Tue|Tues|Wed|Thu|Thurs|Fri)"
ABSTATE = (r"(?:(?i:Ala|Ariz)|[A](?i:z)|[A](?i:rk)|(?i:Calif|Colo|Conn|Ct|Dak)|[D](?i:el)|(?i:Fla|Ga)"
           r"|[I](?i:ll)|(?i:Ind|Kans?|Ky)|[L](?i:a)|[M](?i:ass)|(?i:Md|Mich|Minn)|[M](?i:iss)"
           r"|(?i:Mo|Mont|Neb|Nev|Okla)|[O](?i:re)|[P](?i:a)|(?i:Penn|Tenn)|[T](?i:ex)|(?i:Va|Vt)"
           r"|[W](?i:ash)|(?i:Wisc?|Wyo))")
ABCOMP = r"(?:(?i:Inc|Cos?|Corp)|(?i:Pp?t)[ye](?i:s)?|(?i:Ltd|Plc|Rt|Bancorp|Bhd|Assn|Univ|Intl|Sys))"
ABNUM = r"(?i:tel|est|ext|sq)"
ABPTIT = r"(?i:Jr|Sr|Bros|(?:Ed|Ph)\.D|Blvd|Rd|Esq)"
ABBREV1 = rf"(?:{ABMONTH}|{ABDAYS}|{ABSTATE}|{ABCOMP}|{ABNUM}|{ABPTIT}|(?i:etc|al|seq|Bldg))\."
ABTITLE = (r"(?:(?i:Mr|Mrs|Ms)|[M](?i:iss)|(?i:Drs?|Profs?|Sens?|Reps?|Attys?|Lt|Col|Gen|Messrs|Govs?|Adm"
           r"|Rev|Maj|Sgt|Cpl|Pvt|Capt|Ste?|Ave|Pres|Lieut|Hon|Brig|Co?mdr|Pfc|Spc|Supts?|Det|Mt|Ft|Adj"
           r"|Adv|Asst|Assoc|Ens|Insp|Mlle|Mme|Msgr|Sfc))")
ABCOMP2 = r"(?:(?i:Invt|Elec|Natl)|(?i:M)[ft](?i:g)|(?i:Dept))"
ABBREV4 = rf"(?:{ABTITLE}|(?i:vs|Alex|Wm|Jos|Cie|a\.k\.a|cf|TREAS|Ph)|{ACRO}|{ABCOMP2})"
ABBREV2 = rf"{ABBREV4}\."
ACRONYM = rf"{ACRO}\."
ABBREV3 = r"(?i:ca|figs?|prop|nos?|art|bldg|prop|pp|op)\."
PHONE = (r"(?:(?:\([0-9]{2,3}\)[ \u00a0]?|(?:\+\+?)?(?:[0-9]{2,4}[\- \u00a0])?[0-9]{2,4}[\- \u00a0])"
         r"[0-9]{3,4}[\- \u00a0]?[0-9]{3,5}|(?:(?:\+\+?)?[0-9]{2,4}\.)?[0-9]{2,4}\.[0-9]{3,4}\.[0-9]{3,5})")
LDOTS = r"(?:\.{3,5}|(?:\.[ \u00a0]){2,4}\.|[\u0085\u2026])"
INSENTP = r"[,;:\u3001]"
QUOTES = (rf"(?:{APOS}|''|[`\u2018\u2019\u201a\u201b\u201c\u201d\u0091\u0092\u0093\u0094\u201e\u201f"
          r"\u2039\u203a\u00ab\u00bb]{1,2})")
DBLQUOT = r"(?:\"|&(?i:quot);)"
TBSPEC = (rf"(?:-(?i:RRB|LRB|RCB|LCB|RSB|LSB)-|(?i:C\.D\.s)|(?i:pro)-|(?i:anti)-|(?i:S)(?:&|{SPAMP})(?i:P)-500"
          rf"|(?i:S)(?:&|{SPAMP})(?i:Ls)|(?i:Cap){APOS}(?i:n)|(?i:c){APOS}(?i:est))")
TBSPEC2 = rf"{APOS}[0-9][0-9]"
SMILEY = r"[<>]?[:;=][\-o*']?[()DPdpO\\{@|\[\]]"
ASIANSMILEY = (r"(?:[\^x=~<>]\.\[\^x=~<>\]|[\-\^x=~<>']_[\-\^x=~<>']|\([\-\^x=~<>'][_.]?[\-\^x=~<>']\)"
               r"|\([\^x=~<>']-[\^x=~<>'`]\))")
MISCSYMBOL = (r"[+%&~\^|\\\u00a6\u00a7\u00a8\u00a9\u00ac\u00ae\u00af\u00b0-\u00b3\u00b4-\u00ba\u00d7\u00f7"
              r"\u0387\u05be\u05c0\u05c3\u05c6\u05f3\u05f4\u0600-\u0603\u0606-\u060a\u060c\u0614\u061b"
              r"\u061e\u066a\u066d\u0703-\u070d\u07f6\u07f7\u07f8\u0964\u0965\u0e4f\u1fbd\u2016\u2017"
              r"\u2020-\u2023\u2030-\u2038\u203b\u203e-\u2042\u2044\u207a-\u207f\u208a-\u208e\u2100-\u214f"
              r"\u2190-\u21ff\u2200-\u2bff\u3012\u30fb\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
_WS_END = " \t\n\x0b\x0c\r\x85"
_NEWLINE_CHARS = regex.compile(r"[\n\r\x0b\x0c\x85\u2028\u2029]")

# --- actions ------------------------------------------------------------------------------------------


def _soft(s: str) -> str:
    """``removeSoftHyphens``: drop U+00AD; an all-soft-hyphen token becomes ``-``."""
    if "\u00ad" not in s:
        return s
    out = s.replace("\u00ad", "")
    return out or "-"


def _amp(s: str) -> str:
    return regex.sub(r"(?i:&amp;)", "&", s)


def _latex_quotes(s: str, probably_left: bool) -> str:
    if probably_left:
        s = regex.sub(r"&apos;|'", "`", s)
        s = regex.sub(r"\"|&quot;", "``", s)
    else:
        s = regex.sub(r"&apos;|'", "'", s)
        s = regex.sub(r"\"|&quot;", "''", s)
    s = regex.sub(r"[\u0091\u2018\u201b\u2039]", "`", s)
    s = regex.sub(r"[\u0092\u2019\u203a]", "'", s)
    s = regex.sub(r"[\u0093\u201c\u00ab]", "``", s)
    return regex.sub(r"[\u0094\u201d\u00bb]", "''", s)


def _parens(s: str) -> str:
    return s.replace("(", "-LRB-").replace(")", "-RRB-")


def _currency(s: str) -> str:
    s = s.replace("\u00a2", "cents").replace("\u00a3", "#")
    return regex.sub(r"[\u0080\u00a4\u20a0\u20ac]", "$", s)


def _fractions(s: str) -> str:
    for ch, rep in (("\u00bc", "1/4"), ("\u00bd", "1/2"), ("\u00be", "3/4"), ("\u2153", "1/3"), ("\u2154", "2/3")):
        s = s.replace(ch, rep)
    return s


def _strip_ws(s: str) -> str:
    while s and (s[-1] in _WS_END):
        s = s[:-1]
    return s


# An action maps the matched r1 text to (token or None to skip, number of chars consumed).
Action = Callable[[str], tuple[str | None, int]]


def _tok(f: Callable[[str], str] = lambda s: s) -> Action:
    return lambda s: (f(s), len(s))


def _skip(s: str) -> tuple[str | None, int]:
    return None, len(s)


def _pushback(n: int) -> Action:
    return lambda s: (s[: len(s) - n], len(s) - n)


def _acronym(s: str) -> tuple[str | None, int]:
    s = _strip_ws(s)
    if len(s) == 2:  # "I." etc.: the letter now, the period next time
        return s[:1], 1
    return s, len(s) - 1  # the acronym WITH its period, and the period again next time


def _abbrev3(s: str) -> tuple[str | None, int]:
    s = _strip_ws(s)
    return s, len(s)


def _with_period_again(s: str) -> tuple[str | None, int]:
    return s, len(s) - 1


def _hyphens(s: str) -> tuple[str | None, int]:
    return ("--" if 3 <= len(s) <= 4 else s), len(s)


def _fixed(tok: str) -> Action:
    return lambda s: (tok, len(s))


class _Rule:
    """One JFlex rule ``r1`` or ``r1/r2`` (trailing context) and its action; regexes compiled on first use."""

    def __init__(self, r1: str, action: Action, r2: str | None) -> None:
        self.r1, self.r2, self.action = r1, r2, action

    @cached_property
    def whole(self) -> regex.Pattern[str]:
        """``r1 r2`` (or ``r1``) with POSIX leftmost-longest semantics, as JFlex's DFA matches."""
        tail = f"(?:{self.r2})" if self.r2 is not None else ""
        return regex.compile(f"(?:{self.r1}){tail}", regex.V1 | regex.POSIX)

    @cached_property
    def head(self) -> regex.Pattern[str]:
        return regex.compile(self.r1, regex.V1)

    @cached_property
    def tail(self) -> regex.Pattern[str]:
        return regex.compile(self.r2 if self.r2 is not None else "", regex.V1)


def _caseless(pattern: str) -> str:
    """Rewrite every ``(?i:...)`` group as plain regex with ``[xX]`` classes for its ASCII letters.

    (The ``regex`` module's scoped case-insensitivity mis-handles some alternations with negated
    classes, e.g. ``(?:(?i:w)x|[^,-_]+)`` fails on ``b``; explicit classes avoid it.)"""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("(?i:", i):
            depth, j = 1, i + 4
            out.append("(?:")
            while depth:
                c = pattern[j]
                if c == "\\":
                    out.append(pattern[j : j + 2])
                    j += 2
                    continue
                if c == "(":
                    depth += 1
                elif c == ")":
                    depth -= 1
                if c.isascii() and c.isalpha():
                    out.append(f"[{c.lower()}{c.upper()}]")
                else:
                    out.append(c)
                j += 1
            i = j
        else:
            nxt = pattern.find("(?i:", i)
            nxt = len(pattern) if nxt < 0 else nxt
            out.append(pattern[i:nxt])
            i = nxt
    return "".join(out)


def _rule(r1: str, action: Action, r2: str | None = None) -> _Rule:
    return _Rule(_caseless(r1), action, _caseless(r2) if r2 is not None else None)


_ACRONYM_NEXT = (r"(?:[A]bout|[A]ccording|[A]dditionally|[A]fter|[A]n|[A]|[A]s|[A]t|[B]ut|[E]arlier|[H]e|[H]er"
                 r"|[H]ere|[H]owever|[I]f|[I]n|[I]t|[L]ast|[M]any|[M]ore|[M]r\.|[M]s\.|[N]ow|[O]nce|[O]ne"
                 r"|[O]ther|[O]ur|[S]he|[S]ince|[S]o|[S]ome|[S]uch|[T]hat|[T]he|[T]heir|[T]hen|[T]here"
                 r"|[T]hese|[T]hey|[T]his|[W]e|[W]hen|[W]hile|[W]hat|[Y]et|[Y]ou|" + SGML + ")")
# The JFlex class [A]bout makes the first letter case-sensitive; the rest of each word is a caseless
# literal. Written out: first letter class + (?i:rest).
_ACRONYM_NEXT = regex.sub(r"\[([A-Z])\]([a-z.\\]+)", lambda m: f"[{m.group(1)}](?i:{m.group(2)})", _ACRONYM_NEXT)

_RULES: tuple[_Rule, ...] = (
    _rule(r"(?i:c)[+][+]", _tok()),
    _rule(r"(?i:c|f)#", _tok()),
    _rule(r"(?i:cannot)", _pushback(3)),
    _rule(r"(?i:'twas)", _pushback(3)),
    _rule(r"(?i:'tis)", _pushback(2)),
    _rule(r"(?i:gonna|gotta|lemme|gimme|wanna)", _pushback(2)),
    _rule(SGML, _tok(lambda s: s.replace(" ", "\u00a0"))),
    _rule(SPMDASH, _fixed("--")),
    _rule(SPAMP, _tok(_amp)),
    _rule(SPPUNC, _tok()),
    _rule(WORD, _tok(_soft), REDAUX),
    _rule(SWORD, _tok(_soft), SREDAUX),
    _rule(WORD, _tok(_soft)),
    _rule(APOWORD, _tok()),
    _rule(APOWORD2, _tok(), _BMP_L),
    _rule(FULLURL, _tok()),
    _rule(LIKELYURL, _tok()),
    _rule(EMAIL, _tok()),
    _rule(TWITTER, _tok()),
    _rule(REDAUX, _tok(lambda s: _latex_quotes(s, False)), r"[^A-Za-z]"),
    _rule(SREDAUX, _tok(lambda s: _latex_quotes(s, False)), r"[^A-Za-z]"),
    _rule(DATE, _tok()),
    _rule(NUMBER, _tok(_soft)),
    _rule(SUBSUPNUM, _tok()),
    _rule(FRAC, _tok(lambda s: s.replace(" ", "\u00a0"))),
    _rule(FRAC2, _tok(_fractions)),
    _rule(TBSPEC, _tok(_amp)),
    _rule(THING3, _tok()),
    _rule(DOLSIGN, _tok()),
    _rule(DOLSIGN2, _tok(_currency)),
    _rule(ACRONYM, _acronym, rf"{SPACENLS}{_ACRONYM_NEXT}{SPACENL}"),
    _rule(ABBREV3, _abbrev3, rf"{SPACENL}?{_BMP_ND}"),
    _rule(r"(?:(?i:pt)[eyEY]|(?i:co))\.", _tok(), rf"{SPACE}(?i:ltd|lim)"),
    _rule(ABBREV1, _with_period_again, SENTEND),
    _rule(ABBREV1, _tok(), r"[\s\S][\s\S]"),
    _rule(ABBREV1, _with_period_again),
    _rule(ABBREV2, _tok()),
    _rule(ABBREV4, _tok(), SPACE),
    _rule(ACRO, _tok(), SPACENL),
    _rule(TBSPEC2, _tok(), SPACENL),
    _rule(FILENAME, _tok(), rf"(?:{SPACENL}|[.?!,])"),
    _rule(rf"{WORD}\.", _tok(_soft), INSENTP),
    _rule(PHONE, _tok(lambda s: _parens(s.replace(" ", "\u00a0")))),
    _rule(DBLQUOT, _tok(lambda s: _latex_quotes(s, True)), r"[A-Za-z0-9$]"),
    _rule(DBLQUOT, _tok(lambda s: _latex_quotes(s, False))),
    _rule(r"\x7f", _skip),
    _rule(r"<|&(?i:lt);", _fixed("<")),
    _rule(r">|&(?i:gt);", _fixed(">")),
    _rule(SMILEY, _tok(_parens), r"[^A-Za-z0-9]"),
    _rule(ASIANSMILEY, _tok(_parens)),
    _rule(r"\{", _fixed("-LCB-")),
    _rule(r"\}", _fixed("-RCB-")),
    _rule(r"\[", _fixed("-LSB-")),
    _rule(r"\]", _fixed("-RSB-")),
    _rule(r"\(", _fixed("-LRB-")),
    _rule(r"\)", _fixed("-RRB-")),
    _rule(r"-+", _hyphens),
    _rule(LDOTS, _fixed("...")),
    _rule(r"@+|#+|_+", _tok()),
    _rule(r"\*+|(?:\\\*){1,3}", _tok()),
    _rule(INSENTP, _tok()),
    _rule(r"[?!]+", _tok()),
    _rule(r"[.\u00a1\u00bf\u037e\u0589\u061f\u06d4\u0700-\u0702\u07fa\u3002]", _tok()),
    _rule(r"=", _tok()),
    _rule(r"/", _tok()),
    _rule(rf"{HTHING}\.", _tok(_soft), INSENTP),
    _rule(HTHING, _tok(_soft)),
    _rule(rf"{THING}\.", _tok(), INSENTP),
    _rule(THING, _tok()),
    _rule(rf"{THINGA}\.", _tok(_amp), INSENTP),
    _rule(THINGA, _tok(_amp)),
    _rule(r"'", _tok(lambda s: _latex_quotes(s, True)), r"[A-Za-z][^ \t\n\r\u00a0]"),
    _rule(REDAUX, _tok(lambda s: _latex_quotes(s, False))),
    _rule(SREDAUX, _tok(lambda s: _latex_quotes(s, False))),
    _rule(QUOTES, _tok(lambda s: _latex_quotes(s, False))),
    _rule(r"<<|>>", _tok()),
    _rule(MISCSYMBOL, _tok()),
    _rule(rf"\x00|{SPACES}|[\u200b\u200e\u200f\ufeff]", _skip),
    _rule(NEWLINE, _fixed(NEWLINE_TOKEN)),
    _rule(r"&(?i:nbsp);", _skip),
    _rule(r"[^\n]", _skip),  # untokenizable: deleted (the default "firstDelete")
)


@lru_cache(maxsize=4096)
def _candidates(first: str) -> tuple[_Rule, ...]:
    """The rules (in order) that can match text starting with the character ``first``."""
    return tuple(r for r in _RULES if r.whole.match(first, partial=True) is not None)


def _split_head(rule: _Rule, text: str, pos: int, end: int) -> str:
    """The r1 part of a trailing-context match ``text[pos:end]``: the longest r1 whose remainder matches r2."""
    for e in range(end, pos, -1):
        if rule.head.fullmatch(text, pos, e) and rule.tail.fullmatch(text, e, end):
            return text[pos:e]
    raise AssertionError("unreachable: the whole match must split into r1 r2")  # pragma: no cover


def lex(text: str, stop: int | None = None) -> list[str]:
    """Tokens of ``text`` as PTBLexer 3.4.1 returns them (before lower-casing), with ``*NL*`` for
    each line break (``tokenizeNLs``). ``text``: any str; characters outside the BMP are deleted.
    ``stop``: only tokens that start before this offset (default: all); the text after it is still
    seen by the trailing-context rules."""
    out: list[str] = []
    pos = 0
    n = len(text) if stop is None else min(stop, len(text))
    while pos < n:
        best: _Rule | None = None
        best_len = 0
        for rule in _candidates(text[pos]):
            m = rule.whole.match(text, pos)
            if m is not None and m.end() - pos > best_len:
                best, best_len = rule, m.end() - pos
        if best is None:  # only possible for a lone "\n"-free empty match; the catch-all rules cover all
            raise AssertionError(f"no rule matches at {pos}")  # pragma: no cover
        head = text[pos : pos + best_len] if best.r2 is None else _split_head(best, text, pos, pos + best_len)
        tok, consumed = best.action(head)
        if tok is not None:
            out.append(tok)
        pos += max(consumed, 1)
    return out


def tokenize_document(text: str) -> list[str]:
    """Output lines of ``PTBTokenizer -preserveLines -lowerCase`` for ``text``: tokens lower-cased
    (``Locale.ENGLISH``), joined by single spaces, one output line per input line."""
    lines: list[str] = []
    cur: list[str] = []
    for tok in lex(text):
        if tok == NEWLINE_TOKEN:
            lines.append(" ".join(cur))
            cur = []
        else:
            cur.append(tok.lower())
    lines.append(" ".join(cur))
    return lines


_CONTEXT_CHARS = 256


@lru_cache(maxsize=65536)
def _line_in_context(line: str, following: str) -> str:
    return " ".join(t.lower() for t in lex(line + following, stop=len(line)))


def tokenize_lines(lines: Sequence[str]) -> list[str]:
    """Output lines of ``PTBTokenizer -preserveLines -lowerCase`` for the document ``"\\n".join(lines)``,
    one per element of ``lines`` (which must not contain line breaks: ``\\n``, ``\\r``, U+000B,
    U+000C, U+0085, U+2028, U+2029). A line's tokens can depend on the start of the lines after it
    (trailing context), which is why the document is tokenized as a whole, as pycocoevalcap does."""
    for ln in lines:
        if _NEWLINE_CHARS.search(ln):
            raise ValueError(f"line contains a line break: {ln!r}")
    out: list[str] = []
    for i, ln in enumerate(lines):
        following = ""
        j = i + 1
        while j < len(lines) and len(following) < _CONTEXT_CHARS:
            following += "\n" + lines[j]
            j += 1
        out.append(_line_in_context(ln, following[:_CONTEXT_CHARS]))
    return out


__all__ = ["NEWLINE_TOKEN", "lex", "tokenize_document", "tokenize_lines"]
