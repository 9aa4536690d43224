"""Builds the caption fixture corpus scored by ``tools/caption_reference.py`` (deterministic).

Medical-caption strings from templates and fragments plus hand-written tricky cases: brackets of
every kind, units and decimals, percentages, ranges, slashes, ampersands, hyphenated compounds,
abbreviations with periods, straight and curly quotes and apostrophes, non-ASCII, numbered lists,
empty and whitespace-only strings, several sentences, tabs and newlines. Each sample is one
prediction and 1-5 references. Line breaks other than ``\\n`` are left out: pycocoevalcap only
replaces ``\\n`` and a ``\\r`` or U+2028 would shift every later caption by one line there.
"""

from __future__ import annotations

import random

FINDINGS = [
    "pleural effusion", "consolidation", "pneumothorax", "nodule", "mass", "ground-glass opacity",
    "atelectasis", "cardiomegaly", "fracture", "lesion", "cyst", "hemorrhage", "infarct", "edema",
    "lymphadenopathy", "calcification", "well-defined lesion", "ill-defined mass", "non-small-cell tumor",
    "T2-hyperintense focus", "contrast-enhancing lesion", "H&E-stained section", "café-au-lait macule",
    "Crohn's disease", "Sjögren's syndrome", "α-fetoprotein elevation", "β-thalassemia", "γ-knife scar",
    "adenocarcinoma", "metastases", "abscess", "aneurysm", "stenosis", "thrombus",
]
LOCATIONS = [
    "right upper lobe", "left lower lobe", "RUL", "LLL", "the liver (segment VII)", "the left kidney",
    "the brain [frontal lobe]", "the spleen {hilum}", "the heart", "T1/T2 junction", "L4-L5 level",
    "C5–C6 level", "the patient's left breast", "the patient’s right knee", "the mediastinum",
    "the pancreatic head", "the thyroid gland", "the retroperitoneum", "the Rt. hip", "the lt. ovary",
    "segment IV/VIII", "the ED/ICU image", "zone 2/3",
]
SIZES = [
    "5.2 mm", "0.5cm", "3x3 cm", "3 x 4 cm", "3×4 cm", "12 mm", "1.5-2.0 cm", "2–3 cm", "approx. 4 cm",
    "ca. 5 cm", "~7 mm", "<5 mm", "> 10 mm", "≥ 2 cm", "≤3mm", "1/2 inch", "3 1/2 cm", "½ cm", "10 µm",
    "40 μm", "2.5cm x 1.2cm", "5 by 6 mm", "1,200 mL", "0.75 mg/kg", "37.5 °C", "37°C", "3.5 ± 0.2 cm",
    "1e-3 mm", "10^3 cells", "5 mm²", "2.0 cm³", "15 %", "20%", "~30%", "50-60%", "3-5", "3 - 5",
    "3 to 5", "10—15",
]
MODIFIERS = [
    "small", "large", "mild", "moderate", "severe", "acute", "chronic", "bilateral", "subtle", "new",
    "stable", "well-circumscribed", "partially calcified", "non-enhancing", "T1-weighted", "X-ray-visible",
    "so-called", "e.g. focal", "i.e. diffuse",
]
STAINS = ["H&E", "H & E", "PAS", "IHC", "Ki-67", "CD3/CD20", "AT&T", "R&D", "Q&A", "S&P", "H&amp;E"]
VIEWS = ["PA", "AP", "lateral", "axial", "coronal", "sagittal", "T1/T2", "T2/FLAIR", "DWI/ADC", "PET/CT"]
OPENERS = [
    "", "", "", "", "Image shows ", "There is a ", "Findings: ", "Note: ", "Dr. Smith notes a ",
    "Compared with prior, ", "IMPRESSION: ", "1. ", "2) ", "(a) ", "i) ", "a. ", "Step 1: ", "- ",
    "* ", "• ", "> ", "\"", "“", "'", "‘", "[", "(", "{", "<b>", "Fig. 3: ", "fig. 2a shows ",
    "No. 4 ", "Pt. ", "The pt's ", "It's a ", "There's a ", "e.g., ", "i.e., ", "Approx. ", "vs. ",
]
CLOSERS = [
    ".", ".", ".", "", "", " .", "!", "?", "...", ". . .", "…", ";", ":", ",", "\"", "”", "'", "’",
    ")", "]", "}", "</b>", ". No change.", ". The patient doesn't smoke.", ". It can't be excluded.",
    ", etc.", " vs. prior.", " (see Fig. 2).", " [arrow].", " {note}.", " <ref>.", " -- stable.",
    " - stable", " — stable.", " – stable.", " & stable.", " cf. prior.", ". U.S. guidelines.",
    " at 3:30 p.m.", " on 12/05/2020.", " (n=12).", " (p<0.05).", " (p = 0.03).", " :)", " ;-)",
    ". Won't change.", ". They're stable.", " in the '90s.", " at 5 o'clock.", " cannot be excluded.",
    " w/o contrast.", " s/p resection.", " and/or edema.", " +/- edema.", " (+).", " (-).", " #3.",
    " @ 5 mm.", " $5.", " 50 €.", " £3.", " § 4.", " ©2020.", " (1) (2) (3).", " \tend.", "\t",
]
TEMPLATES = [
    "{open}{mod} {finding} in {loc}{close}",
    "{open}{mod} {finding} measuring {size} in {loc}{close}",
    "{open}{finding} ({size}) in {loc}{close}",
    "{open}{view} view shows {mod} {finding}{close}",
    "{open}{stain} stain: {mod} {finding}, {size}{close}",
    "{open}{finding} of {loc} [{size}]{close}",
    "{open}{finding} {{{size}}} near {loc}{close}",
    "{open}<{size}> {finding}{close}",
    "{open}no {finding}; {mod} {finding2} in {loc}{close}",
    "{open}{mod} {finding} in {loc}. {mod2} {finding2} in {loc2}{close}",
    "{open}{finding} in {loc}, i.e., {mod} ({size}){close}",
    "{open}{finding} vs. {finding2}, e.g. in {loc}{close}",
    "{open}\"{mod} {finding}\" in {loc}{close}",
    "{open}“{mod} {finding}” in {loc}{close}",
    "{open}the {finding}'s margin is {mod}{close}",
    "{open}{finding}\nin {loc}{close}",
    "{open}{finding}\t({view}){close}",
    "{open}1. {finding} 2. {finding2} 3. {size}{close}",
    "{open}(a) {finding}; (b) {finding2}{close}",
    "{open}{FINDING} IN {LOC}{close}",
]

