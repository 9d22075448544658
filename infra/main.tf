locals {
  # One entry per function. `topic` is the topic suffix (the full name is "<topic_prefix>-<topic>"),
  # `short` names its service accounts (ids are limited to 30 characters). Provision and release
  # answer bursts of events quickly; setup, Kueue and the reconcile sweep run one at a time.
  functions = {
    provision = {
      source          = "functions/provision/main.py"
      target          = "provision"
      topic           = "pending-pods"
      short           = "provision"
      concurrency     = 10
      max_instances   = 10
      timeout_seconds = 60
      memory          = "512Mi"
      retention       = "86400s"
    }
    release = {
      source          = "functions/release/main.py"
      target          = "release"
      topic           = "jobset-lifecycle"
      short           = "release"
      concurrency     = 10
      max_instances   = 5
      timeout_seconds = 120
      memory          = "512Mi"
      retention       = "86400s"
    }
    reconcile = {
      source          = "functions/reconcile/main.py"
      target          = "reconcile"
      topic           = "reconcile"
      short           = "reconcile"
      concurrency     = 1
      max_instances   = 1
      timeout_seconds = 300
      memory          = "512Mi"
      # A missed tick is superseded by the next one five minutes later; do not pile them up.
      retention = "1800s"
    }
    setup_cluster = {
      source          = "functions/setup_cluster/main.py"
      target          = "setup_cluster"
      topic           = "setup"
      short           = "setup"
      concurrency     = 1
      max_instances   = 1
      timeout_seconds = 540
      memory          = "1Gi"
      retention       = "86400s"
    }
    apply_kueue = {
      source          = "functions/apply_kueue/main.py"
      target          = "apply_kueue"
      topic           = "kueue"
      short           = "kueue"
      concurrency     = 1
      max_instances   = 1
      timeout_seconds = 300
      memory          = "512Mi"
      retention       = "86400s"
    }
  }

  # Log sink (file sinks/<key>.filter) -> the function whose topic it fills.
  sinks = {
    "pending-tpu-pods"        = "provision"
    "nodepool-operations"     = "provision"
    "workload-quota-reserved" = "provision"
    "jobset-lifecycle"        = "release"
    "cluster-created"         = "setup_cluster"
  }

  # The fleet's clusters as one filter clause (shared.app.deployment.sink_clusters writes the same):
  # each sink exports the events of every fleet cluster and of no other.
  # When project_id is one of fleet_projects, any of its clusters may be labelled in later: the
  # sinks export every cluster's entries (shared.app.deployment.ANY_CLUSTER) and the functions drop
  # the unlabelled ones.
  sink_template_vars = {
    project_id = var.project_id
    clusters = contains(var.fleet_projects, var.project_id) ? local.any_cluster : format("(%s)", join(" OR ", [
      for cluster in local.fleet : format(
        "(resource.labels.location=\"%s\" AND resource.labels.cluster_name=\"%s\")",
        split("/", cluster)[3], split("/", cluster)[5],
      )
    ]))
  }
  any_cluster = "resource.labels.cluster_name:*"

  # The other fleet projects' entries reach this project's topics in one of two ways
  # (var.fleet_sink_parent): by default each of those projects gets every sink (module
  # "fleet_sink"); with a folder or organization named, one aggregated sink per sink file there
  # (module "fleet_parent_sink") replaces all the copies. project_id keeps its own sinks (module
  # "sink") either way: it need not be beneath that folder, and its sinks name its clusters
  # (fleet_clusters) where the aggregated ones take every cluster of a project.
  fleet_sink_projects = var.fleet_sink_parent == "" ? local.other_fleet_projects : toset([])
  fleet_sinks = {
    for pair in setproduct(sort(local.fleet_sink_projects), sort(keys(local.sinks))) :
    "${pair[0]}/${pair[1]}" => { project = pair[0], sink = pair[1] }
  }

  # An aggregated sink's filter is what the per-project copies would export, together: each file
  # rendered as for one of those projects (every cluster, as in module "fleet_sink"), with that
  # project named by the list of them. The files name their project in exactly two ways, the
  # log's name (logName="projects/P/logs/L") and resource.labels.project_id="P"
  # (tests/infra/test_fleet.py checks that no other form appears), so the file is rendered once
  # for a placeholder project, and each of the two becomes an OR over the other fleet projects:
  # a few dozen characters per project instead of a whole filter, against Cloud Logging's 20,000
  # (modules/aggregated_sink). The one entry this passes and no copy would is one written to a
  # fleet project's log about a resource of another fleet project; GKE writes a cluster's entries
  # to the cluster's own project. The sandbox's log router keeps reading the files unchanged.
  # project_id is not in the list, so its entries, which its own sinks export, are not exported a
  # second time when it is beneath the folder.
  fleet_sink_placeholder = "tpuprov-fleet-placeholder"
  fleet_parent_sinks = {
    for name, function in local.sinks : name => {
      function = function
      filter = replace(
        replace(
          templatefile("${path.module}/../sinks/${name}.filter", {
            project_id = local.fleet_sink_placeholder
            clusters   = local.any_cluster
          }),
          "/\"projects/${local.fleet_sink_placeholder}/logs/([^\"]+)\"/",
          format("(%s)", join(" OR ", [for project in sort(local.other_fleet_projects) : "\"projects/${project}/logs/$1\""])),
        ),
        "resource.labels.project_id=\"${local.fleet_sink_placeholder}\"",
        format("resource.labels.project_id=(%s)", join(" OR ", [for project in sort(local.other_fleet_projects) : "\"${project}\""])),
      )
    } if var.fleet_sink_parent != "" && length(local.other_fleet_projects) > 0
  }

  # FLEET_OVERRIDES: var.fleet_overrides, under which each other fleet project's entry
  # (projects/P, which every fleet cluster of P takes unless its own entry says otherwise) names
  # the project's node service account, so a cluster labelled into the fleet later builds its pools
  # with its own project's account; an entry of var.fleet_overrides wins key by key.
  fleet_node_overrides = {
    for project, email in local.fleet_node_service_accounts : "projects/${project}" => { NODE_SERVICE_ACCOUNT = email }
  }
  fleet_overrides = {
    for key in distinct(concat(keys(local.fleet_node_overrides), keys(var.fleet_overrides))) :
    key => merge(lookup(local.fleet_node_overrides, key, {}), lookup(var.fleet_overrides, key, {}))
  }

  # The environment every service reads through shared.core.settings.Settings.from_env: the settings
  # with a variable of their own; var.extra_env adds any other (tests/infra/test_settings_env.py).
  function_env = {
    PROJECT_ID             = var.project_id
    LOCATION               = var.cluster_location
    CLUSTER_NAME           = var.cluster_name
    NODE_LOCATIONS         = join(",", var.node_locations)
    NODE_SERVICE_ACCOUNT   = local.node_service_account
    NAMESPACE_ALLOWLIST    = join(",", var.namespace_allowlist)
    ALLOWED_ACCELERATORS   = join(",", var.allowed_accelerators)
    MAX_CHIPS_PER_SLICE    = tostring(var.max_chips_per_slice)
    CHIP_BUDGET            = tostring(var.chip_budget)
    TENANTS                = jsonencode(var.tenants)
    KUEUE_ONLY             = tostring(var.kueue_only)
    UNLIMITED_SPENDING     = tostring(var.unlimited_spending)
    DRAIN                  = tostring(var.drain)
    MAX_EVENT_AGE_SECONDS  = tostring(var.max_event_age_seconds)
    RELEASE_GRACE_SECONDS  = tostring(var.release_grace_seconds)
    SUSPEND_GRACE_SECONDS  = tostring(var.suspend_grace_seconds)
    TPU7X_WORKLOAD_POLICY  = var.tpu7x_workload_policy
    CAPACITY_POLICY        = var.capacity_policy
    MANIFESTS_DIR          = var.manifests_dir
    JOBSET_VERSION         = var.jobset_version
    KUEUE_VERSION          = var.kueue_version
    SETUP_CLUSTERS         = join(",", var.setup_clusters)
    FLEET_CLUSTERS         = join(",", var.fleet_clusters)
    FLEET_PROJECTS         = join(",", var.fleet_projects)
    FLEET_LABEL            = var.fleet_label
    FLEET_OVERRIDES        = jsonencode(local.fleet_overrides)
    CONTROL_PLANE_ENDPOINT = var.control_plane_endpoint
  }

  labels = merge(var.labels, { "app" = "tpu-provisioner" })

  pubsub_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"

  # Who publishes to each topic besides its log sinks (whose writer identities modules/sink grants
  # on that topic alone): the operators on every topic, because the README's runbooks publish to
  # each by hand (tpuprov publish for the event, setup and Kueue topics, republishing a dead letter
  # to any source topic, a manual reconcile tick); and Cloud Scheduler on the reconcile topic. Its
  # service agent publishes the tick; Cloud Scheduler's IAM page notes that whoever may create a
  # job can make it publish to any topic of the project, so the real gate there is
  # cloudscheduler.jobs.create, which this deployment grants nobody. No publisher grant is made on
  # the project.
  scheduler_service_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-cloudscheduler.iam.gserviceaccount.com"
  topic_publishers = {
    for name, fn in local.functions : name => merge(
      { for member in toset(var.operators) : member => member },
      { for key, member in { "cloud-scheduler" = local.scheduler_service_agent } : key => member if name == "reconcile" },
    )
  }
}

