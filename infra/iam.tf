locals {
  # Exactly the permissions each function's code can reach, one list per function in roles.json
  # (setup_cluster is handled separately below). They come from shared/cloud/permissions.py, which
  # names what each GKE, Compute Engine and Kubernetes call needs; tests/infra derives each list from
  # the function's code and fails when roles.json holds one permission more or one less. The
  # Kubernetes ones are checked by GKE's IAM authorizer (container.<resource>.<verb>, custom resources
  # such as JobSets and Kueue's kinds as thirdPartyObjects), so no in-cluster RBAC binding is needed.
  custom_role_permissions = jsondecode(file("${path.module}/roles.json"))

  # The service account the TPU nodes run as: the operator's, or the dedicated one below. Never
  # empty: an empty NODE_SERVICE_ACCOUNT would give the nodes Compute Engine's default account
  # (often an Editor of the project).
  node_service_account = var.node_service_account != "" ? var.node_service_account : google_service_account.nodes[0].email

  # Functions that create node pools run them as the node service account, which needs actAs.
  node_pool_creators = ["provision", "reconcile"]

  managed_cluster = "projects/${var.project_id}/locations/${var.cluster_location}/clusters/${var.cluster_name}"
  # Every cluster the functions manage (FLEET_CLUSTERS beside the managed one).
  fleet = distinct(concat([local.managed_cluster], var.fleet_clusters))

  # Fleet projects besides this one, and each function's role in each of them.
  other_fleet_projects = setsubtract(toset(var.fleet_projects), [var.project_id])
  fleet_roles = {
    for pair in setproduct(sort(local.other_fleet_projects), sort(keys(local.custom_role_permissions))) :
    "${pair[0]}/${pair[1]}" => { project = pair[0], function = pair[1] }
  }
  # A cluster labelled into the fleet later cannot be named in a condition now: with project_id
  # among fleet_projects, the functions' GKE grants there hold on every cluster of the project.
  discovers_here = contains(var.fleet_projects, var.project_id)

  # The Compute Engine reads of a reservation before a create on it (ReservationAPI.get_reservation
  # in shared/cloud/permissions.py), checked in the project that owns the reservation.
  reservation_reads = [for permission in local.custom_role_permissions["provision"] : permission if startswith(permission, "compute.reservation")]

  # The owner projects that hold no copy of the functions' whole roles yet.
  reservation_owners = setsubtract(toset(var.reservation_projects), concat([var.project_id], var.fleet_projects))

  reservation_readers = {
    for pair in setproduct(sort(local.reservation_owners), local.node_pool_creators) :
    "${pair[0]}/${pair[1]}" => { project = pair[0], function = pair[1] }
  }
}

# The conditions that keep each grant on the managed cluster (modules/cluster_condition says how far
# an IAM Condition reaches). What one cannot scope, and why:
# * permissions checked on the project, not on a cluster: container.clusters.list and
#   container.clusters.create (GKE "API permissions" reference), so setup_cluster's admin role
#   still lists and could create clusters in the project;
# * the Kubernetes API permissions (container.pods.*, container.thirdPartyObjects.*, ...), which
#   GKE's IAM authorizer checks when a request reaches a cluster's API server: IAM's list of
#   resource attributes documents no resource type for them, and the condition lets through
#   whatever is not a Cluster-typed resource, so they may hold on every cluster of the project as
#   before. What does stay on the managed cluster is the GKE API: it checks container.clusters.get
#   (describing a cluster, listing its node pools) and container.clusters.update (creating and
#   deleting node pools) on the requested cluster (GKE "API permissions" reference);
# * Compute Engine's compute.resourcePolicies.* and compute.regionOperations.get (tpu7x workload
#   policies), checked on regional Compute resources, not on a cluster.
module "managed_cluster_condition" {
  source   = "./modules/cluster_condition"
  clusters = local.fleet
}

module "setup_cluster_condition" {
  source   = "./modules/cluster_condition"
  clusters = distinct(concat(local.fleet, var.setup_clusters))
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

  dynamic "condition" {
    for_each = local.discovers_here ? [] : [module.managed_cluster_condition.expression]
    content {
      title       = "${var.topic_prefix} fleet clusters only"
      description = "GKE cluster permissions of ${each.key} hold on the fleet's clusters alone."
      expression  = condition.value
    }
  }
}

# Each function's role in every other fleet project, bound to its one service account. Custom roles
# are per project, so each project gets its own copy of roles.json's list.
resource "google_project_iam_custom_role" "fleet_function" {
  for_each = local.fleet_roles

  project     = each.value.project
  role_id     = "${replace(var.topic_prefix, "-", "_")}_${each.value.function}"
  title       = "tpu-provisioner ${each.value.function}"
  description = "Least-privilege GKE permissions of the tpu-provisioner ${each.value.function} function."
  permissions = local.custom_role_permissions[each.value.function]
}

resource "google_project_iam_member" "fleet_function" {
  for_each = local.fleet_roles

  project = each.value.project
  role    = google_project_iam_custom_role.fleet_function[each.key].id
  member  = "serviceAccount:${google_service_account.runtime[each.value.function].email}"
}

# Reading a shared reservation before buying on it: a role with only those reads in its owner
# project, for the two functions that create pools.
resource "google_project_iam_custom_role" "reservation_reader" {
  for_each = local.reservation_owners

  project     = each.value
  role_id     = "${replace(var.topic_prefix, "-", "_")}_reservation_reader"
  title       = "tpu-provisioner reservation reader"
  description = "Reads the reservations shared with tpu-provisioner's clusters, their blocks and sub-blocks."
  permissions = local.reservation_reads
}

