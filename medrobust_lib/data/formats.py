"""Every built-in dataset reader, registered: import :data:`READERS` from here.

Importing a reader module registers it in :data:`medrobust_lib.data.readers.READERS`; this module
imports them all, so the registry is complete wherever it is read (``DatasetConfig`` validation,
``medrobust validate``). A new reader module is added to the import list below.
"""

from medrobust_lib.data import (  # noqa: F401  (registration)
    readers_dicom,
    readers_folder,
    readers_nifti,
    readers_npy,
    readers_presets,
)
from medrobust_lib.data.readers import READERS

__all__ = ["READERS"]
