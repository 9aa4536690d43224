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
