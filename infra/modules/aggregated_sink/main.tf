terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 7.0"
    }
  }
}

variable "parent" {
  type        = string
  description = "Folder or organization the sink is defined on: folders/ID or organizations/ID."

  validation {
    condition     = can(regex("^(folders|organizations)/[0-9]+$", var.parent))
    error_message = "parent is folders/ID or organizations/ID (numeric ids)."
  }
}

variable "name" {
  type        = string
  description = "Name of the log sink."
}

variable "filter" {
  type        = string
  description = "Logging query selecting the entries to export (sinks/<name>.filter, rendered for the fleet's projects)."

  # Cloud Logging refuses a sink inclusion filter longer than 20,000 characters
  # (https://cloud.google.com/logging/quotas, "Logging usage limits"). Failing the plan names the
  # cause; the API's refusal at apply would not.
  validation {
    condition     = length(var.filter) <= 20000
    error_message = "The aggregated filter is longer than Cloud Logging's 20,000 characters: list fewer fleet projects, or leave fleet_sink_parent empty for one sink per project."
  }
}

variable "topic_id" {
  type        = string
  description = "Full resource id of the destination topic (projects/P/topics/T)."
}

locals {
  kind = split("/", var.parent)[0]
  # Both resources get the bare number: the organization sink sends org_id unchanged into
  # "organizations/<org_id>" (terraform-provider-google 6.50.0,
  # google/services/logging/resource_logging_organization_sink.go and logging_utils.go), so
  # "organizations/456" would name organizations/organizations/456; the folder sink accepts either
  # form and keeps the bare one in its state.
  id = split("/", var.parent)[1]
}

# Aggregated sinks (https://cloud.google.com/logging/docs/export/aggregated_sinks_overview):
# include_children routes the entries of every project beneath the folder or organization through
# the sink, which is what lets one sink stand in for a copy in each fleet project. It is
# non-intercepting (intercept_children = false): an intercepting sink would keep the matched
# entries from every sink of the child projects (only _Required still gets them), so those
# projects' _Default bucket, log-based metrics and their own sinks would lose the GKE events the
# provisioner reads. A non-intercepting one only adds a copy to the topic.
resource "google_logging_folder_sink" "this" {
  count = local.kind == "folders" ? 1 : 0

  folder             = local.id
  name               = var.name
  description        = "tpu-provisioner: exports the fleet projects' matching GKE log entries to ${var.topic_id}."
  destination        = "pubsub.googleapis.com/${var.topic_id}"
  filter             = var.filter
  include_children   = true
  intercept_children = false
}

resource "google_logging_organization_sink" "this" {
  count = local.kind == "organizations" ? 1 : 0

  org_id             = local.id
  name               = var.name
  description        = "tpu-provisioner: exports the fleet projects' matching GKE log entries to ${var.topic_id}."
  destination        = "pubsub.googleapis.com/${var.topic_id}"
  filter             = var.filter
  include_children   = true
  intercept_children = false
}

locals {
  # A folder or organization sink always gets a writer identity of Cloud Logging's own (the
  # provider creates both with uniqueWriterIdentity); exactly one of the two resources exists.
  writer_identity = one(concat(
    google_logging_folder_sink.this[*].writer_identity,
    google_logging_organization_sink.this[*].writer_identity,
  ))
}

resource "google_pubsub_topic_iam_member" "writer" {
  # The topic lives in the deployment's project; the sink is above it in the hierarchy.
  project = split("/", var.topic_id)[1]
  topic   = var.topic_id
  role    = "roles/pubsub.publisher"
  member  = local.writer_identity
}

output "writer_identity" {
  description = "Service identity the sink publishes as."
  value       = local.writer_identity
}
