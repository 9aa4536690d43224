"""Importing this package registers every perturbation family."""

from medrobust_lib.perturb.families import (  # noqa: F401
    angio,
    blur,
    ct,
    derm,
    digital,
    endo,
    geometric,
    mri,
    noise,
    oct,
    path,
    us,
    xray,
)
