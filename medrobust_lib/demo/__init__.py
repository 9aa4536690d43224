"""Offline, deterministic multi-modality demo data with exactly known lesion masks.

:func:`build_demo` writes 10 small datasets (CT, MRI, ultrasound, X-ray, fundus, OCT, pathology,
dermoscopy, endoscopy, angiography; 256 x 256, one synthetic lesion each) in the published layouts
the dataset readers understand, plus VQA / yes-no / caption / grounding / split records derived
from the ground truth, and returns a :class:`DemoManifest`::

    man = build_demo(Path("var/demo"), seed=0, n_per_modality=24)
    for cfg in man.dataset_configs():     # {name, modality, format, root, options}
        DatasetConfig(**cfg)

Backgrounds come from images shipped inside installed wheels (pydicom, pydicom-data,
scikit-image) or are procedural; nothing is downloaded.
"""

from medrobust_lib.demo.build import GENERATOR_VERSION, build_demo, clean_demo
from medrobust_lib.demo.geometry import SIZE, SMALL_AREA_FRACTION
from medrobust_lib.demo.layouts import LAYOUTS
from medrobust_lib.demo.manifest import DemoDataset, DemoManifest, DemoSample
from medrobust_lib.paths import RECORD_FILES

__all__ = [
    "GENERATOR_VERSION",
    "LAYOUTS",
    "RECORD_FILES",
    "SIZE",
    "SMALL_AREA_FRACTION",
    "DemoDataset",
    "DemoManifest",
    "DemoSample",
    "build_demo",
    "clean_demo",
]
