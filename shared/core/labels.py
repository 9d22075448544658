"""Label, annotation and reason vocabulary shared by every module.

Keeping the keys in one place means the provisioner, the releaser, the sandbox's simulated
controllers and the tests cannot drift apart on a spelling.
"""

from __future__ import annotations

# --- JobSet (jobset.x-k8s.io/v1alpha2) labels and annotations on Jobs and Pods.
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# JobSet's other exclusive-placement strategy: the Job selects its own nodes by a label a script put on
# them, and the pod webhook adds no affinity (JobSet v0.10.1 api/jobset/v1alpha2/jobset_types.go).
NODE_SELECTOR_STRATEGY = "alpha.jobset.sigs.k8s.io/node-selector"
# Set on TPU nodes only by GKE's slice controller (dynamic slicing of tpu7x sub-blocks), never on the
# nodes of a node pool built by a create call (GKE "Configure TPUs with GKE dynamic slicing").
TPU_SLICE = "cloud.google.com/gke-tpu-slice"
# GKE's label (and NoSchedule taint) on the nodes of a queued-provisioning pool, which xpk's --flex
# selects (xpk src/xpk/core/capacity.py; GKE "Deploy TPUs with queued provisioning").
QUEUED = "cloud.google.com/gke-queued"
# GKE's label for the named placement (workload) policy of a node's pool: xpk's tpu7x workloads select
# it (xpk src/xpk/core/scheduling.py, create_placement_policy_label), as GKE users add
# it beside a pool created with --placement-policy (GKE "About Ironwood (TPU7x) in GKE").
PLACEMENT_POLICY_NAME = "cloud.google.com/placement-policy-name"
# The per-shape slice levels the same controller labels nodes with (cloud.google.com/gke-tpu-slice-2x4-id
# in xpk's v6e sub-slicing manifests, which Kueue's topology-aware scheduling requires).
TPU_SLICE_LEVEL_PREFIX = "cloud.google.com/gke-tpu-slice-"
# A pod annotation giving the shape of a dynamically formed slice (GKE dynamic slicing and
# super-slicing samples, kubernetes-engine-samples ai-ml/gke-tpu-dynamic-slicing; xpk's
# sub-slicing and super-slicing workloads): read by GKE's slice controller, never by the scheduler.
TPU_SLICE_TOPOLOGY = "cloud.google.com/gke-tpu-slice-topology"
# Kueue's topology-aware scheduling levels a podset must be placed within (Kueue v0.19.2
# apis/kueue/v1beta2/topology_types.go).
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_SLICE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-slice-required-topology"
HOSTNAME = "kubernetes.io/hostname"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_VERSION = "v1alpha2"
JOBSET_PLURAL = "jobsets"

# --- GKE node labels and pod selectors.
TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
NODEPOOL = "cloud.google.com/gke-nodepool"
SPOT = "cloud.google.com/gke-spot"
RESERVATION_NAME = "cloud.google.com/reservation-name"
RESERVATION_PROJECT = "cloud.google.com/reservation-project"
# GKE labels the nodes of flex-start pools with this (value "true"); pods select it to run only there.
FLEX_START = "cloud.google.com/gke-flex-start"
TPU_RESOURCE = "google.com/tpu"
# GKE puts the chips of one TPU VM on its node under this key (the TPU device plugin reads it too).
ACCELERATOR_COUNT = "cloud.google.com/gke-accelerator-count"
# Two cloud.google.com/ keys GKE takes as node labels of a TPU pool (Google's own tpu-provisioner sets
# them from the pod's selectors): ICI resiliency off ("false") and a placement hint inside a zone.
ICI_RESILIENCY = "cloud.google.com/gke-tpu-ici-resiliency"
LOCATION_HINT = "cloud.google.com/gke-location-hint"
ZONE = "topology.kubernetes.io/zone"  # well-known node label; a pod selecting it pins its slice's zone

# --- The product's own vocabulary.
PRODUCT_DOMAIN = "tpuprov.dev"
MANAGED_BY = f"{PRODUCT_DOMAIN}/managed-by"
MANAGED_BY_VALUE = "tpu-provisioner"
OWNER_NAMESPACE = f"{PRODUCT_DOMAIN}/jobset-namespace"
OWNER_NAME = f"{PRODUCT_DOMAIN}/jobset-name"
OWNER_UID = f"{PRODUCT_DOMAIN}/jobset-uid"
OWNER_REPLICATED_JOB = f"{PRODUCT_DOMAIN}/replicated-job"
OWNER_JOB_INDEX = f"{PRODUCT_DOMAIN}/job-index"
# Node label (on an idle pool whose owner is gone): when it became idle, in Unix seconds. The
# handover window of an idle pool is measured from it when no owner condition says when it ended.
IDLE_SINCE = f"{PRODUCT_DOMAIN}/idle-since"
# Set on a pool adopted by the JobSet that runs on it (its former owner's name, as a label value).
HANDED_OVER_FROM = f"{PRODUCT_DOMAIN}/handed-over-from"
# Node annotation set while the product cordons a node before deleting its pool: says who and why,
# and lets the product lift only its own cordons (never an operator's).
CORDONED = f"{PRODUCT_DOMAIN}/cordoned"
# JobSet annotation: JSON {pool: {"attempts": K, "failedAt": unix, "recycled": bool, ...}} of the slices
# GKE could not provision (stockout, quota). The stockout backoff is derived from it; it lives and
# dies with the JobSet and shows in `kubectl describe jobset` (shared.provisioning.create.backoff).
SLICE_FAILURES = f"{PRODUCT_DOMAIN}/slice-failures"
# JobSet annotation: the capacity policy of its slices (shared.tpu.capacity), overriding CAPACITY_POLICY.
CAPACITY_POLICY = f"{PRODUCT_DOMAIN}/capacity-policy"
# A pod (label or annotation) or JobSet (annotation) with this set to "true" is left alone.
OPT_OUT = f"{PRODUCT_DOMAIN}/opt-out"
# Resource (GCE) labels allow neither dots nor slashes; billing exports group by these.
RESOURCE_LABEL_MANAGED_BY = "tpuprov-managed-by"
RESOURCE_LABEL_JOBSET = "tpuprov-jobset"
RESOURCE_LABEL_NAMESPACE = "tpuprov-namespace"

# --- Kubernetes Event reasons the product records.
REASON_REQUESTED = "TPUSliceRequested"
REASON_REFUSED = "TPUSliceRefused"
REASON_FAILED = "TPUSliceFailed"
REASON_RELEASED = "TPUSliceReleased"
REASON_ADOPTED = "TPUSliceAdopted"
EVENT_COMPONENT = "tpu-provisioner"


def billing_labels(namespace: str, jobset: str) -> dict[str, str]:
    """The resource (billing) labels of a pool owned by JobSet ``namespace/jobset``: set at create,
    and moved to the new owner when the pool is handed over, so a billing export charges the team
    (namespace) and JobSet that used it. Both come from the ownership the product verified, never
    from a label a tenant wrote. Resource label values allow no dots and at most 63 characters."""
    return {
        RESOURCE_LABEL_MANAGED_BY: MANAGED_BY_VALUE,
        RESOURCE_LABEL_NAMESPACE: namespace[:63],
        RESOURCE_LABEL_JOBSET: jobset[:63].replace(".", "-"),
    }