TRICKY = [
    "", " ", "  ", "\t", " \t ", "\n", " \n ", ".", "...", "-", "--", "---", "(", ")", "()", "[]", "{}",
    "<>", "< >", "'", "\"", "''", "``", "’", "“”", "a", "A.", "I.", "U.S.", "U.S. The lesion is small.",
    "The H&E-stained section (x40) shows [arrow] {note} <b>tumor</b>.",
    "AT&T and R&D, e.g., i.e., Dr. Smith vs. approx. 5.2 mm 0.5cm 3x3 50% 3-5 3–5 T1/T2",
    "The patient's lungs aren't clear; \"quoted\" ‘single’ “double” can't won't cannot",
    "µm 5° ±2 3×4 café α-fetoprotein β CJK 肺癌 Ω",
    "1. First 2) second (a) third i) fourth",
    "Mr. Jones went to the U.S. He said hi.",
    "It is 3:30 p.m. on 12/05/2020. Size 1,000 ml. 1/2 3 1/2",
    "x-ray ... -- - word--word $5 #3 @home a+b a=b ~5 ^2 * | \\ _",
    "See www.example.com or https://example.org/path?q=1 for details.",
    "Contact radiology@example.org for the report.",
    "Call 650-555-1234 or (650) 555-1234.",
    "Gonna be fine, 'tis nothing, 'twas stable, lemme see.",
    "C++ and C# are not modalities.",
    "Ph.D. and M.D. and Jr. and Inc. and Co. Ltd. and Pty. Ltd.",
    "Located at 5 St. Mary's Rd. near Jan. 5th.",
    "Etc. The next sentence.", "etc. the next clause.", "See fig. 3 and figs. 4-5, ca. 12 mm, no. 7.",
    "-LRB- literal -RRB- tokens -LSB- here -RSB-",
    "He said ''no'' and `yes'.", "«French quotes» and ‹single›.", "„German quotes“",
    "The report.pdf and image.png files.", "File scan.dcm and notes.txt.",
    "Temperature 38.5°C, SpO2 95%, HR 110/min, BP 120/80 mmHg.",
    "Value ≥ 5, ≤ 3, ≠ 4, ≈ 2, → next, ← prev, ↑ up, ↓ down.",
    "Ångström naïve résumé coöperate façade Œdema ßeta.",
    "Greek: α β γ δ ε ζ η θ ι κ λ μ ν ξ ο π ρ σ ς τ υ φ χ ψ ω; ΑΒΓΔ ΣΟΦΟΣ.",
    "CJK 肺部结节，直径5毫米。 Japanese 肺がん。 Korean 폐암.",
    "Smiley :) and :-( and ;) and :D and (^_^) and ^_^ here.",
    "Ellipsis... then . . . then … then ....",
    "em—dash, en–dash, minus −5, hyphen‐char, non‑breaking‑hyphen.",
    "Soft\u00adhyphen and non\u00a0breaking space and thin\u2009space.",
    "Zero\u200bwidth space and BOM\ufeff here.",
    "Fractions ¼ ½ ¾ ⅓ ⅔ and superscripts x² y³ and subscripts H₂O CO₂.",
    "Currency $5 US$10 €20 £30 ¥40 ¢50.",
    "Ranges 3-5, 3–5, 3—5, 3 - 5, 3--5, 3---5, -5 to +5, ±5.",
    "Percentages 50%, 50 %, 50pct, ~50%, >50%, <50%, 50‰.",
    "Units 5mm, 5 mm, 5-mm, 5.0mm, .5mm, 0.5 mm, 5mm2, 5 mm^2, 3x3x3 mm.",
    "Slashes T1/T2 and/or +/- w/ w/o s/p c/o 1/3 a/b/c.",
    "Ampersands H&E, H & E, H&E-stained, AT&T, A&P, B&W, Q&A's, S&P 500, S&Ls, &amp; done.",
    "Hyphens well-defined x-ray X-ray T2-weighted non-small-cell pre- and post-contrast anti-inflammatory.",
    "Quotes: \"double\", 'single', “curly double”, ‘curly single’, `backtick', ''two''.",
    "Possessives: patient's, patients', patient’s, James's, it's, its, Crohn's.",
    "Clitics: don't, doesn't, isn't, aren't, can't, won't, shouldn't, I'm, you're, we've, they'll, he'd.",
    "Curly clitics: don’t, isn’t, it’s, we’re, they’ll.",
    "Numbered list:\n1. effusion\n2. nodule\n3. mass",
    "Tabs\tbetween\twords\tand  double  spaces.",
    "Trailing spaces   ", "   Leading spaces", "Mixed \t whitespace \t inside",
    "UPPER CASE FINDING IN RIGHT LUNG.", "MiXeD CaSe FiNdInG.",
    "Abbrevs: e.g. i.e. etc. vs. cf. approx. incl. excl. Dr. Mr. Mrs. Ms. Prof. St. No. Fig. Vol. pp. al.",
    "et al. reported it.", "Smith et al. The end.", "In Jan. the scan; in Feb. The scan.",
    "The U.S.A. and U.K. guidelines; a.m. and p.m. readings.",
    "A. B. C. are options; I. II. III. are stages.",
    "Dates 2020-01-05, 01/05/2020, 5/1/20, 5-1-2020.", "Times 3:30, 03:30:15, 3.30pm.",
    "Numbers 1,000 1,000,000 1.000,5 3.14159 -0.5 +0.5 .5 5. 1e5.",
    "Email me: a.b@c.d and @handle and #hashtag.",
    "Asterisks *important* and **bold** and ***.",
    "Backslash \\ and pipe | and caret ^ and tilde ~.",
    "Bracket kinds: (round) [square] {curly} <angle> ((nested)) [(mixed)] {[<all>]}.",
    "Unbalanced ( bracket and ] other.", "a<b and c>d and e<=f and g>=h.", "<<double angle>>",
    "<p>HTML paragraph</p> and <br/> and <img src='x.png'> and <!-- comment -->.",
    "Pipes || and double-hyphen -- and triple --- and quadruple ---- and five -----.",
    "Sentence one. Sentence two! Sentence three? Sentence four.",
    "Multiple\nline\ncaption\n", "\nleading newline", "trailing newline\n", "a\n\nb",
    "Question?! Exclamation!!! Interrobang‽",
    "Degree 90° angle, 45 ° angle, 3°C, °F.", "Micro µg μg mcg.", "Times × and divide ÷ and dot ·.",
    "Arrows → ⇒ ← and math ∑ ∞ √ ∆.", "Bullets • ◦ ▪ and section § and pilcrow ¶.",
    "Roman numerals II, III, IV; grade IIb; stage T2N0M0.", "pT2 N1a M0 (AJCC 8th ed.)",
    "BI-RADS 4A; PI-RADS 5; TI-RADS 3.", "HbA1c 7.2% and eGFR >60 mL/min/1.73m².",
    "Ki-67 index 20-30%; ER+/PR+/HER2-.", "EGFR-mutant, ALK-negative NSCLC.",
    "O'Brien's sign, D'Angelo, l'hôpital, o'clock.", "Rock 'n' roll and 'em and 'til.",
    "'90s and '05 cohorts.", "y'all and ma'am.",
]

