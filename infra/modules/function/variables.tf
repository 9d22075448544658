variable "project_id" {
  type        = string
  description = "Project of the service and the subscription."
}

variable "region" {
  type        = string
  description = "Cloud Run region."
}

variable "name" {
  type        = string
  description = "Cloud Run service name (lower-case letters, digits and dashes)."
}

variable "invoker_account_id" {
  type        = string
  description = "Account id of the service account Pub/Sub authenticates as when pushing to the service (delivery = \"push\")."
}

variable "trigger_account_id" {
  type        = string
  description = "Account id of the Eventarc trigger's service account (delivery = \"eventarc\")."
}

variable "delivery" {
  type        = string
  description = "\"push\": a Terraform-owned push subscription with retry and dead-lettering; \"eventarc\": an Eventarc trigger on the same topic."

  validation {
    condition     = contains(["push", "eventarc"], var.delivery)
    error_message = "delivery is \"push\" or \"eventarc\"."
  }
}

variable "image" {
  type        = string
  description = "Container image by digest; the same image serves every function."
}

variable "function_source" {
  type        = string
  description = "FUNCTION_SOURCE: path of the function's main.py inside the image, relative to /app."
}

variable "function_target" {
  type        = string
  description = "FUNCTION_TARGET: name of the decorated Python function in function_source."
}

variable "env" {
  type        = map(string)
  description = "Settings environment of the function (see shared/core/settings.py)."
}

variable "extra_env" {
  type        = map(string)
  description = "More settings by env name (the root's extra_env); must not repeat a key of env."
  default     = {}
}

variable "vpc_egress" {
  type = object({
    network    = string
    subnetwork = string
  })
  description = "Direct VPC egress (network, subnetwork) into the cluster's VPC; null for none."
  default     = null
}

variable "service_account_email" {
  type        = string
  description = "Runtime service account of the service (its GKE rights come from the root module)."
}

variable "concurrency" {
  type        = number
  description = "Requests one instance handles at once."
}

variable "max_instances" {
  type        = number
  description = "Upper bound on instances; also bounds concurrent GKE API calls."
}

variable "timeout_seconds" {
  type        = number
  description = "Request timeout; the push subscription's ack deadline follows it (capped at 600 s)."
}

variable "memory" {
  type        = string
  description = "Memory limit of one instance (e.g. 512Mi)."
}

variable "topic_id" {
  type        = string
  description = "Full id of the topic that feeds the function."
}

variable "topic_name" {
  type        = string
  description = "Short name of that topic (goes into the push URL, which becomes the CloudEvent source)."
}

variable "dead_letter_topic_id" {
  type        = string
  description = "Full id of the topic that receives messages after max_delivery_attempts failures."
}

variable "max_delivery_attempts" {
  type        = number
  description = "Deliveries before a message is dead-lettered (5-100)."
}

variable "message_retention" {
  type        = string
  description = "How long an unacknowledged message stays on the push subscription (e.g. 86400s)."
}

variable "pubsub_service_agent" {
  type        = string
  description = "Member string of the project's Pub/Sub service agent."
}

variable "labels" {
  type        = map(string)
  description = "Resource labels."
}

variable "deletion_protection" {
  type        = bool
  description = "Whether Terraform may delete the Cloud Run service."
}
