"""Datasets: configuration, indexing and loading with quarantine.

A dataset is described by a :class:`DatasetConfig` (name, modality, reader ``format``, ``root``
folder, target ``size``, reader ``options``). :func:`index_dataset` lists its samples (cheap,
paths only), :func:`load_sample` loads one, and :func:`iter_dataset` yields every sample or a
:class:`~medrobust_lib.data.sample.QuarantineRecord` for each file that cannot be used, so a bad
file is counted and reported, never silently dropped and never fatal.

Every loaded :class:`~medrobust_lib.data.sample.Sample` has a float32 image in [0, 1], (H, W) or
(H, W, 3), resized to ``size x size`` (image: area interpolation; mask: pixel-centre nearest
neighbour) unless ``size`` is None, a bool mask and float32 XYXY boxes (end exclusive) computed
from the resized mask (one tight box, or one per 8-connected component with
``per_component_boxes``). ``metadata`` records ``original_size`` (H, W), ``size``, ``resized``,
``image_path``, ``mask_paths``, ``mask_rule`` and the invertible ``intensity`` mapping (see
:mod:`medrobust_lib.data.imageio`), plus reader-specific fields (class, split, patient, slice,
DICOM tags, NIfTI case/axis/slice).

Readers and presets
-------------------

========== ====================================================================================
format     layout under ``root`` (options)
========== ====================================================================================
folder     ``<image_dir>/<id>.png`` + ``<mask_dir>/<id><mask_suffix><mask_ext>``; options
           ``image_dir`` (images), ``mask_dir`` (masks; None for no masks), ``image_glob``
           (``*.png``, may be recursive ``**/*.png``), ``mask_suffix`` (''), ``mask_ext`` (.png),
           ``mask_threshold`` (None: > 0 for lossless integer masks, > 127 for JPEG; a number
           on the 8-bit scale, foreground is ``>``), ``mask_values`` (exact label values that
           are foreground), ``instance_labels`` (False; True: the mask holds instance ids),
           ``intensity_range`` (None: 8-bit /255, 16-bit by its own range; ``[low, high]``
           declared), ``grayscale`` (None keeps the file, True forces gray, False forces
           RGB), ``allow_empty_mask`` (False).
isic2016   ``ISBI2016_ISIC_Part1_Training_Data/ISIC_0000000.jpg`` +
           ``ISBI2016_ISIC_Part1_Training_GroundTruth/ISIC_0000000_Segmentation.png``, and the
           ``..._Test_Data`` / ``..._Test_GroundTruth`` pair when present (``splits``); RGB;
           metadata ``split``. Gutman et al., ISBI 2016 challenge, arXiv:1605.01397.
kvasir_seg ``images/<id>.jpg`` + ``masks/<id>.jpg`` (root may also be the folder that holds
           ``Kvasir-SEG/``); JPEG masks thresholded at 127; RGB. Jha et al., MMM 2020.
busi       ``<class>/<class> (<n>).png`` + ``<class>/<class> (<n>)_mask.png`` and optional
           ``_mask_1.png``, ``_mask_2.png`` (unioned), class in benign, malignant, normal (root
           may also hold ``Dataset_BUSI_with_GT/``); grayscale (stored RGB, converted with
           BT.601 luminance); metadata ``class``. ``normal`` images have empty masks and are
           quarantined as ``empty_mask`` unless ``allow_empty_mask``; ``classes`` selects
           classes. Al-Dhabyani et al., Data in Brief 2020.
lgg_mri    ``<patient>/<patient>_<slice>.tif`` + ``<patient>/<patient>_<slice>_mask.tif``
           (root: ``kaggle_3m`` or its parent); ``channel`` 0 pre-contrast, 1 FLAIR (default),
           2 post-contrast, None keeps RGB; metadata ``patient``, ``slice``. Slices without
           tumour are ``empty_mask`` unless ``allow_empty_mask``. Buda et al., Comput Biol Med
           2019.
refuge     ``Images/<id>.jpg`` + ``Masks/<id>.bmp`` (0 = cup, 128 = rim, 255 = background), or
           ``<split>/Images`` + ``<split>/Masks``; ``target`` disc (cup + rim, default) or cup;
           RGB. Orlando et al., Med Image Anal 2020.
dicom      ``<image_dir>/**/<stem>.dcm`` (one 2-D image each) + optional
           ``<mask_dir>/<stem>.png``; RescaleSlope/Intercept (HU for CT), then the window from
           ``window_center``/``window_width``, else the file's, else 0.5/99.5 percentiles;
           MONOCHROME1 inverted; colour to luminance unless ``keep_rgb``.
nifti      ``imagesTr/<case>.nii.gz`` + ``labelsTr/<case>.nii.gz`` (Medical Segmentation
           Decathlon); one sample ``<case>_z<k:03d>`` per slice along ``axis`` (2) with
           foreground (``all_slices`` keeps all); window options or volume 0.5/99.5
           percentiles; label > 0 or ``label_values``; slices transposed so rows follow the
           stored y (anterior-posterior) axis, no flips. Antonelli et al., Nat Commun 2022.
========== ====================================================================================

Quarantine reasons: ``missing_mask`` (index time), ``duplicate_id`` (index time), ``empty_file``,
``missing_file``, ``unreadable_image``, ``unreadable_mask``, ``empty_mask_file``,
``mask_size_mismatch``, ``empty_mask``, ``mask_vanished_on_resize``, ``unreadable_dicom``,
``unsupported_dicom``, ``unreadable_nifti``, ``unreadable_label``, ``unsupported_nifti``, and
``load_error`` for any other exception raised while decoding (its detail names the exception).

Example::

    cfg = DatasetConfig(name="busi", modality="ultrasound", format="busi",
                        root="/data/Dataset_BUSI_with_GT", options={"allow_empty_mask": True})
    for item in iter_dataset(cfg):
        ...  # Sample or QuarantineRecord, in sample-id order
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from medrobust_lib.config.datasets import DatasetConfig
from medrobust_lib.data.sample import QuarantineRecord, Sample, SampleError, SampleRef
from medrobust_lib.seeding import stable_fraction

if TYPE_CHECKING:
    pass

def index_dataset(cfg: DatasetConfig) -> tuple[list[SampleRef], list[QuarantineRecord]]:
    """List the dataset's samples: ``(refs, quarantined)``, both sorted by sample id.

    Problems visible from the listing (a missing mask, an unreadable NIfTI label) are quarantine
    records; a repeated sample id keeps the first file (in path order) and quarantines the others as
    ``duplicate_id``. ``sample`` keeps a seeded draw of ``n`` ids of the union of both lists (ranked by a
    hash of (seed, dataset, id), so the draw does not depend on the listing order), then ``max_samples``
    the first N of what is left, in id order. A missing
    ``root`` or layout folder raises FileNotFoundError (a configuration error, not a bad file)."""
    refs, bad = cfg.reader().index(cfg)
    refs = sorted(refs, key=lambda r: (r.sample_id, r.image_path))
    unique: list[SampleRef] = []
    bad = list(bad)
    for r in refs:
        if unique and unique[-1].sample_id == r.sample_id:
            bad.append(
                QuarantineRecord(
                    dataset=cfg.name,
                    sample_id=r.sample_id,
                    path=r.image_path,
                    reason="duplicate_id",
                    detail=f"same id as {unique[-1].image_path}",
                )
            )
        else:
            unique.append(r)
    bad.sort(key=lambda q: (q.sample_id, q.path, q.reason))
    ids = sorted({r.sample_id for r in unique} | {q.sample_id for q in bad})
    keep: set[str] | None = None
    draw = cfg.sample
    if draw is not None:  # a seeded draw of n ids: the same ids whatever order the files are found in
        ranked = sorted(ids, key=lambda i: (stable_fraction(draw.seed, cfg.name, i, "sample"), i))
        keep = set(ranked[: draw.n])
        ids = [i for i in ids if i in keep]
    if cfg.max_samples is not None:
        keep = set(ids[: cfg.max_samples])
    if keep is not None:
        unique = [r for r in unique if r.sample_id in keep]
        bad = [q for q in bad if q.sample_id in keep]
    return unique, bad


def load_sample(cfg: DatasetConfig, ref: SampleRef) -> Sample:
    """Load one indexed sample. Raises SampleError (``reason`` is a code, see the module
    docstring) for a file that cannot be used; other exceptions mean a bug or an unexpected codec
    failure (``iter_dataset`` quarantines those too, as ``load_error``)."""
    from medrobust_lib.data.imageio import pixel_limit  # OpenCV: the suite's config loads without it

    if ref.dataset != cfg.name:
        raise ValueError(f"ref belongs to dataset {ref.dataset!r}, not {cfg.name!r}")
    with pixel_limit(cfg.max_pixels):
        return cfg.reader().load(cfg, ref)


def iter_dataset(cfg: DatasetConfig) -> Iterator[Sample | QuarantineRecord]:
    """Yield every sample of the dataset in sample-id order, or a QuarantineRecord in its place.

    Never raises for a bad file: SampleError becomes a record with its reason, any other exception
    while loading becomes ``load_error`` with ``"<ExceptionType>: <message>"`` as detail. Index-time
    records (e.g. ``missing_mask``) are yielded at their id's position. So the number of items
    equals the number of sample ids found."""
    refs, bad = index_dataset(cfg)
    items: list[tuple[str, int, SampleRef | QuarantineRecord]] = [(r.sample_id, 0, r) for r in refs]
    items += [(q.sample_id, 1, q) for q in bad]
    items.sort(key=lambda t: (t[0], t[1]))
    for sid, _, item in items:
        if isinstance(item, QuarantineRecord):
            yield item
            continue
        out: Sample | QuarantineRecord
        try:
            out = load_sample(cfg, item)
        except SampleError as e:
            out = QuarantineRecord(cfg.name, sid, item.image_path, e.reason, e.detail)
        except Exception as e:  # a decoder failure must not stop the whole dataset
            out = QuarantineRecord(cfg.name, sid, item.image_path, "load_error", f"{type(e).__name__}: {e}")
        yield out
