"""The demo manifest: what :func:`~medrobust_lib.demo.build_demo` wrote and the ground truth.

``demo_manifest.json`` layout::

    {"generator_version", "seed", "n_per_modality", "root": "<absolute demo root>",
     "datasets": [{"name", "modality", "format", "root": "<absolute>", "options"}, ...],
     "dataset_folders": {"ct_demo": "ct_demo", ...},          # relative to the demo root
     "samples": {"ct_demo": [DemoSample fields...], ...},     # paths relative to the demo root
     "records": {"omnimedvqa": "records/omnimedvqa.json", ...},
     "real_datasets": [{"name", "modality", "format", "root", "options", "evaluation_only": true}],
     "real_folders": {"mri_overlay_real": "mri_overlay_real"}}

``real_datasets`` (only when the build copied any): real image-mask pairs an installed package
ships (:mod:`medrobust_lib.demo.real`), evaluation-only, without ground-truth records: they are
not in ``datasets``/``samples`` (whose fields describe the synthetic lesions).

Each ``datasets`` entry is exactly the keyword arguments of
:class:`~medrobust_lib.data.dataset.DatasetConfig`. The absolute roots make the file depend on
where the demo lives (it is byte-identical on a re-run in the same place); everything else is
relative, and :meth:`DemoManifest.load` resolves against the folder it reads from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST_NAME = "demo_manifest.json"


@dataclass(frozen=True)
class DemoSample:
    """Ground truth of one demo sample (one image, or one slice of an MRI volume).

    ``sample_id`` is the id the dataset reader gives the sample. ``image_path``/``mask_path`` are
    relative to the demo root (for MRI the NIfTI volumes; ``slice_index`` is the slice along the
    last stored axis). ``box``: pixel XYXY of the tight mask box, end exclusive, on the 256 x 256
    image (x = column, y = row). ``centroid``: (x, y) of the mask in continuous pixel coordinates
    (pixel centres at +0.5). ``horizontal`` is ``left``/``right`` and ``vertical`` ``upper``/``lower``
    by the centroid against the image midlines; ``size`` is ``small``/``large`` by
    ``area_fraction`` against :data:`~medrobust_lib.demo.geometry.SMALL_AREA_FRACTION`;
    ``brightness`` is ``brighter``/``darker`` by the sign of ``contrast``, the mean change the lesion
    made inside the mask (lesioned minus lesion-free image; HU for CT, else luminance in [0, 1]),
    i.e. brightness relative to the tissue the lesion sits in."""

    sample_id: str
    dataset: str
    modality: str
    image_path: str
    mask_path: str
    box: tuple[float, float, float, float]
    area: int
    area_fraction: float
    centroid: tuple[float, float]
    horizontal: str
    vertical: str
    size: str
    brightness: str
    contrast: float
    lesion_type: str
    anatomy: str
    source: str
    split: str
    image_size: tuple[int, int] = (256, 256)
    slice_index: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def quadrant(self) -> str:
        """``upper left``, ``upper right``, ``lower left`` or ``lower right``."""
        return f"{self.vertical} {self.horizontal}"


@dataclass(frozen=True)
class DemoDataset:
    """One demo dataset: its reader ``format``, absolute ``root`` and reader ``options``."""

    name: str
    modality: str
    format: str
    root: str
    options: dict[str, Any]
    samples: tuple[DemoSample, ...]

    def config(self) -> dict[str, Any]:
        """``{name, modality, format, root, options}``: the fields of a ``DatasetConfig``."""
        return {
            "name": self.name,
            "modality": self.modality,
            "format": self.format,
            "root": self.root,
            "options": dict(self.options),
        }


@dataclass(frozen=True)
class DemoManifest:
    """Everything a build wrote. ``records`` maps a record name (``omnimedvqa``,
    ``yesno_paraphrases``, ``roco_captions``, ``roco_images``, ``mecovqa_grounding``, ``splits``) to
    its absolute path; ``splits`` maps (dataset, sample_id) to ``train``/``val``/``test``."""

    root: Path
    seed: int
    n_per_modality: int
    generator_version: str
    datasets: tuple[DemoDataset, ...]
    records: dict[str, Path]
    real_datasets: tuple[dict[str, Any], ...] = ()

    def dataset_configs(self) -> list[dict[str, Any]]:
        """One ``{name, modality, format, root, options}`` dict per synthetic dataset (the real
        ones: ``real_datasets``)."""
        return [d.config() for d in self.datasets]

    def dataset(self, key: str) -> DemoDataset:
        """The dataset with this name or modality; KeyError lists the valid ones."""
        for d in self.datasets:
            if key in (d.name, d.modality):
                return d
        raise KeyError(f"no demo dataset {key!r}; valid: {', '.join(d.name for d in self.datasets)}")

    def samples(self) -> Iterator[DemoSample]:
        """All samples, dataset by dataset, in sample-id order."""
        for d in self.datasets:
            yield from d.samples

    @property
    def splits(self) -> dict[tuple[str, str], str]:
        return {(s.dataset, s.sample_id): s.split for s in self.samples()}

    # ------------------------------------------------------------------ JSON

    def to_json_dict(self) -> dict[str, Any]:
        """JSON-ready dict. ``datasets`` holds exactly the ``DatasetConfig`` fields (absolute
        ``root``), so ``DatasetConfig(**entry)`` works on each entry; ``dataset_folders``, sample
        paths and ``records`` are relative to the demo ``root``, so a moved folder can be
        re-resolved (:meth:`load` does)."""
        out: dict[str, Any] = {
            "generator_version": self.generator_version,
            "seed": self.seed,
            "n_per_modality": self.n_per_modality,
            "root": str(self.root),
            "datasets": [d.config() for d in self.datasets],
            "dataset_folders": {
                d.name: Path(d.root).relative_to(self.root).as_posix() for d in self.datasets
            },
            "samples": {d.name: [asdict(s) for s in d.samples] for d in self.datasets},
            "records": {k: Path(v).relative_to(self.root).as_posix() for k, v in self.records.items()},
        }
        if self.real_datasets:
            out["real_datasets"] = [dict(c) for c in self.real_datasets]
            out["real_folders"] = {c["name"]: Path(c["root"]).relative_to(self.root).as_posix()
                                   for c in self.real_datasets}
        return out

    def write(self) -> Path:
        """Write ``root/demo_manifest.json``."""
        path = self.root / MANIFEST_NAME
        path.write_text(json.dumps(self.to_json_dict(), indent=1) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, root: str | Path) -> DemoManifest:
        """Read ``root/demo_manifest.json``, resolving its relative paths against ``root`` (the
        stored absolute roots are ignored, so a moved demo folder still loads)."""
        root = Path(root).resolve()
        data = json.loads((root / MANIFEST_NAME).read_text(encoding="utf-8"))
        datasets = []
        for d in data["datasets"]:
            samples = tuple(
                DemoSample(
                    **{
                        **s,
                        "box": tuple(s["box"]),
                        "centroid": tuple(s["centroid"]),
                        "image_size": tuple(s["image_size"]),
                    }
                )
                for s in data["samples"][d["name"]]
            )
            folder = root / data["dataset_folders"][d["name"]]
            datasets.append(
                DemoDataset(d["name"], d["modality"], d["format"], str(folder), dict(d["options"]), samples)
            )
        return cls(
            root=root,
            seed=int(data["seed"]),
            n_per_modality=int(data["n_per_modality"]),
            generator_version=str(data["generator_version"]),
            datasets=tuple(datasets),
            records={k: root / v for k, v in data["records"].items()},
            real_datasets=tuple({**c, "root": str(root / data["real_folders"][c["name"]])}
                                for c in data.get("real_datasets", [])),
        )

    @staticmethod
    def stored_root(root: str | Path) -> str | None:
        """The absolute root recorded in ``root/demo_manifest.json`` (None if unreadable)."""
        try:
            value = json.loads((Path(root) / MANIFEST_NAME).read_text(encoding="utf-8")).get("root")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None
