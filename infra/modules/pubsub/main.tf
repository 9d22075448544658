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
  description = "Project of the topics."
}

variable "topic_name" {
  type        = string
  description = "Name of the function's source topic; the dead-letter topic is \"<topic_name>-dead-letter\"."
}

variable "dead_letter_retention" {
  type        = string
  description = "Retention of the dead-letter pull subscription (seconds with an \"s\" suffix, at most 7 days)."
}

variable "pubsub_service_agent" {
  type        = string
  description = "Member string of the project's Pub/Sub service agent, which forwards dead letters."
}

variable "kms_key_name" {
  type        = string
  description = "Cloud KMS key for customer-managed encryption of the topics; null keeps Google-managed keys."
  default     = null
}

variable "labels" {
  type        = map(string)
  description = "Resource labels for the topics and the subscription."
}

variable "publishers" {
  type        = map(string)
  description = "IAM members who may publish to the source topic (roles/pubsub.publisher on it alone), keyed by a fixed label; a log sink grants its own writer identity (modules/sink)."
  default     = {}
}

resource "google_pubsub_topic" "source" {
  #checkov:skip=CKV_GCP_83:CMEK is opt-in through var.pubsub_kms_key_name; messages are GKE event metadata, Google-managed keys by default.
  project      = var.project_id
  name         = var.topic_name
  labels       = var.labels
  kms_key_name = var.kms_key_name
  # Undelivered messages are kept on the subscriptions; the topic itself keeps nothing.
}

resource "google_pubsub_topic" "dead_letter" {
  #checkov:skip=CKV_GCP_83:CMEK is opt-in through var.pubsub_kms_key_name, as for the source topic.
  project      = var.project_id
  name         = "${var.topic_name}-dead-letter"
  labels       = var.labels
  kms_key_name = var.kms_key_name
}

# Without a subscription a dead-letter topic drops what it receives; this one keeps dead letters
# for `gcloud pubsub subscriptions pull` and replay.
resource "google_pubsub_subscription" "dead_letter" {
  project                    = var.project_id
  name                       = "${var.topic_name}-dead-letter-pull"
  topic                      = google_pubsub_topic.dead_letter.id
  labels                     = var.labels
  ack_deadline_seconds       = 60
  message_retention_duration = var.dead_letter_retention
  retain_acked_messages      = false

  expiration_policy {
    ttl = "" # never expire: dead letters may arrive months apart
  }
}

# Publishing rights are granted per topic, never on the project: whoever publishes here drives this
# one function (operators by hand, Cloud Scheduler's tick on the reconcile topic).
resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = var.publishers

  project = var.project_id
  topic   = google_pubsub_topic.source.name
  role    = "roles/pubsub.publisher"
  member  = each.value
}

resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  project = var.project_id
  topic   = google_pubsub_topic.dead_letter.name
  role    = "roles/pubsub.publisher"
  member  = var.pubsub_service_agent
}

output "topic_id" {
  description = "Full resource id of the source topic (projects/P/topics/T)."
  value       = google_pubsub_topic.source.id
}

output "topic_name" {
  description = "Short name of the source topic."
  value       = google_pubsub_topic.source.name
}

output "dead_letter_topic_id" {
  description = "Full resource id of the dead-letter topic."
  value       = google_pubsub_topic.dead_letter.id
}

output "dead_letter_topic_name" {
  description = "Short name of the dead-letter topic."
  value       = google_pubsub_topic.dead_letter.name
}

output "dead_letter_subscription_name" {
  description = "Pull subscription holding the dead letters."
  value       = google_pubsub_subscription.dead_letter.name
}
