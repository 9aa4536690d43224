"""Mart views of the perturbation manifest and the clean samples."""

from __future__ import annotations

from medrobust_lib.store.views.common import GENERIC_FAMILIES, PERTURBATION_KINDS_SQL, View, static

PERTURBATION_SUMMARY_SQL = """
        select modality, perturbation, any_value(family) as family, level,
               count(*) as n,
               count(*) filter (where status = 'error') as n_error,
               count(*) filter (where status = 'not_applicable') as n_not_applicable,
               avg(strength) as mean_strength,
               avg(ssim) as mean_ssim, min(ssim) as min_ssim, max(ssim) as max_ssim,
               avg(case when band_reached then 1.0 else 0.0 end) filter (where status = 'ok') as band_hit_rate,
               count(*) filter (where miss_reason = 'unreachable') as n_unreachable,
               avg(n_ssim_evals) as mean_ssim_evals
        from perturbation_manifest
        group by modality, perturbation, level
        order by modality, perturbation, level"""
QUARANTINE_SQL = """
        select dataset, modality, sample_id, image_path, reason, detail
        from clean_samples where status <> 'ok' order by dataset, sample_id"""

VIEWS: list[View] = [
    View("perturbation_summary", static(PERTURBATION_SUMMARY_SQL),
         doc="""(from `perturbation_manifest`): one row per (modality, perturbation,
level) with `family`, `n`, `n_error` (status `error`), `n_not_applicable` (status
`not_applicable`: the type does not apply to the sample, not a failure), `mean_strength` (type's unit),
`mean_ssim` / `min_ssim` / `max_ssim`, `band_hit_rate` (share of ok rows with `band_reached`,
unreachable outputs included), `n_unreachable`, `mean_ssim_evals`."""),
    View("perturbation_types", static(PERTURBATION_KINDS_SQL + " order by perturbation"),
         doc=f"""(from `perturbation_manifest`): one row per perturbation type the manifest lists:
`family` and `generic` (true: a generic type, one of the families {", ".join(f"`{f}`" for f in GENERIC_FAMILIES)}
that apply to every modality; false: a modality-specific type). `segmentation_modality_share` counts
the modality-specific types among each model's worst corruptions with it."""),
    View("quarantine", static(QUARANTINE_SQL),
         doc="""(from `clean_samples`): one row per sample whose status is not ok: `dataset`,
`modality`, `sample_id`, `image_path`, `reason`, `detail`."""),
]
