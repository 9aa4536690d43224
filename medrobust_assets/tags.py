"""Op tags shared by asset definitions.

``GPU_OP_TAGS``: put on every asset with ``pool="gpu"`` (``op_tags=GPU_OP_TAGS``). Under the
Kubernetes job executor (dagster-k8s ``k8s_job_executor``) the step's pod then asks for one
NVIDIA GPU (``resources.limits["nvidia.com/gpu"] = 1``; Kubernetes sets requests equal to limits
for extended resources) and tolerates the ``nvidia.com/gpu`` taint that GPU node pools usually
carry. Every other executor ignores the tag, so it is safe on laptops and CI. Dagster stores a
non-string tag value as JSON; dagster-k8s parses it back (``get_user_defined_k8s_config``).
"""

GPU_RESOURCE = "nvidia.com/gpu"
K8S_CONFIG_TAG = "dagster-k8s/config"

GPU_OP_TAGS: dict[str, object] = {
    K8S_CONFIG_TAG: {
        "container_config": {"resources": {"limits": {GPU_RESOURCE: 1}}},
        "pod_spec_config": {
            "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        },
    },
}

# Run identity. The Dagster UI names a run by its job, and a run cannot be renamed after it
# started: the runner builds one job per selection named by :func:`run_job_name` (instead of
# ``dg.materialize``'s ``__ephemeral_asset_job__``) and tags the run with :func:`run_tags`.
SUITE_NAME_TAG = "medrobust/suite_name"
"""Run tag: the name of the suite the run belongs to (``medrobust/suite`` holds its file)."""
SELECTION_TAG = "medrobust/selection"
"""Run tag: the asset keys the run materializes, comma-separated user strings."""
MAX_NAMED_KEYS = 3
"""Asset keys spelled out in a job name; more are counted (``..._and_4_more``)."""


def _name_part(text: str) -> str:
    """``text`` as a Dagster name fragment (``[A-Za-z0-9_]``): ``/`` becomes ``__``, any other
    character outside the set ``_``."""
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in text.replace("/", "__"))


def run_job_name(suite_name: str, keys: list[str]) -> str:
    """The job name of a runner run: ``<suite>__<asset>[__<asset>...]`` for up to
    :data:`MAX_NAMED_KEYS` asset keys (user strings, e.g. ``tiny-sam/clean_predictions`` ->
    ``tiny_sam__clean_predictions``), else the first ones and ``_and_<n>_more``. E.g.
    ``demo__litemedsam__perturbed_predictions``. The partition is not in the name (the run's
    ``dagster/partition`` tag shows it), so one job serves every partition of a selection."""
    if not keys:
        raise ValueError("a run materializes at least one asset key")
    shown = [_name_part(k) for k in keys[:MAX_NAMED_KEYS]]
    more = len(keys) - len(shown)
    name = "__".join([_name_part(suite_name or "medrobust"), *shown]) + (f"_and_{more}_more" if more else "")
    return name if name[0].isalpha() else f"suite_{name}"


def run_tags(suite_name: str, keys: list[str]) -> dict[str, str]:
    """The tags naming a runner run's suite and selection (:data:`SUITE_NAME_TAG`,
    :data:`SELECTION_TAG`)."""
    return {**({SUITE_NAME_TAG: suite_name} if suite_name else {}), SELECTION_TAG: ",".join(keys)}
