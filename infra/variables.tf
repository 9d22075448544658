# --- Where things are deployed -----------------------------------------------------------------

variable "project_id" {
  type        = string
  description = "Project that holds the GKE cluster, the functions, the topics and the log sinks."
}

variable "region" {
  type        = string
  description = "Region for the Cloud Run services and the Cloud Scheduler job (e.g. us-central1)."
}

variable "cluster_name" {
  type        = string
  description = "Name of the GKE cluster whose TPU node pools the provisioner manages."
}

variable "cluster_location" {
  type        = string
  description = "Location (zone or region) of the GKE cluster, as in projects/P/locations/LOCATION/clusters/C."
}

variable "image" {
  type        = string
  description = "Container image of the functions, pinned by digest: REGION-docker.pkg.dev/P/REPO/tpu-provisioner@sha256:..."

  validation {
    condition     = can(regex("@sha256:[0-9a-f]{64}$", var.image))
    error_message = "Pass the image by digest (...@sha256:<64 hex>) so that a deploy is reproducible."
  }
}

variable "topic_prefix" {
  type        = string
  description = "Prefix of every topic, subscription, service and service account name (letters, digits, dashes)."
  default     = "tpuprov"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,11}$", var.topic_prefix))
    error_message = "Use 2-12 lower-case letters, digits or dashes, starting with a letter (service account ids are short)."
  }
}

variable "labels" {
  type        = map(string)
  description = "Resource labels added to every labelable resource (billing and ownership)."
  default     = {}
}

variable "pubsub_kms_key_name" {
  type        = string
  description = "Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) to encrypt the topics with; null = Google-managed."
  default     = null
}

variable "deletion_protection" {
  type        = bool
  description = "Protect the Cloud Run services from `terraform destroy`; infra/cloudbuild-destroy.yaml needs false."
  default     = false
}

# --- Function settings (environment of every service; shared/core/settings.py is the source of truth) ---

variable "node_locations" {
  type        = list(string)
  description = "Zones for TPU node pools (NODE_LOCATIONS); empty means the cluster's zone."
  default     = []
}

variable "node_service_account" {
  type        = string
  description = "Service account email the TPU nodes run as (NODE_SERVICE_ACCOUNT); empty: a dedicated <topic_prefix>-nodes account is created with node_service_account_roles (never Compute Engine's default account)."
  default     = ""
}

variable "node_service_account_roles" {
  type        = list(string)
  description = "Project roles of the dedicated node service account (only when node_service_account is empty). GKE's minimum for nodes is roles/container.defaultNodeServiceAccount; add e.g. roles/artifactregistry.reader when workloads pull private images."
  default     = ["roles/container.defaultNodeServiceAccount"]

  validation {
    condition     = alltrue([for role in var.node_service_account_roles : !contains(["owner", "editor", "viewer"], trimprefix(role, "roles/"))])
    error_message = "The node service account is what a compromised node holds: give it no basic role (owner, editor, viewer)."
  }
}

variable "namespace_allowlist" {
  type        = list(string)
  description = "Namespaces whose JobSets get TPU pools (NAMESPACE_ALLOWLIST); empty means every namespace."
  default     = []
}

variable "allowed_accelerators" {
  type        = list(string)
  description = "Accelerator node-label values the provisioner may create (ALLOWED_ACCELERATORS); empty means the whole catalog."
  default     = []
}

variable "max_chips_per_slice" {
  type        = number
  description = "Largest slice (in chips) one node pool may have (MAX_CHIPS_PER_SLICE)."
  default     = 4096
}

variable "chip_budget" {
  type        = number
  description = "Total chips over all managed pools (CHIP_BUDGET); 0 = no total cap, and then tenants, kueue_only or unlimited_spending must state the spending."
  default     = 0

  validation {
    condition     = var.chip_budget >= 0 && floor(var.chip_budget) == var.chip_budget
    error_message = "chip_budget is a whole number of chips, 0 or more."
  }
}

variable "tenants" {
  type = map(object({
    chips        = optional(number)
    reservations = optional(list(string))
  }))
  description = "Who may spend what (TENANTS, passed as JSON): keys are a namespace, \"label:KEY=VALUE\" (namespaces with that label) or \"*\" (every other namespace); chips caps the tenant's chips, reservations lists the reservations (NAME or projects/P/reservations/NAME) it may consume. An omitted field states no limit for it."
  default     = {}

  validation {
    condition     = alltrue([for key in keys(var.tenants) : can(regex("^([*]|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?|label:[^=]+=.*)$", key))])
    error_message = "A tenants key is a namespace (DNS-1123 label), \"*\" or \"label:KEY=VALUE\"."
  }

  validation {
    condition     = alltrue([for tenant in values(var.tenants) : tenant.chips == null ? true : tenant.chips >= 0 && floor(tenant.chips) == tenant.chips])
    error_message = "A tenant's chips is a whole number, 0 or more."
  }

  validation {
    condition = alltrue(flatten([
      for tenant in values(var.tenants) : [
        for reservation in(tenant.reservations == null ? [] : tenant.reservations) :
        can(regex("^(projects/[a-z][-a-z0-9]{4,28}[a-z0-9]/reservations/)?[a-z]([-a-z0-9]{0,61}[a-z0-9])?$", reservation))
      ]
    ]))
    error_message = "A tenant's reservations are reservation names, or projects/PROJECT/reservations/NAME for a shared one."
  }
}

