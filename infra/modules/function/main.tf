terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 7.0"
    }
  }
}

resource "google_cloud_run_v2_service" "this" {
  project             = var.project_id
  location            = var.region
  name                = var.name
  labels              = var.labels
  deletion_protection = var.deletion_protection
  # Pub/Sub push from this project counts as internal traffic; nothing else needs to reach it.
  ingress = "INGRESS_TRAFFIC_INTERNAL_ONLY"

  template {
    service_account                  = var.service_account_email
    timeout                          = "${var.timeout_seconds}s"
    max_instance_request_concurrency = var.concurrency
    labels                           = var.labels

    scaling {
      min_instance_count = 0
      max_instance_count = var.max_instances
    }

    # Direct VPC egress, for a cluster reached at its private IP endpoint. Only private ranges take
    # the VPC path; Google APIs (GKE, Pub/Sub, Logging) and the DNS endpoint keep the default one.
    dynamic "vpc_access" {
      for_each = var.vpc_egress == null ? [] : [var.vpc_egress]
      content {
        network_interfaces {
          network    = vpc_access.value.network
          subnetwork = vpc_access.value.subnetwork
        }
        egress = "PRIVATE_RANGES_ONLY"
      }
    }

    containers {
      image = var.image

      env {
        name  = "FUNCTION_TARGET"
        value = var.function_target
      }
      env {
        name  = "FUNCTION_SOURCE"
        value = var.function_source
      }
      dynamic "env" {
        for_each = merge(var.env, var.extra_env)
        content {
          name  = env.key
          value = env.value
        }
      }

      resources {
        limits = {
          cpu    = "1"
          memory = var.memory
        }
        cpu_idle = true
      }

      ports {
        container_port = 8080
      }
    }
  }

  lifecycle {
    # One value per setting: a dedicated variable and extra_env naming the same env var would race.
    precondition {
      condition     = length(setintersection(keys(var.env), keys(var.extra_env))) == 0
      error_message = "extra_env repeats a setting that has a variable of its own; set it through that variable instead."
    }
    # Nothing but the VPC reaches a private IP endpoint from Cloud Run.
    precondition {
      condition     = var.vpc_egress != null || lookup(merge(var.env, var.extra_env), "CONTROL_PLANE_ENDPOINT", "auto") != "private-ip"
      error_message = "CONTROL_PLANE_ENDPOINT = \"private-ip\" needs vpc_egress (Cloud Run Direct VPC egress into the cluster's network)."
    }
  }
}

locals {
  push     = var.delivery == "push"
  eventarc = var.delivery == "eventarc"
}

# --- delivery = "push" (default): a Pub/Sub push subscription owned by Terraform --------------------

# Pub/Sub authenticates its pushes with an OIDC token of this account; it may invoke this service
# and nothing else.
resource "google_service_account" "invoker" {
  count = local.push ? 1 : 0

  project      = var.project_id
  account_id   = var.invoker_account_id
  display_name = "Pub/Sub push to ${var.name}"
}

resource "google_cloud_run_v2_service_iam_member" "invoker" {
  count = local.push ? 1 : 0

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.this.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.invoker[0].email}"
}

# The Pub/Sub service agent mints the OIDC tokens (required in projects created before April 2021,
# harmless after).
resource "google_service_account_iam_member" "token_creator" {
  count = local.push ? 1 : 0

  service_account_id = google_service_account.invoker[0].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = var.pubsub_service_agent
}

