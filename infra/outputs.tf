output "topics" {
  description = "Topic name per function (publish here to trigger it)."
  value       = { for name, topics in module.pubsub : name => topics.topic_name }
}

output "dead_letter_topics" {
  description = "Dead-letter topic name per function."
  value       = { for name, topics in module.pubsub : name => topics.dead_letter_topic_name }
}

output "dead_letter_subscriptions" {
  description = "Pull subscription per function that keeps its dead letters for inspection."
  value       = { for name, topics in module.pubsub : name => topics.dead_letter_subscription_name }
}

output "service_urls" {
  description = "Cloud Run URL per function (internal ingress only; not reachable from the internet)."
  value       = { for name, fn in module.function : name => fn.service_uri }
}

output "push_subscriptions" {
  description = "Push subscription per function (retry policy and dead-lettering live here); empty with delivery = \"eventarc\"."
  value       = { for name, fn in module.function : name => fn.subscription_name if fn.subscription_name != null }
}

output "eventarc_subscriptions" {
  description = "Subscription Eventarc created per function (delivery = \"eventarc\"); set its retry and dead-letter policy as infra/README.md shows."
  value       = { for name, fn in module.function : name => fn.eventarc_subscription if fn.eventarc_subscription != null }
}

output "runtime_service_accounts" {
  description = "Service account each function runs as."
  value       = { for name, sa in google_service_account.runtime : name => sa.email }
}

output "node_service_account" {
  description = "Service account the TPU nodes run as (var.node_service_account, or the dedicated <prefix>-nodes account)."
  value       = local.node_service_account
}

output "sink_writer_identities" {
  description = "Writer identity of each log sink (holds roles/pubsub.publisher on its own topic only)."
  value       = { for name, sink in module.sink : name => sink.writer_identity }
}

output "fleet_parent_sink_writer_identities" {
  description = "Writer identity of each aggregated sink on fleet_sink_parent (holds roles/pubsub.publisher on its own topic only); empty without fleet_sink_parent."
  value       = { for name, sink in module.fleet_parent_sink : name => sink.writer_identity }
}

output "fleet_node_service_accounts" {
  description = "Service account the TPU nodes of each other fleet project's clusters are to run as (project -> email): fleet_node_service_accounts, or the project's dedicated <prefix>-nodes account."
  value       = local.fleet_node_service_accounts
}

output "cluster" {
  description = "The cluster this deployment manages."
  value       = "projects/${var.project_id}/locations/${var.cluster_location}/clusters/${var.cluster_name}"
}

output "dashboard" {
  description = "Resource name of the operations dashboard (projects/NUMBER/dashboards/ID)."
  value       = google_monitoring_dashboard.operations.id
}
