"""SSIM-calibrated perturbations. Importing this package registers every family
(:mod:`medrobust_lib.perturb.families`), so the registry in :mod:`medrobust_lib.perturb.spec` is
complete wherever any ``medrobust_lib.perturb`` module is imported."""

from medrobust_lib.perturb import families  # noqa: F401  (registration)