variable "kueue_only" {
  type        = bool
  description = "Make pools only for Workloads Kueue admitted, so Kueue's ClusterQueue quotas are the spending limit (KUEUE_ONLY)."
  default     = false
}

variable "unlimited_spending" {
  type        = bool
  description = "State on purpose that this deployment's TPU spending has no limit (UNLIMITED_SPENDING). Without it, chip_budget, tenants or kueue_only must say how much may be spent."
  default     = false

  # Every TPU chip the functions create is billed to the project: a deployment must say how much
  # may be spent (a validation naming other variables needs Terraform >= 1.9, infra/versions.tf).
  validation {
    condition     = var.chip_budget > 0 || length(var.tenants) > 0 || var.kueue_only || var.unlimited_spending
    error_message = "State the spending limit: set chip_budget > 0, a tenants map, kueue_only = true, or (on purpose) unlimited_spending = true."
  }
}

variable "drain" {
  type        = bool
  description = "When true the functions never create pools and only clean up (DRAIN)."
  default     = false
}

variable "max_event_age_seconds" {
  type        = number
  description = "Events older than this are acknowledged and dropped (MAX_EVENT_AGE_SECONDS)."
  default     = 900
}

variable "release_grace_seconds" {
  type        = number
  description = "Wait this long after a JobSet completes before deleting its pools (RELEASE_GRACE_SECONDS)."
  default     = 0
}

variable "suspend_grace_seconds" {
  type        = number
  description = "Release the pools of a suspended JobSet after this long (SUSPEND_GRACE_SECONDS)."
  default     = 600
}

variable "tpu7x_workload_policy" {
  type        = string
  description = "Existing workload policy for multi-host tpu7x slices (TPU7X_WORKLOAD_POLICY; {topology} -> 2-2-2). Empty: the functions create one per topology."
  default     = ""
}

variable "capacity_policy" {
  type        = string
  description = "Ordered capacity fallback of TPU slices, e.g. \"spot, on-demand\" (CAPACITY_POLICY); empty = only what each pod selects."
  default     = ""
}

variable "jobset_version" {
  type        = string
  description = "JobSet release the setup function installs (JOBSET_VERSION); its manifest must be baked into the image."
  default     = "v0.10.1"
}

variable "kueue_version" {
  type        = string
  description = "Kueue release the setup function installs (KUEUE_VERSION); its manifest must be baked into the image."
  default     = "v0.19.2"
}

variable "setup_clusters" {
  type        = list(string)
  description = "Clusters of this project besides cluster_name that setup_cluster may install JobSet and Kueue on (SETUP_CLUSTERS), as projects/PROJECT/locations/LOCATION/clusters/NAME; its Kubernetes Engine Admin grant is limited to them and the managed cluster."
  default     = []

  validation {
    condition     = alltrue([for cluster in var.setup_clusters : can(regex("^projects/${var.project_id}/locations/[^/]+/clusters/[^/]+$", cluster))])
    error_message = "setup_clusters are cluster paths projects/PROJECT/locations/LOCATION/clusters/NAME in project_id: the setup function's grant is made in this project only."
  }
}

variable "fleet_clusters" {
  type        = list(string)
  description = "Clusters of this project besides cluster_name that this deployment manages too (FLEET_CLUSTERS), as projects/PROJECT/locations/LOCATION/clusters/NAME: the sinks export their events, the functions' GKE grants hold on them, and setup_cluster may install on them."
  default     = []

  validation {
    condition     = alltrue([for cluster in var.fleet_clusters : can(regex("^projects/${var.project_id}/locations/[^/]+/clusters/[^/]+$", cluster))])
    error_message = "fleet_clusters are cluster paths projects/PROJECT/locations/LOCATION/clusters/NAME in project_id: the sinks and grants are made in this project only."
  }
}

