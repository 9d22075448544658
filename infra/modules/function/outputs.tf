output "service_uri" {
  description = "URL of the Cloud Run service."
  value       = google_cloud_run_v2_service.this.uri
}

output "service_name" {
  description = "Name of the Cloud Run service."
  value       = google_cloud_run_v2_service.this.name
}

output "subscription_name" {
  description = "Name of the push subscription feeding the service."
  value       = google_pubsub_subscription.push.name
}

output "invoker_email" {
  description = "Service account Pub/Sub pushes as."
  value       = google_service_account.invoker.email
}