# Pieces that exercise the tokenizer's special rules (abbreviations before a capitalised word or a
# digit on the next line, clitics, URLs, e-mails, phone numbers, SGML, entities, smileys, fractions,
# file names, currencies, CJK punctuation); glued together at random into "soup" captions.
SOUP = [
    "I.", "U.S.", "etc.", "fig.", "Fig.", "ca.", "No.", "Co.", "Pty.", " Ltd", " The", " He", " It", " <b> ", "\t",
    " ", "  ", "3", "12", "1/2", "3 1/2", "650-555-1234", "(650) 555-1234", "555.123.4567", "+1 650 555 1234",
    "it's", "don't", "n't", "'s", "'S", "O'Brien", "y'all", "'90s", "'em", "cont'd", "'twas", "'tis", "gonna",
    "cannot", "CANNOT", "http://a.b/c", "www.x.org", "a.b@c.de", "<x@y.z>", "@user", "#tag", "C++", "c#",
    "S&P-500", "AT&T", "H&E", "&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&nbsp;", "&mdash;", "&#123;",
    "&eacute;", "-LRB-", "-rrb-", "pro-", "anti-", "...", ". . .", "…", "--", "---", "----", "-----", ":)",
    ":-(", ";P", "^_^", "(^_^)", "<3", "=)", "x.y.z", "a.m.", "p.m.", "Ph.D.", "U.K.", "e.g.", "i.e.", "\"",
    "'", "`", "``", "''", "“", "”", "‘", "’", "«", "»", "(", ")", "[", "]", "{", "}", "<", ">", "<<", ">>",
    "report.pdf", "scan.DCM", "a.txt", "x-ray", "T2-weighted", "non-small-cell", "well-", "-5", "+5", "5.",
    ".5", "1,000", "1.000,5", "12/05/2020", "5-1-20", "3:30", "½", "²", "₂", "⁺²", "$", "US$", "€", "£", "¢",
    "¥", "%", "‰", "°", "µ", "±", "×", "÷", "→", "≥", "α", "β", "Ω", "é", "ß", "ﬁ", "肺", "。", "、", "！",
    "Mr.", "Dr.", "vs.", "St.", "Jan.", "Mass.", "Calif.", "Inc.", "Jr.", "al.", "Bldg.", "pp.", "op.",
    "effusion", "nodule", "mass", "left", "lung",
]