variable "fleet_projects" {
  type        = list(string)
  description = "Projects whose GKE clusters join the fleet by carrying fleet_label (FLEET_PROJECTS), found through GKE without a redeploy. In each project other than project_id this makes the sinks filling this project's topics (or, with fleet_sink_parent, one aggregated sink per file for all of them), the functions' custom roles and bindings, and the nodes' service account (fleet_node_service_accounts); the GKE grants there, and in project_id when it is listed, cover every cluster of the project, since a cluster labelled later cannot be named in an IAM Condition now."
  default     = []

  validation {
    # Resource Manager project ids: 6-30 lower-case letters, digits and hyphens, starting with a letter.
    condition     = alltrue([for project in var.fleet_projects : can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", project))])
    error_message = "fleet_projects are project ids (6 to 30 lower-case letters, digits and hyphens, starting with a letter)."
  }
}

variable "reservation_projects" {
  type        = list(string)
  description = "Projects that own reservations shared with this deployment's clusters (capacity options reservation:projects/P/reservations/NAME). provision and reconcile read such a reservation, its blocks and sub-blocks before buying on it, and Compute Engine checks those reads in the owner project: each listed project gets a custom role with exactly them, bound to those two functions. Fleet projects and project_id already hold them."
  default     = []

  validation {
    condition     = alltrue([for project in var.reservation_projects : can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]$", project))])
    error_message = "reservation_projects are project ids (6 to 30 lower-case letters, digits and hyphens, starting with a letter)."
  }
}

variable "fleet_label" {
  type        = string
  description = "The GKE resource label KEY=VALUE that puts a cluster of fleet_projects in the fleet (FLEET_LABEL)."
  default     = "tpuprov=enabled"

  validation {
    # Google Cloud label syntax: a key of 1-63 lower-case letters, digits, _ or -, starting with a letter.
    condition     = can(regex("^[a-z][a-z0-9_-]{0,62}=[a-z0-9_-]{0,63}$", var.fleet_label))
    error_message = "fleet_label is KEY=VALUE with a GKE resource label's key and value."
  }
}

variable "fleet_sink_parent" {
  type        = string
  description = "Where the entries of fleet_projects other than project_id are exported from. \"\" (the default): a copy of every sink in each of those projects. \"folders/ID\" or \"organizations/ID\": one non-intercepting aggregated sink per sink file on that folder or organization instead, with children included and its filter naming exactly those projects (each must be beneath it; project_id keeps its own sinks, and the filter leaves it out)."
  default     = ""

  validation {
    condition     = var.fleet_sink_parent == "" || can(regex("^(folders|organizations)/[0-9]+$", var.fleet_sink_parent))
    error_message = "fleet_sink_parent is \"\", folders/ID or organizations/ID (numeric ids, as `gcloud resource-manager folders list` shows them)."
  }

  # With no other project the aggregated filter would name none; refuse rather than make nothing.
  validation {
    condition     = var.fleet_sink_parent == "" || length(setsubtract(toset(var.fleet_projects), [var.project_id])) > 0
    error_message = "fleet_sink_parent exports the entries of fleet_projects other than project_id: list at least one such project, or leave it empty."
  }
}

variable "fleet_node_service_accounts" {
  type        = map(string)
  description = "Existing service account (email) the TPU nodes run as, per project of fleet_projects other than project_id. A fleet project left out gets a dedicated <topic_prefix>-nodes account of its own, with node_service_account_roles in that project; project_id's nodes use node_service_account. The pool-creating functions get iam.serviceAccountUser on each."
  default     = {}

  validation {
    condition     = alltrue([for project in keys(var.fleet_node_service_accounts) : contains(var.fleet_projects, project) && project != var.project_id])
    error_message = "fleet_node_service_accounts keys are projects of fleet_projects other than project_id (project_id's nodes use node_service_account)."
  }

  # A user-managed account (NAME@PROJECT.iam.gserviceaccount.com): never Compute Engine's default
  # one (PROJECT_NUMBER-compute@developer.gserviceaccount.com), which is often an Editor.
  validation {
    condition     = alltrue([for email in values(var.fleet_node_service_accounts) : can(regex("^[a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9]{4,28}[a-z0-9]\\.iam\\.gserviceaccount\\.com$", email))])
    error_message = "fleet_node_service_accounts values are user-managed service account emails, NAME@PROJECT.iam.gserviceaccount.com (not Compute Engine's default account)."
  }
}

variable "fleet_overrides" {
  type        = map(map(string))
  description = "Per-cluster settings (FLEET_OVERRIDES): { \"projects/P/locations/L/clusters/C\" = { CHIP_BUDGET = \"256\", NODE_LOCATIONS = \"us-east5-a,us-east5-b\" } }, values as their env variables take them; a key projects/P sets every fleet cluster of P. Which settings a cluster may override, and the checks the services make at startup: docs/settings.md. Each other fleet project's projects/P entry gets its node service account (fleet_node_service_accounts) unless this sets NODE_SERVICE_ACCOUNT there."
  default     = {}

  validation {
    condition     = alltrue([for key in keys(var.fleet_overrides) : can(regex("^projects/[^/]+(/locations/[^/]+/clusters/[^/]+)?$", key))])
    error_message = "fleet_overrides keys are cluster paths projects/PROJECT/locations/LOCATION/clusters/NAME or projects/PROJECT."
  }
}

variable "manifests_dir" {
  type        = string
  description = "Directory in the image holding jobset-<version>.yaml and kueue-<version>.yaml (MANIFESTS_DIR)."
  default     = "/app/manifests"
}

variable "extra_env" {
  type        = map(string)
  description = "Any other setting of the table in docs/settings.md by its env name, e.g. { CREATE_CONCURRENCY = \"4\", IDLE_POOL_SECONDS = \"300\" }; every service gets it. A name a dedicated variable above sets is refused at plan time."
  default     = {}

  validation {
    condition     = alltrue([for name in keys(var.extra_env) : can(regex("^[A-Z][A-Z0-9_]*$", name))])
    error_message = "extra_env keys are settings' env names: upper-case letters, digits and underscores (see the table in docs/settings.md)."
  }

  # Cloud Run's container contract reserves PORT and the K_* names; the module sets the FUNCTION_* ones.
  validation {
    condition     = length(setintersection(keys(var.extra_env), ["PORT", "K_SERVICE", "K_REVISION", "K_CONFIGURATION", "FUNCTION_TARGET", "FUNCTION_SOURCE"])) == 0
    error_message = "extra_env must not set PORT, K_SERVICE, K_REVISION, K_CONFIGURATION (Cloud Run's) or FUNCTION_TARGET, FUNCTION_SOURCE (the module's)."
  }
}

# --- Who may publish ------------------------------------------------------------------------------

variable "operators" {
  type        = list(string)
  description = "IAM members (group:tpu-ops@example.com, user:..., serviceAccount:...) who may publish to every topic of the deployment by hand: tpuprov publish, and republishing dead letters."
  default     = []

  validation {
    condition     = alltrue([for member in var.operators : can(regex("^(user|group|serviceAccount|domain|principal|principalSet):[^ ]+$", member))])
    error_message = "operators are IAM members of a named principal: user:, group:, serviceAccount:, domain:, principal: or principalSet:."
  }
}

# --- Reaching the cluster (docs/deploy.md "Reaching the cluster") --------------------------------

variable "control_plane_endpoint" {
  type        = string
  description = "Which control-plane endpoint the functions use (CONTROL_PLANE_ENDPOINT): \"auto\" picks from the cluster's controlPlaneEndpointsConfig (DNS, then public IP, then private IP); \"dns\", \"public-ip\" or \"private-ip\" force one. \"private-ip\" needs vpc_egress."
  default     = "auto"

  validation {
    condition     = contains(["auto", "dns", "private-ip", "public-ip"], var.control_plane_endpoint)
    error_message = "control_plane_endpoint is one of auto, dns, private-ip, public-ip."
  }
}

variable "vpc_egress" {
  type = object({
    network    = string
    subnetwork = string
  })
  description = "Cloud Run Direct VPC egress into the cluster's VPC (network and subnetwork names or self links), so the functions reach its private IP endpoint; only private ranges go through it (PRIVATE_RANGES_ONLY). null: no VPC path (enough for the DNS endpoint)."
  default     = null
}

# --- Delivery ----------------------------------------------------------------------------------

variable "delivery" {
  type        = string
  description = "How topic messages reach the functions: \"push\" (Terraform-owned push subscriptions with retry and dead-lettering) or \"eventarc\" (Eventarc triggers; see infra/README.md)."
  default     = "push"

  validation {
    condition     = contains(["push", "eventarc"], var.delivery)
    error_message = "delivery is \"push\" (the default) or \"eventarc\"."
  }
}

variable "max_delivery_attempts" {
  type        = number
  description = "Deliveries of one message before Pub/Sub moves it to the function's dead-letter topic (5-100)."
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "Pub/Sub accepts 5 to 100 delivery attempts."
  }
}

variable "dead_letter_retention" {
  type        = string
  description = "How long dead letters are kept on the dead-letter pull subscriptions (at most 7 days)."
  default     = "604800s"
}

variable "reconcile_schedule" {
  type        = string
  description = "Cron schedule of the reconcile tick (Cloud Scheduler syntax)."
  default     = "*/5 * * * *"
}

variable "scheduler_time_zone" {
  type        = string
  description = "Time zone of reconcile_schedule."
  default     = "Etc/UTC"
}

# --- Monitoring --------------------------------------------------------------------------------

variable "alert_notification_channels" {
  type        = list(string)
  description = "Notification channels (projects/P/notificationChannels/ID) every alert policy notifies; empty: incidents open in the console only."
  default     = []
}