data "google_project" "this" {
  project_id = var.project_id
}

resource "google_project_service" "apis" {
  for_each = toset(concat([
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "container.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
  ], var.delivery == "eventarc" ? ["eventarc.googleapis.com"] : []))

  project = var.project_id
  service = each.value
  # Other workloads in the project (the cluster itself) depend on these APIs.
  disable_on_destroy = false
}

module "pubsub" {
  source   = "./modules/pubsub"
  for_each = local.functions

  project_id            = var.project_id
  topic_name            = "${var.topic_prefix}-${each.value.topic}"
  dead_letter_retention = var.dead_letter_retention
  kms_key_name          = var.pubsub_kms_key_name
  pubsub_service_agent  = local.pubsub_service_agent
  publishers            = local.topic_publishers[each.key]
  labels                = local.labels

  depends_on = [google_project_service.apis]
}

module "sink" {
  source   = "./modules/sink"
  for_each = local.sinks

  project_id = var.project_id
  name       = "${var.topic_prefix}-${each.key}"
  # sinks/*.filter is the single source of truth; the sandbox's log router evaluates the same files.
  filter   = templatefile("${path.module}/../sinks/${each.key}.filter", local.sink_template_vars)
  topic_id = module.pubsub[each.value].topic_id
}

# The same sinks in every other fleet project: a sink only sees its own project's logs. Each writer
# identity may publish to its one topic (modules/sink), which lives in this project.
module "fleet_sink" {
  source   = "./modules/sink"
  for_each = local.fleet_sinks