def _soup(rng: random.Random) -> str:
    return "".join(rng.choice(SOUP) + (" " if rng.random() < 0.5 else "") for _ in range(rng.randint(0, 8)))


def _fill(rng: random.Random) -> str:
    t = rng.choice(TEMPLATES)
    finding, finding2 = rng.choice(FINDINGS), rng.choice(FINDINGS)
    loc = rng.choice(LOCATIONS)
    s = t.format(
        open=rng.choice(OPENERS), close=rng.choice(CLOSERS), mod=rng.choice(MODIFIERS),
        mod2=rng.choice(MODIFIERS).capitalize(), finding=finding, finding2=finding2, loc=loc,
        loc2=rng.choice(LOCATIONS), size=rng.choice(SIZES), view=rng.choice(VIEWS), stain=rng.choice(STAINS),
        FINDING=finding.upper(), LOC=loc.upper(),
    )
    return s[:1].upper() + s[1:] if rng.random() < 0.6 else s


def _perturb(rng: random.Random, s: str) -> str:
    """A prediction near a reference: drop/duplicate/swap words, change case or punctuation."""
    words = s.split(" ")
    op = rng.randrange(6)
    if op == 0 and len(words) > 2:
        del words[rng.randrange(len(words))]
    elif op == 1:
        i = rng.randrange(len(words))
        words.insert(i, words[i])
    elif op == 2 and len(words) > 3:
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    elif op == 3:
        return s.lower()
    elif op == 4:
        return s.rstrip(".") + rng.choice([".", "", " .", "!", ";"])
    else:
        words[rng.randrange(len(words))] = rng.choice(FINDINGS)
    return " ".join(words)


