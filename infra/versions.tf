terraform {
  required_version = ">= 1.5"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.0, < 7.0"
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