  project_id = each.value.project
  name       = "${var.topic_prefix}-${each.value.sink}"
  filter = templatefile("${path.module}/../sinks/${each.value.sink}.filter", {
    project_id = each.value.project
    clusters   = local.any_cluster
  })
  topic_id = module.pubsub[local.sinks[each.value.sink]].topic_id
}

# The same sinks once, on the folder or organization var.fleet_sink_parent names, for the other
# fleet projects beneath it (modules/aggregated_sink: non-intercepting, children included). Each
# writer identity may publish to its one topic, as with the per-project sinks.
module "fleet_parent_sink" {
  source   = "./modules/aggregated_sink"
  for_each = local.fleet_parent_sinks

  parent   = var.fleet_sink_parent
  name     = "${var.topic_prefix}-${each.key}"
  filter   = each.value.filter
  topic_id = module.pubsub[each.value.function].topic_id
}

module "function" {
  source   = "./modules/function"
  for_each = local.functions

  project_id            = var.project_id
  region                = var.region
  name                  = "${var.topic_prefix}-${replace(each.key, "_", "-")}"
  invoker_account_id    = "${var.topic_prefix}-${each.value.short}-push"
  trigger_account_id    = "${var.topic_prefix}-${each.value.short}-trigger"
  delivery              = var.delivery
  image                 = var.image
  function_source       = each.value.source
  function_target       = each.value.target
  env                   = local.function_env
  extra_env             = var.extra_env
  vpc_egress            = var.vpc_egress
  service_account_email = google_service_account.runtime[each.key].email
  concurrency           = each.value.concurrency
  max_instances         = each.value.max_instances
  timeout_seconds       = each.value.timeout_seconds
  memory                = each.value.memory
  topic_id              = module.pubsub[each.key].topic_id
  topic_name            = module.pubsub[each.key].topic_name
  dead_letter_topic_id  = module.pubsub[each.key].dead_letter_topic_id
  max_delivery_attempts = var.max_delivery_attempts
  message_retention     = each.value.retention
  pubsub_service_agent  = local.pubsub_service_agent
  labels                = local.labels
  deletion_protection   = var.deletion_protection

  depends_on = [google_project_service.apis]
}

resource "google_cloud_scheduler_job" "reconcile" {
  name        = "${var.topic_prefix}-reconcile"
  project     = var.project_id
  region      = var.region
  description = "Tick for the tpu-provisioner reconcile sweep."
  schedule    = var.reconcile_schedule
  time_zone   = var.scheduler_time_zone

  pubsub_target {
    topic_name = module.pubsub["reconcile"].topic_id
    data       = base64encode(jsonencode({ source = "cloud-scheduler", action = "reconcile" }))
  }

  depends_on = [google_project_service.apis]
}