def build_corpus(n_generated: int = 700, n_soup: int = 250, seed: int = 12) -> list[dict[str, object]]:
    """Samples ``{"id": str, "prediction": str, "references": [str, ...]}`` (1-5 references), in a
    fixed order: the hand-written tricky strings first (each as a prediction, and again as a
    reference of another sample), then ``n_generated`` template samples, then ``n_soup`` samples
    glued from :data:`SOUP` pieces."""
    samples: list[dict[str, object]] = []
    n_tricky = len(TRICKY)
    for i, s in enumerate(TRICKY):
        rng = random.Random(f"{seed}-tricky-{i}")
        refs = [TRICKY[(i * 7 + 3) % n_tricky]] + [_fill(rng) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.5:
            refs.insert(0, _perturb(rng, s) if s.strip() else s)
        samples.append({"id": f"t{i:03d}", "prediction": s, "references": refs})
    for i in range(n_generated):
        rng = random.Random(f"{seed}-gen-{i}")
        refs = [_fill(rng) for _ in range(rng.randint(1, 5))]
        r = rng.random()
        if r < 0.04:
            pred = rng.choice(["", " ", "\t", "  \n "])
        elif r < 0.55:
            pred = _perturb(rng, rng.choice(refs))
        elif r < 0.6:
            pred = rng.choice(refs)
        else:
            pred = _fill(rng)
        samples.append({"id": f"g{i:04d}", "prediction": pred, "references": refs})
    for i in range(n_soup):
        rng = random.Random(f"{seed}-soup-{i}")
        refs = [_soup(rng) if rng.random() < 0.5 else _fill(rng) for _ in range(rng.randint(1, 3))]
        samples.append({"id": f"s{i:04d}", "prediction": _soup(rng), "references": refs})
    bad = "\r\x0b\x0c\x85\u2028\u2029"
    for smp in samples:
        smp_refs = smp["references"]
        assert isinstance(smp_refs, list) and 1 <= len(smp_refs) <= 5, smp
        for text in [smp["prediction"], *smp_refs]:
            assert isinstance(text, str) and not any(c in text for c in bad), text
    return samples
