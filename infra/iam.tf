locals {
  # Exactly the permissions each function's code can reach, one list per function in roles.json
  # (setup_cluster is handled separately below). They come from shared/cloud/permissions.py, which
  # names what each GKE, Compute Engine and Kubernetes call needs; tests/infra derives each list from
  # the function's code and fails when roles.json holds one permission more or one less. The
  # Kubernetes ones are checked by GKE's IAM authorizer (container.<resource>.<verb>, custom resources
  # such as JobSets and Kueue's kinds as thirdPartyObjects), so no in-cluster RBAC binding is needed.
  custom_role_permissions = jsondecode(file("${path.module}/roles.json"))

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

# Customer-managed boot-disk encryption (BOOT_DISK_KMS_KEY, set through extra_env): Compute Engine's
# service agent encrypts the TPU nodes' boot disks with the key, so it must be allowed to use it.
resource "google_kms_crypto_key_iam_member" "boot_disk_cmek" {
  count = lookup(var.extra_env, "BOOT_DISK_KMS_KEY", "") == "" ? 0 : 1

  crypto_key_id = var.extra_env["BOOT_DISK_KMS_KEY"]
  role          = "roles/cloudkms.cryptoKeyEncrypterDecrypter"
  member        = "serviceAccount:service-${data.google_project.this.number}@compute-system.iam.gserviceaccount.com"
}
