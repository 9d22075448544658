terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 7.0"
    }
  }
}

variable "project_id" {
  type        = string
  description = "Project whose logs the sink routes."
}

variable "name" {
  type        = string
  description = "Name of the log sink."
}

variable "filter" {
  type        = string
  description = "Logging query selecting the entries to export (rendered from sinks/<name>.filter)."
}

variable "topic_id" {
  type        = string
  description = "Full resource id of the destination topic (projects/P/topics/T)."
}

resource "google_logging_project_sink" "this" {
  project     = var.project_id
  name        = var.name
  description = "tpu-provisioner: exports matching GKE log entries to ${var.topic_id}."
  destination = "pubsub.googleapis.com/${var.topic_id}"
  filter      = var.filter
  # A dedicated writer identity, so that publishing rights can be granted on this topic only.
  unique_writer_identity = true
}

resource "google_pubsub_topic_iam_member" "writer" {
  # The topic's own project (a fleet project's sink fills the deployment project's topic).
  project = split("/", var.topic_id)[1]
  topic   = var.topic_id
  role    = "roles/pubsub.publisher"
  member  = google_logging_project_sink.this.writer_identity
}

output "writer_identity" {
  description = "Service identity the sink publishes as."
  value       = google_logging_project_sink.this.writer_identity
}
