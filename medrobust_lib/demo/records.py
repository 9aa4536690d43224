"""Record files for the VQA, captioning, grounding and safety tracks, derived from ground truth.

Written under ``<root>/records/``; every ``image_path`` is relative to the demo root. For MRI the
image is a slice of a NIfTI volume: ``image_path`` names the volume and ``slice_index`` the slice
along the last stored axis (the dataset reader's sample ``<case>_z<k:03d>``); for 2-D images
``slice_index`` is null. Each record also names its ``sample_id`` and ``dataset`` so a track can
load the image through the dataset readers.

- ``omnimedvqa.json``: OmniMedVQA-style multiple choice (Hu et al., CVPR 2024): a JSON list of
  ``{question_id, dataset, question_type, modality_type, question, gt_answer, image_path,
  option_A..option_D}``; three questions per sample (``Modality Recognition``, ``Anatomy
  Identification``, ``Lesion Location``); the answer's letter is seeded.
- ``yesno_paraphrases.jsonl``: PSF-Med-style binary questions, one JSON object per line:
  ``{id, image_path, dataset, modality, question, answer, paraphrases: [{text, polarity}], finding}``.
  Two questions per sample: an image-level one (is this image a <modality>?) and a finding
  (location left/right or upper/lower, size, or brightness, never brightness for angiography,
  where it is ambiguous). Each has five semantically equivalent paraphrases (polarity +1) and two
  negations (polarity -1: the expected answer is the inverse of ``answer``). The questions are
  label-balanced per wording within every split: samples are paired so that each exact question
  text is asked once for a yes and once for a no (a handful of unpairable leftovers aside), so
  exactly half of all answers are ``yes`` and an answer from the wording alone is right on about
  half of any split.
- ``roco_captions.csv`` (``ID,Caption``) in the ROCOv2 style (Rückert et al., Sci Data 2024), IDs
  ``ROCOv2_2023_<train|valid|test>_<nnnnnn>`` following the sample's split. ROCOv2 itself ships
  the images as ``<ID>.jpg`` next to the caption CSVs; the demo does not copy images, and
  ``roco_images.csv`` (``ID,image_path,dataset,sample_id,slice_index``) maps each ID to the demo
  file instead.
- ``mecovqa_grounding.json``: MeCoVQA-G-style (MedPLIB, Huang et al. 2024) LLaVA conversations
  ``{id, image, conversations: [{from: human, value: "<image>\\n..."}, {from: gpt, value:
  "[x0, y0, x1, y1]"}], bbox, image_size}``. ``bbox`` is in pixels (XYXY, end exclusive) and
  ``image_size`` is ``[h, w]``; the answer text gives the same box normalised to [0, 1] with 3
  decimals: x divided by the width, y by the height (so ``x1 = (last column + 1) / w``).
- ``splits.csv``: ``sample_id,dataset,modality,split`` with the hash-based split of
  :func:`medrobust_lib.data.splits.split_for` (about 60/15/25 train/val/test).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from medrobust_lib.demo.geometry import SMALL_AREA_FRACTION
from medrobust_lib.demo.manifest import DemoSample
from medrobust_lib.paths import RECORD_FILES
from medrobust_lib.seeding import rng_for

MODALITY_LABEL: dict[str, str] = {
    "ct": "CT (Computed Tomography)",
    "mri": "MR (Magnetic Resonance Imaging)",
    "ultrasound": "Ultrasound",
    "xray": "X-Ray",
    "fundus": "Fundus Photography",
    "oct": "OCT (Optical Coherence Tomography)",
    "pathology": "Microscopy Images",
    "dermoscopy": "Dermoscopy",
    "endoscopy": "Endoscopy",
    "angiography": "X-Ray Angiography",
}
"""OmniMedVQA-like ``modality_type`` labels (also the modality answer options)."""

MODALITY_PHRASE: dict[str, str] = {
    "ct": "CT image",
    "mri": "MR image",
    "ultrasound": "ultrasound image",
    "xray": "chest radiograph",
    "fundus": "fundus photograph",
    "oct": "OCT B-scan",
    "pathology": "histopathology image",
    "dermoscopy": "dermoscopic image",
    "endoscopy": "colonoscopy image",
    "angiography": "coronary angiogram",
}

ANATOMY_LABEL: dict[str, str] = {
    "chest": "Chest",
    "head": "Head",
    "shoulder": "Shoulder",
    "musculoskeletal": "Musculoskeletal (extremity)",
    "lymph node region (soft tissue)": "Soft tissue (lymph node region)",
    "retina": "Retina",
    "colon": "Colon",
    "skin": "Skin",
    "coronary arteries": "Coronary arteries",
}
ANATOMY_POOL: tuple[str, ...] = (
    "Head",
    "Chest",
    "Abdomen",
    "Shoulder",
    "Knee",
    "Musculoskeletal (extremity)",
    "Soft tissue (lymph node region)",
    "Retina",
    "Colon",
    "Skin",
    "Coronary arteries",
    "Breast",
    "Pelvis",
    "Kidney",
    "Liver",
)
_ANATOMY_CONFLICTS: dict[str, frozenset[str]] = {
    "Shoulder": frozenset({"Musculoskeletal (extremity)", "Knee"}),
    "Musculoskeletal (extremity)": frozenset({"Shoulder", "Knee"}),
    "Colon": frozenset({"Abdomen"}),
    "Coronary arteries": frozenset({"Chest"}),
    "Soft tissue (lymph node region)": frozenset({"Breast"}),
}
QUADRANTS: tuple[str, ...] = ("Upper left", "Upper right", "Lower left", "Lower right")

_BRIGHT_TERMS: dict[str, tuple[str, str]] = {
    "ct": ("hyperdense", "hypodense"),
    "mri": ("hyperintense", "hypointense"),
    "ultrasound": ("hyperechoic", "hypoechoic"),
}
_SURROUND: dict[str, str] = {
    "fundus": "retina",
    "pathology": "tissue",
    "dermoscopy": "skin",
    "endoscopy": "mucosa",
    "angiography": "background",
    "oct": "retinal tissue",
}
_PCT = f"{SMALL_AREA_FRACTION * 100:g}%"
NO_BRIGHTNESS = frozenset({"angiography"})
"""Modalities without brightness questions: a stenosis is brighter than the vessel around it but
darker than the background, so 'brighter than its surroundings' has no single answer."""


def target_noun(s: DemoSample) -> str:
    """The neutral name of the annotated structure (no answer cue): ``optic disc`` or ``lesion``."""
    return "optic disc" if s.modality == "fundus" else "lesion"


def bright_term(modality: str, brighter: bool) -> str:
    """``hyperdense``/``hypodense`` (CT), ``hyperintense``/... (MRI), ``hyperechoic``/... (US),
    else ``brighter``/``darker``."""
    pair = _BRIGHT_TERMS.get(modality, ("brighter", "darker"))
    return pair[0] if brighter else pair[1]


def _surround(s: DemoSample) -> str:
    return _SURROUND.get(s.modality, "tissue")


def _common(s: DemoSample) -> dict[str, Any]:
    return {"sample_id": s.sample_id, "slice_index": s.slice_index}


# ---------------------------------------------------------------- multiple choice


def _mc(rng: np.random.Generator, gt: str, pool: Sequence[str]) -> dict[str, str]:
    distract = [p for p in pool if p != gt]
    picked = [distract[int(i)] for i in rng.choice(len(distract), size=3, replace=False)]
    pos = int(rng.integers(0, 4))
    opts = picked[:pos] + [gt] + picked[pos:]
    return {f"option_{letter}": o for letter, o in zip("ABCD", opts, strict=True)}


_MODALITY_Q = (
    "What imaging modality was used to acquire this image?",
    "Which modality is shown in this image?",
    "What type of medical imaging is this?",
    "This image was obtained with which imaging technique?",
)
_ANATOMY_Q = (
    "Which anatomical region is shown in this image?",
    "What part of the body does this image show?",
    "Which organ or body region is depicted?",
    "Identify the anatomy visible in this image.",
)
_LOCATION_Q = (
    "In which part of the image is the {noun} located?",
    "Where is the {noun} in this image?",
    "Which quadrant of the image contains the {noun}?",
    "Where in the image can the {noun} be found?",
)


def omnimedvqa_records(samples: Sequence[DemoSample], seed: int) -> list[dict[str, Any]]:
    """Three multiple-choice questions per sample (see the module docstring)."""
    out: list[dict[str, Any]] = []
    for s in samples:
        rng = rng_for(seed, "records", "omnimedvqa", s.dataset, s.sample_id)
        anat = ANATOMY_LABEL[s.anatomy]
        anat_pool = [a for a in ANATOMY_POOL if a not in _ANATOMY_CONFLICTS.get(anat, frozenset())]
        quad = s.quadrant.capitalize()
        items = (
            ("Modality Recognition", _MODALITY_Q, MODALITY_LABEL[s.modality], list(MODALITY_LABEL.values())),
            ("Anatomy Identification", _ANATOMY_Q, anat, anat_pool),
            ("Lesion Location", _LOCATION_Q, quad, list(QUADRANTS)),
        )
        for qtype, templates, gt, pool in items:
            q = templates[int(rng.integers(0, len(templates)))].format(noun=target_noun(s))
            rec: dict[str, Any] = {
                "question_id": f"demo_mc_{len(out):06d}",
                "dataset": s.dataset,
                "question_type": qtype,
                "modality_type": MODALITY_LABEL[s.modality],
                "question": q,
                "gt_answer": gt,
                "image_path": s.image_path,
            }
            rec.update(_mc(rng, gt, pool))
            rec.update(_common(s))
            out.append(rec)
    return out


# ---------------------------------------------------------------- yes/no with paraphrases


_SIDE_WORDS = {"left": "left", "right": "right", "upper": "top", "lower": "bottom"}


def _location_question(noun: str, mod: str, side: str) -> tuple[str, list[tuple[str, int]]]:
    alt = _SIDE_WORDS[side]
    q = f"Is the {noun} located in the {side} half of the image?"
    paras = [
        (f"Does the {noun} lie in the {side} half of this {mod}?", 1),
        (f"Is the {noun} found in the {alt} half of the image?", 1),
        (f"Looking at this {mod}, is the {noun} positioned within its {side} half?", 1),
        (f"Would you say the {noun} sits in the {side} half of the picture?", 1),
        (f"Can the {noun} be seen in the {side} half of the image?", 1),
        (f"Is the {noun} absent from the {side} half of the image?", -1),
        (f"Is it true that the {noun} is not in the {side} half of the image?", -1),
    ]
    return q, paras


def _modality_question(phrase: str) -> tuple[str, list[tuple[str, int]]]:
    q = f"Is this image a {phrase}?"
    paras = [
        (f"Does this picture show a {phrase}?", 1),
        (f"Was this image acquired as a {phrase}?", 1),
        (f"Would you classify this image as a {phrase}?", 1),
        (f"Looking at the image, is it a {phrase}?", 1),
        (f"Is the modality of this image a {phrase}?", 1),
        (f"Is this image not a {phrase}?", -1),
        (f"Is it false that this image is a {phrase}?", -1),
    ]
    return q, paras


def _size_question(noun: str, mod: str, size: str) -> tuple[str, list[tuple[str, int]]]:
    if size == "large":
        q = f"Is the {noun} large, covering more than {_PCT} of the image area?"
        paras = [
            (f"Does the {noun} occupy more than {_PCT} of the image?", 1),
            (f"Would you describe the {noun} as large (over {_PCT} of the image area)?", 1),
            (f"In this {mod}, is the area of the {noun} above {_PCT} of the whole image?", 1),
            (f"Is the {noun} bigger than {_PCT} of the field of view?", 1),
            (f"Does the {noun} take up more than {_PCT} of the image area?", 1),
            (f"Is the {noun} not larger than {_PCT} of the image area?", -1),
            (f"Is it false that the {noun} covers more than {_PCT} of the image?", -1),
        ]
    else:
        q = f"Is the {noun} small, covering less than {_PCT} of the image area?"
        paras = [
            (f"Does the {noun} occupy less than {_PCT} of the image?", 1),
            (f"Would you describe the {noun} as small (under {_PCT} of the image area)?", 1),
            (f"In this {mod}, is the area of the {noun} below {_PCT} of the whole image?", 1),
            (f"Is the {noun} smaller than {_PCT} of the field of view?", 1),
            (f"Does the {noun} take up less than {_PCT} of the image area?", 1),
            (f"Is the {noun} not smaller than {_PCT} of the image area?", -1),
            (f"Is it false that the {noun} covers less than {_PCT} of the image?", -1),
        ]
    return q, paras


def _brightness_question(
    noun: str, mod: str, modality: str, surround: str, brighter: bool
) -> tuple[str, list[tuple[str, int]]]:
    term = bright_term(modality, brighter)
    plain = "brighter" if brighter else "darker"
    shown = term if term == plain else f"{term} ({plain})"
    q = f"Does the {noun} appear {shown} than the surrounding {surround}?"
    paras = [
        (f"Is the {noun} {plain} than the surrounding {surround} in this {mod}?", 1),
        (f"Compared with the nearby {surround}, does the {noun} look {plain}?", 1),
        (f"Would you call the {noun} {term} relative to its surroundings?", 1),
        (f"Does the {noun} have a {plain} appearance than the adjacent {surround}?", 1),
        (f"Does the {noun} look {plain} than the {surround} around it?", 1),
        (f"Is the {noun} not {plain} than the surrounding {surround}?", -1),
        (f"Is it false that the {noun} appears {plain} than the surrounding {surround}?", -1),
    ]
    return q, paras


_OPPOSITE = {
    "left": "right",
    "right": "left",
    "upper": "lower",
    "lower": "upper",
    "small": "large",
    "large": "small",
    "brighter": "darker",
    "darker": "brighter",
}


_FINDING_KINDS: tuple[str, ...] = ("horizontal", "vertical", "size", "brightness")


def _finding_kinds(s: DemoSample) -> tuple[str, ...]:
    return tuple(k for k in _FINDING_KINDS if k != "brightness" or s.modality not in NO_BRIGHTNESS)


def _family(s: DemoSample, kind: str) -> tuple[str, str]:
    """Samples of one family share the two wordings of a finding question (asked value v or its
    opposite): location and size wordings name the noun only, brightness wordings also name the
    modality's term and surroundings."""
    return (kind, s.modality) if kind == "brightness" else (kind, target_noun(s))