# A subscription we own rather than an Eventarc trigger: Eventarc's managed subscription cannot
# carry a retry policy or a dead-letter policy from Terraform (see infra/README.md).
resource "google_pubsub_subscription" "push" {
  count = local.push ? 1 : 0

  project                    = var.project_id
  name                       = "${var.name}-push"
  topic                      = var.topic_id
  labels                     = var.labels
  ack_deadline_seconds       = min(600, var.timeout_seconds)
  message_retention_duration = var.message_retention
  retain_acked_messages      = false

  expiration_policy {
    ttl = "" # an idle subscription must not expire (the default is 31 days)
  }

  retry_policy {
    minimum_backoff = "10s"
    maximum_backoff = "600s"
  }

  dead_letter_policy {
    dead_letter_topic     = var.dead_letter_topic_id
    max_delivery_attempts = var.max_delivery_attempts
  }

  push_config {
    # The topic path in the URL lets functions-framework fill the CloudEvent source.
    push_endpoint = "${google_cloud_run_v2_service.this.uri}/projects/${var.project_id}/topics/${var.topic_name}"

    oidc_token {
      service_account_email = google_service_account.invoker[0].email
      audience              = google_cloud_run_v2_service.this.uri
    }
  }

  depends_on = [
    google_cloud_run_v2_service_iam_member.invoker,
    google_service_account_iam_member.token_creator,
  ]
}

# Dead-lettering needs the service agent to read (and ack) from the source subscription.
resource "google_pubsub_subscription_iam_member" "dead_letter_subscriber" {
  count = local.push ? 1 : 0

  project      = var.project_id
  subscription = google_pubsub_subscription.push[0].name
  role         = "roles/pubsub.subscriber"
  member       = var.pubsub_service_agent
}

# Deployments made before `delivery` existed keep their resources (no destroy/re-create).
moved {
  from = google_service_account.invoker
  to   = google_service_account.invoker[0]
}

moved {
  from = google_cloud_run_v2_service_iam_member.invoker
  to   = google_cloud_run_v2_service_iam_member.invoker[0]
}

moved {
  from = google_service_account_iam_member.token_creator
  to   = google_service_account_iam_member.token_creator[0]
}

moved {
  from = google_pubsub_subscription.push
  to   = google_pubsub_subscription.push[0]
}

moved {
  from = google_pubsub_subscription_iam_member.dead_letter_subscriber
  to   = google_pubsub_subscription_iam_member.dead_letter_subscriber[0]
}

# --- delivery = "eventarc": an Eventarc trigger (Pub/Sub transport on the same topic) -----------
# Eventarc creates and owns the push subscription; its retry and dead-letter settings are not
# Terraform's (infra/README.md shows the `gcloud pubsub subscriptions update` to run after apply).
# Exactly one of the two paths exists, so a message is never delivered twice.

# The trigger's identity: Eventarc mints the OIDC tokens of its pushes as this account, which may
# invoke this service and nothing else. Pub/Sub triggers need no roles/eventarc.eventReceiver.
resource "google_service_account" "trigger" {
  count = local.eventarc ? 1 : 0

  project      = var.project_id
  account_id   = var.trigger_account_id
  display_name = "Eventarc trigger of ${var.name}"
}

resource "google_cloud_run_v2_service_iam_member" "trigger" {
  count = local.eventarc ? 1 : 0

  project  = var.project_id
  location = var.region
  name     = google_cloud_run_v2_service.this.name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.trigger[0].email}"
}

# As for the push path: the Pub/Sub service agent mints the trigger account's tokens in projects
# created before April 2021.
resource "google_service_account_iam_member" "trigger_token_creator" {
  count = local.eventarc ? 1 : 0

  service_account_id = google_service_account.trigger[0].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = var.pubsub_service_agent
}

resource "google_eventarc_trigger" "this" {
  count = local.eventarc ? 1 : 0

  project         = var.project_id
  location        = var.region
  name            = var.name
  labels          = var.labels
  service_account = google_service_account.trigger[0].email

  matching_criteria {
    attribute = "type"
    value     = "google.cloud.pubsub.topic.v1.messagePublished"
  }

  destination {
    cloud_run_service {
      service = google_cloud_run_v2_service.this.name
      region  = var.region
    }
  }

  # The product's own topic (the sinks and the scheduler publish there), not one Eventarc creates.
  transport {
    pubsub {
      topic = var.topic_id
    }
  }

  depends_on = [
    google_cloud_run_v2_service_iam_member.trigger,
    google_service_account_iam_member.trigger_token_creator,
  ]
}