resource "google_project_iam_member" "reservation_reader" {
  for_each = local.reservation_readers

  project = each.value.project
  role    = google_project_iam_custom_role.reservation_reader[each.value.project].id
  member  = "serviceAccount:${google_service_account.runtime[each.value.function].email}"
}

# setup_cluster installs on a labelled cluster of another fleet project when its CreateCluster
# entry arrives: Kubernetes Engine Admin there, on the project (no cluster can be named yet).
resource "google_project_iam_member" "fleet_setup_cluster_admin" {
  for_each = local.other_fleet_projects

  project = each.value
  role    = "roles/container.admin"
  member  = "serviceAccount:${google_service_account.runtime["setup_cluster"].email}"
}

# setup_cluster installs CRDs, cluster-scoped RBAC (which needs the escalate/bind rights) and admission
# webhooks from the upstream JobSet/Kueue manifests: that is cluster-admin inside the cluster however
# it is spelled, and a hand-written list would break whenever upstream adds a kind. The role can only
# be granted on the project (IAM's GKE roles list the project as its lowest level), so a condition
# keeps its cluster permissions on the managed cluster and var.setup_clusters, the clusters the
# function itself accepts (SETUP_CLUSTERS). It is also confined by isolation: its own service
# account, one instance, fed only by the setup topic.
resource "google_project_iam_member" "setup_cluster_admin" {
  project = var.project_id
  role    = "roles/container.admin"
  member  = "serviceAccount:${google_service_account.runtime["setup_cluster"].email}"

  dynamic "condition" {
    for_each = local.discovers_here ? [] : [module.setup_cluster_condition.expression]
    content {
      title       = "${var.topic_prefix} setup clusters only"
      description = "Kubernetes Engine Admin on the managed cluster, the fleet and setup_clusters alone."
      expression  = condition.value
    }
  }
}

# The nodes' own identity when the operator names none: only what GKE nodes need (GKE "Configure
# GKE node service accounts": roles/container.defaultNodeServiceAccount is the minimum role), so a
# pod that did reach the node's token could do little with it.
resource "google_service_account" "nodes" {
  count = var.node_service_account == "" ? 1 : 0

  project      = var.project_id
  account_id   = "${var.topic_prefix}-nodes"
  display_name = "tpu-provisioner TPU nodes (${var.topic_prefix})"
}

resource "google_project_iam_member" "node_roles" {
  for_each = var.node_service_account == "" ? toset(var.node_service_account_roles) : toset([])

  project = var.project_id
  role    = each.value
  member  = "serviceAccount:${google_service_account.nodes[0].email}"
}

resource "google_service_account_iam_member" "node_service_account_user" {
  for_each = toset(local.node_pool_creators)

  service_account_id = "projects/${var.project_id}/serviceAccounts/${local.node_service_account}"
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.runtime[each.key].email}"
}

# The nodes of a cluster in another fleet project run as an account of that project: GKE's node
# service account needs roles/container.defaultNodeServiceAccount on the cluster's project
# (https://docs.cloud.google.com/kubernetes-engine/security/configure-node-service-accounts), and
# an account of another project can be attached to its VMs only where the organization policy
# allows service accounts across projects (iam.disableCrossProjectServiceAccountUsage,
# https://cloud.google.com/resource-manager/docs/organization-policy/restricting-service-accounts;
# https://cloud.google.com/iam/docs/attach-service-accounts), and then only once the cluster
# project's service agents hold a role on it as well. So each other fleet project gets the same
# least-privilege <topic_prefix>-nodes account as this one, unless var.fleet_node_service_accounts
# names one.
locals {
  fleet_node_accounts_created = setsubtract(local.other_fleet_projects, keys(var.fleet_node_service_accounts))
  # Project -> the email its TPU nodes run as (output fleet_node_service_accounts).
  fleet_node_service_accounts = merge(
    { for project in local.fleet_node_accounts_created : project => google_service_account.fleet_nodes[project].email },
    var.fleet_node_service_accounts,
  )
  fleet_node_roles = {
    for pair in setproduct(sort(local.fleet_node_accounts_created), sort(var.node_service_account_roles)) :
    "${pair[0]}/${pair[1]}" => { project = pair[0], role = pair[1] }
  }
  fleet_node_users = {
    for pair in setproduct(sort(local.other_fleet_projects), local.node_pool_creators) :
    "${pair[0]}/${pair[1]}" => { project = pair[0], function = pair[1] }
  }
}

resource "google_service_account" "fleet_nodes" {
  for_each = local.fleet_node_accounts_created

  project      = each.value
  account_id   = "${var.topic_prefix}-nodes"
  display_name = "tpu-provisioner TPU nodes (${var.topic_prefix})"
}

resource "google_project_iam_member" "fleet_node_roles" {
  for_each = local.fleet_node_roles

  project = each.value.project
  role    = each.value.role
  member  = "serviceAccount:${google_service_account.fleet_nodes[each.value.project].email}"
}

# The pool-creating functions act as each project's node account, as they do as this project's.
# A named account is addressed in its own project (the one its email names), which need not be
# the fleet project.
resource "google_service_account_iam_member" "fleet_node_service_account_user" {
  for_each = local.fleet_node_users

  service_account_id = format(
    "projects/%s/serviceAccounts/%s",
    split(".", split("@", local.fleet_node_service_accounts[each.value.project])[1])[0],
    local.fleet_node_service_accounts[each.value.project],
  )
  role   = "roles/iam.serviceAccountUser"
  member = "serviceAccount:${google_service_account.runtime[each.value.function].email}"
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