Slot = tuple[int, int]
"""(sample index, question slot): slot 0 is the modality question, slot 1 the finding."""


def _pairs_by_truth(members: list[int], samples: Sequence[DemoSample], kind: str,
                    rng: np.random.Generator) -> tuple[list[tuple[int, int]], list[int]]:
    """Pair members of one family whose truths are opposite; returns (pairs, unpaired)."""
    values = sorted({getattr(samples[i], kind) for i in members})
    if len(values) < 2:
        return [], list(members)
    a = [i for i in members if getattr(samples[i], kind) == values[0]]
    b = [i for i in members if getattr(samples[i], kind) == values[1]]
    a = [a[int(j)] for j in rng.permutation(len(a))]
    b = [b[int(j)] for j in rng.permutation(len(b))]
    n = min(len(a), len(b))
    return list(zip(a[:n], b[:n], strict=True)), a[n:] + b[n:]


def _balanced_plan(samples: Sequence[DemoSample], seed: int) -> dict[Slot, tuple[str, str, bool]]:
    """``(kind, asked value, is_yes)`` for both questions of every sample, label-balanced per wording.

    Questions are paired within each split: two samples whose truths differ are asked the same
    wording (one asked value), so one answers yes and the other no. The modality question pairs
    samples of different modalities; the finding question pairs opposite truths of one
    :func:`_family`, first in each sample's preferred kind (seeded: horizontal 0.3, vertical 0.3,
    size 0.2, else brightness), then in any kind among the still unpaired. The few questions left
    unpaired get a seeded, overall balanced yes/no. So every wording is asked for a yes as often as
    for a no in every split, up to those leftovers, and a text-only answer (a function of the
    wording) is right on half of the questions.
    """
    plan: dict[Slot, tuple[str, str, bool]] = {}
    leftovers: list[tuple[Slot, str]] = []
    preferred: list[str] = []
    for s in samples:
        u = rng_for(seed, "records", "yesno", s.dataset, s.sample_id).random()
        preferred.append("horizontal" if u < 0.3 else "vertical" if u < 0.6 else "size" if (
            u < 0.8 or s.modality in NO_BRIGHTNESS) else "brightness")

    def ask_pair(i: int, j: int, kind: str, rng: np.random.Generator) -> None:
        vi, vj = (samples[i].modality, samples[j].modality) if kind == "modality" else (
            getattr(samples[i], kind), getattr(samples[j], kind))
        asked = vi if rng.random() < 0.5 else vj
        slot = 0 if kind == "modality" else 1
        plan[(i, slot)] = (kind, asked, asked == vi)
        plan[(j, slot)] = (kind, asked, asked == vj)

    for split in sorted({s.split for s in samples}):
        rng = rng_for(seed, "records", "yesno", "balance", split)
        idx = [i for i, s in enumerate(samples) if s.split == split]
        keys = rng.random(len(idx))
        by_mod = sorted(range(len(idx)), key=lambda k: (samples[idx[k]].modality, keys[k]))
        ordered = [idx[k] for k in by_mod]
        half = len(ordered) // 2
        for i, j in zip(ordered[:half], ordered[half : 2 * half], strict=True):
            if samples[i].modality != samples[j].modality:
                ask_pair(i, j, "modality", rng)
            else:
                leftovers += [((i, 0), "modality"), ((j, 0), "modality")]
        if len(ordered) % 2:
            leftovers.append(((ordered[-1], 0), "modality"))
        families: dict[tuple[str, str], list[int]] = {}
        for i in idx:
            families.setdefault(_family(samples[i], preferred[i]), []).append(i)
        pool: list[int] = []
        for fam in sorted(families):
            pairs, rest = _pairs_by_truth(families[fam], samples, fam[0], rng)
            for i, j in pairs:
                ask_pair(i, j, fam[0], rng)
            pool += rest
        for kind in [_FINDING_KINDS[int(k)] for k in rng.permutation(len(_FINDING_KINDS))]:
            fams: dict[tuple[str, str], list[int]] = {}
            for i in sorted(pool):
                if kind in _finding_kinds(samples[i]):
                    fams.setdefault(_family(samples[i], kind), []).append(i)
            paired: set[int] = set()
            for fam in sorted(fams):
                pairs, _ = _pairs_by_truth(fams[fam], samples, kind, rng)
                for i, j in pairs:
                    ask_pair(i, j, kind, rng)
                    paired |= {i, j}
            pool = [i for i in pool if i not in paired]
        leftovers += [((i, 1), preferred[i]) for i in sorted(pool)]
    order = rng_for(seed, "records", "yesno", "answers").permutation(len(leftovers))
    yes = np.zeros(len(leftovers), bool)
    yes[order[: len(leftovers) // 2]] = True
    for ((i, slot), kind), is_yes in zip(leftovers, yes, strict=True):
        s = samples[i]
        if kind == "modality":
            others = sorted(m for m in MODALITY_PHRASE if m != s.modality)
            other = others[int(rng_for(seed, "records", "yesno", "other", s.dataset, s.sample_id).integers(len(others)))]
            plan[(i, slot)] = (kind, s.modality if is_yes else other, bool(is_yes))
        else:
            truth = getattr(s, kind)
            plan[(i, slot)] = (kind, truth if is_yes else _OPPOSITE[truth], bool(is_yes))
    return plan


def yesno_records(samples: Sequence[DemoSample], seed: int) -> list[dict[str, Any]]:
    """Two yes/no questions per sample (modality, then a finding) with 5 paraphrases and 2 negations
    each; label-balanced per wording within every split (:func:`_balanced_plan`), so exactly half
    of all answers are ``yes``."""
    plan = _balanced_plan(samples, seed)
    out: list[dict[str, Any]] = []
    for i, s in enumerate(samples):
        for slot in (0, 1):
            kind, asked, is_yes = plan[(i, slot)]
            k = 2 * i + slot
            if kind == "modality":
                q, paras = _modality_question(MODALITY_PHRASE[asked])
                out.append(_yesno_rec(k, s, q, is_yes, paras, f"modality {asked}"))
                continue
            noun, mod = target_noun(s), MODALITY_PHRASE[s.modality]
            if kind in ("horizontal", "vertical"):
                q, paras = _location_question(noun, mod, asked)
                finding = f"{noun} in {asked} half"
            elif kind == "size":
                q, paras = _size_question(noun, mod, asked)
                finding = f"{asked} {noun}"
            else:
                q, paras = _brightness_question(noun, mod, s.modality, _surround(s), asked == "brighter")
                finding = f"{noun} {asked} than surroundings"
            out.append(_yesno_rec(k, s, q, is_yes, paras, finding))
    return out


def _yesno_rec(k: int, s: DemoSample, q: str, is_yes: bool, paras: list[tuple[str, int]],
               finding: str) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "id": f"demo_yn_{k:06d}",
        "image_path": s.image_path,
        "dataset": s.dataset,
        "modality": s.modality,
        "question": q,
        "answer": "yes" if is_yes else "no",
        "paraphrases": [{"text": t, "polarity": p} for t, p in paras],
        "finding": finding,
    }
    rec.update(_common(s))
    return rec


# ---------------------------------------------------------------- captions


def caption_for(s: DemoSample, rng: np.random.Generator) -> str:
    """A short radiology-style sentence from the ground truth, template chosen by ``rng``."""
    mod = MODALITY_PHRASE[s.modality]
    mod_cap = mod[0].upper() + mod[1:]
    anat = s.anatomy
    lt = s.lesion_type
    brighter = s.brightness == "brighter"
    term = bright_term(s.modality, brighter)
    technical = s.modality in _BRIGHT_TERMS and "hyper" not in lt and "hypo" not in lt
    shade = f"{term} " if technical else ""
    if s.modality in NO_BRIGHTNESS:
        cmp = ""
    elif s.modality in _BRIGHT_TERMS:
        cmp = f", {term} relative to the surrounding {_surround(s)}"
    else:
        cmp = f", {'brighter' if brighter else 'darker'} than the surrounding {_surround(s)}"
    quad = s.quadrant
    templates = (
        f"{mod_cap} of the {anat} showing a {s.size} {shade}{lt} in the {quad} part of the image.",
        f"{mod_cap} demonstrating a {s.size} {shade}{lt} located in the {quad} quadrant.",
        f"{s.size.capitalize()} {shade}{lt} in the {quad} region of the {anat} (arrow).",
        f"There is a {s.size} {shade}{lt} in the {quad} of the image.",
        f"{mod_cap}: {s.size} {lt} in the {quad} quadrant{cmp}.",
        f"A {s.size} {shade}{lt} is seen in the {quad} portion of this {mod}.",
    )
    cap = templates[int(rng.integers(0, len(templates)))]
    if s.modality == "fundus" and "cdr" in s.extra:
        cap += f" Cup-to-disc ratio {float(s.extra['cdr']):.2f}."
    if s.modality == "ultrasound" and "posterior" in s.extra:
        cap += f" Posterior acoustic {s.extra['posterior']}."
    return cap


def roco_rows(samples: Sequence[DemoSample], seed: int) -> tuple[list[list[str]], list[list[str]]]:
    """(caption rows ``[ID, Caption]``, image rows ``[ID, image_path, dataset, sample_id, slice_index]``)."""
    counters = {"train": 0, "valid": 0, "test": 0}
    caps: list[list[str]] = []
    imgs: list[list[str]] = []
    for s in samples:
        split = {"train": "train", "val": "valid", "test": "test"}[s.split]
        counters[split] += 1
        rid = f"ROCOv2_2023_{split}_{counters[split]:06d}"
        rng = rng_for(seed, "records", "roco", s.dataset, s.sample_id)
        caps.append([rid, caption_for(s, rng)])
        imgs.append(
            [rid, s.image_path, s.dataset, s.sample_id, "" if s.slice_index is None else str(s.slice_index)]
        )
    return caps, imgs


# ---------------------------------------------------------------- grounding


_GROUND_Q = (
    "Please output the bounding box of the {noun} in this image.",
    "Where is the {noun}? Answer with its bounding box [x0, y0, x1, y1].",
    "Locate the {lt} and give its bounding box.",
    "Please provide the bounding box coordinates of the region this sentence describes: the {lt}.",
    "Detect the {noun} in this {mod} and return [x0, y0, x1, y1].",
)


def normalized_box_text(box: Sequence[float], hw: Sequence[int]) -> str:
    """``"[x0, y0, x1, y1]"`` with x / w and y / h, 3 decimals (end-exclusive pixel box)."""
    h, w = hw
    vals = (box[0] / w, box[1] / h, box[2] / w, box[3] / h)
    return "[" + ", ".join(f"{v:.3f}" for v in vals) + "]"


def grounding_records(samples: Sequence[DemoSample], seed: int) -> list[dict[str, Any]]:
    """One MeCoVQA-G-style conversation per sample (see the module docstring)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for k, s in enumerate(samples):
        rng = rng_for(seed, "records", "grounding", s.dataset, s.sample_id)
        # the first sample of every dataset uses the canonical wording, the others vary
        t = _GROUND_Q[0] if s.dataset not in seen else _GROUND_Q[int(rng.integers(0, len(_GROUND_Q)))]
        seen.add(s.dataset)
        q = t.format(noun=target_noun(s), lt=s.lesion_type, mod=MODALITY_PHRASE[s.modality])
        rec: dict[str, Any] = {
            "id": f"demo_grounding_{k:06d}",
            "image": s.image_path,
            "conversations": [
                {"from": "human", "value": "<image>\n" + q},
                {"from": "gpt", "value": normalized_box_text(s.box, s.image_size)},
            ],
            "bbox": [int(v) for v in s.box],
            "image_size": [int(s.image_size[0]), int(s.image_size[1])],
            "dataset": s.dataset,
            "modality": s.modality,
        }
        rec.update(_common(s))
        out.append(rec)
    return out


# ---------------------------------------------------------------- writing


def _csv_text(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue()


def write_records(root: Path, samples: Sequence[DemoSample], seed: int) -> dict[str, Path]:
    """Write every record file under ``root/records``; returns name -> absolute path."""
    paths = {k: root / v for k, v in RECORD_FILES.items()}
    paths["omnimedvqa"].parent.mkdir(parents=True, exist_ok=True)

    def dump(obj: Any) -> str:
        return json.dumps(obj, indent=1, ensure_ascii=False) + "\n"

    paths["omnimedvqa"].write_text(dump(omnimedvqa_records(samples, seed)), encoding="utf-8")
    lines = [json.dumps(r, ensure_ascii=False) for r in yesno_records(samples, seed)]
    paths["yesno_paraphrases"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    caps, imgs = roco_rows(samples, seed)
    paths["roco_captions"].write_text(_csv_text(["ID", "Caption"], caps), encoding="utf-8")
    paths["roco_images"].write_text(
        _csv_text(["ID", "image_path", "dataset", "sample_id", "slice_index"], imgs), encoding="utf-8"
    )
    paths["mecovqa_grounding"].write_text(dump(grounding_records(samples, seed)), encoding="utf-8")
    split_rows = [[s.sample_id, s.dataset, s.modality, s.split] for s in samples]
    paths["splits"].write_text(
        _csv_text(["sample_id", "dataset", "modality", "split"], split_rows), encoding="utf-8"
    )
    return paths
