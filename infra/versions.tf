terraform {
  # 1.9: variable validations that name other variables (the spending statement, setup_clusters).
  required_version = ">= 1.9"

  required_providers {
    # Exactly one release, so every deploy plans with the same provider code; the modules accept
    # any 6.x and this pin picks it. Raise it deliberately (read the provider's CHANGELOG first).
    google = {
      source  = "hashicorp/google"
      version = "6.50.0"
    }
  }

  # Partial configuration: Cloud Build passes -backend-config="bucket=..." (and a prefix), so the
  # same code deploys into any project without editing this file.
  backend "gcs" {}
}

provider "google" {
  project = var.project_id
  region  = var.region
}
