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
# dies with the JobSet and shows in `kubectl describe jobset` (shared.provisioning.backoff).
SLICE_FAILURES = f"{PRODUCT_DOMAIN}/slice-failures"
# JobSet annotation: "<state>@<unix seconds>" while the product's Kueue admission check provisions its
# Workload's slices (state Pending or Ready), refreshed at each look. A suspended JobSet's pools are
# its own and kept while it is fresh (shared.provisioning.verdicts), whatever SUSPEND_GRACE_SECONDS says.
ADMISSION_CHECK = f"{PRODUCT_DOMAIN}/admission-check"
# JobSet annotation: the capacity policy of its slices (shared.tpu.capacity), overriding CAPACITY_POLICY.
CAPACITY_POLICY = f"{PRODUCT_DOMAIN}/capacity-policy"
# A pod (label or annotation) or JobSet (annotation) with this set to "true" is left alone.
OPT_OUT = f"{PRODUCT_DOMAIN}/opt-out"
# Resource (GCE) labels allow neither dots nor slashes; billing exports group by these.
RESOURCE_LABEL_MANAGED_BY = "tpuprov-managed-by"
RESOURCE_LABEL_JOBSET = "tpuprov-jobset"

# --- Kubernetes Event reasons the product records.
REASON_REQUESTED = "TPUSliceRequested"
REASON_REFUSED = "TPUSliceRefused"
REASON_FAILED = "TPUSliceFailed"
REASON_RELEASED = "TPUSliceReleased"
REASON_ADOPTED = "TPUSliceAdopted"
EVENT_COMPONENT = "tpu-provisioner"


def billing_labels(jobset: str) -> dict[str, str]:
    """The resource (billing) labels of a pool owned by JobSet ``jobset``: set at create, and moved to
    the new owner when the pool is handed over, so a billing export charges the JobSet that used it.
    A JobSet name is a DNS-1123 subdomain; resource label values allow no dots and at most 63 chars."""
    return {RESOURCE_LABEL_MANAGED_BY: MANAGED_BY_VALUE, RESOURCE_LABEL_JOBSET: jobset[:63].replace(".", "-")}
