output "service_uri" {
  description = "URL of the Cloud Run service."
  value       = google_cloud_run_v2_service.this.uri
}

output "service_name" {
  description = "Name of the Cloud Run service."
  value       = google_cloud_run_v2_service.this.name
}

output "subscription_name" {
  description = "Name of the push subscription feeding the service (null with delivery = \"eventarc\")."
  value       = one(google_pubsub_subscription.push[*].name)
}

output "invoker_email" {
  description = "Service account Pub/Sub pushes as (null with delivery = \"eventarc\")."
  value       = one(google_service_account.invoker[*].email)
}

output "trigger_email" {
  description = "Service account of the Eventarc trigger (null with delivery = \"push\")."
  value       = one(google_service_account.trigger[*].email)
}

output "eventarc_subscription" {
  description = "Subscription Eventarc created for the trigger, projects/P/subscriptions/S (null with delivery = \"push\")."
  value       = try(google_eventarc_trigger.this[0].transport[0].pubsub[0].subscription, null)
}
