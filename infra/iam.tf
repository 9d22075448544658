locals {
  # Exactly the GKE permissions each function uses (setup_cluster is handled separately below).
  # The Kubernetes ones are checked by GKE's IAM authorizer when no RBAC rule grants them, so no
  # in-cluster binding is needed: pods (read the pending pod), events (record TPUSlice* events),
  # thirdPartyObjects (JobSets, a custom resource). The functions that create pools also create the
  # tpu7x workload policies those pools name (a Compute Engine regional resource policy: get, insert,
  # and the insert's regional operation) unless tpu7x_workload_policy names an existing one.
  custom_role_permissions = {
    provision = [
      "compute.regionOperations.get",
      "compute.resourcePolicies.create",
      "compute.resourcePolicies.get",
      "container.clusters.get",
      "container.events.create",
      "container.nodePools.create",
      "container.nodePools.get",
      "container.nodePools.list",
      "container.operations.get",
      "container.pods.get",
      "container.pods.list",
      "container.thirdPartyObjects.get",
      "container.thirdPartyObjects.list",
    ]
    release = [
      "container.clusters.get",
      "container.events.create",
      "container.nodePools.delete",
      "container.nodePools.get",
      "container.nodePools.list",
      "container.operations.get",
      "container.pods.get",
      "container.pods.list",
      "container.thirdPartyObjects.get",
      "container.thirdPartyObjects.list",
    ]
    # The sweep deletes orphaned pools and creates the ones a missed event should have created.
    reconcile = [
      "compute.regionOperations.get",
      "compute.resourcePolicies.create",
      "compute.resourcePolicies.get",
      "container.clusters.get",
      "container.events.create",
      "container.nodePools.create",
      "container.nodePools.delete",
      "container.nodePools.get",
      "container.nodePools.list",
      "container.operations.get",
      "container.pods.get",
      "container.pods.list",
      "container.thirdPartyObjects.get",
      "container.thirdPartyObjects.list",
    ]
    # Kueue's objects are custom resources (thirdPartyObjects); PriorityClasses are built in.
    apply_kueue = [
      "container.clusters.get",
      "container.priorityClasses.create",
      "container.priorityClasses.delete",
      "container.priorityClasses.get",
      "container.priorityClasses.list",
      "container.priorityClasses.update",
      "container.thirdPartyObjects.create",
      "container.thirdPartyObjects.delete",
      "container.thirdPartyObjects.get",
      "container.thirdPartyObjects.list",
      "container.thirdPartyObjects.update",
    ]
  }

  # Functions that create node pools run them as var.node_service_account, which needs actAs.
  node_pool_creators = var.node_service_account == "" ? [] : ["provision", "reconcile"]
}

resource "google_service_account" "runtime" {
  for_each = local.functions

  project      = var.project_id
  account_id   = "${var.topic_prefix}-${each.value.short}"
  display_name = "tpu-provisioner ${each.key} (Cloud Run runtime)"
}

resource "google_project_iam_custom_role" "function" {
  for_each = local.custom_role_permissions

  project     = var.project_id
  role_id     = "${replace(var.topic_prefix, "-", "_")}_${each.key}"
  title       = "tpu-provisioner ${each.key}"
  description = "Least-privilege GKE permissions of the tpu-provisioner ${each.key} function."
  permissions = each.value
}

resource "google_project_iam_member" "function" {
  for_each = local.custom_role_permissions

  project = var.project_id
  role    = google_project_iam_custom_role.function[each.key].id
  member  = "serviceAccount:${google_service_account.runtime[each.key].email}"
}

# setup_cluster installs CRDs, cluster-scoped RBAC (which needs the escalate/bind rights) and admission
# webhooks from the upstream JobSet/Kueue manifests: that is cluster-admin inside the cluster however
# it is spelled, and a hand-written list would break whenever upstream adds a kind. It may also
# bootstrap new clusters of the project, so the grant is project-wide. It is confined instead by
# isolation: its own service account, one instance, fed only by the setup topic.
resource "google_project_iam_member" "setup_cluster_admin" {
  project = var.project_id
  role    = "roles/container.admin"
  member  = "serviceAccount:${google_service_account.runtime["setup_cluster"].email}"
}

resource "google_service_account_iam_member" "node_service_account_user" {
  for_each = toset(local.node_pool_creators)

  service_account_id = "projects/${var.project_id}/serviceAccounts/${var.node_service_account}"
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.runtime[each.key].email}"
}

# With customer-managed encryption the Pub/Sub service agent must be able to use the key.
resource "google_kms_crypto_key_iam_member" "pubsub_cmek" {
  count = var.pubsub_kms_key_name == null ? 0 : 1

  crypto_key_id = var.pubsub_kms_key_name
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = local.pubsub_service_agent
}
