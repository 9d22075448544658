# The IAM Condition that limits a project-level role binding to some GKE clusters, as far as IAM
# Conditions can. Pure: no provider, no resource (tests/infra/test_iam_scope.py evaluates it offline).
#
# Sources (IAM "Resource attributes for IAM Conditions", cloud.google.com/iam/docs/conditions-resource-attributes):
# * container.googleapis.com is a service whose resources carry resource attributes, and
#   container.googleapis.com/Cluster is the resource type of a GKE cluster;
# * a cluster's resource name there is projects/PROJECT/locations/LOCATION/clusters/NAME for a
#   regional cluster and projects/PROJECT/zones/ZONE/clusters/NAME for a zonal one;
# * services and resource types not listed there do not recognise resource attributes.
#
# So the expression grants everything that is not a Cluster-typed resource (permissions checked on
# the project, on Compute Engine resources, or on anything IAM names otherwise), and a Cluster-typed
# one only when it is one of `clusters` (either spelling) or a resource beneath it.

terraform {
  required_version = ">= 1.5"
}

variable "clusters" {
  type        = list(string)
  description = "Cluster paths (projects/PROJECT/locations/LOCATION/clusters/NAME) the grant is limited to."

  validation {
    condition     = length(var.clusters) > 0 && alltrue([for c in var.clusters : can(regex("^projects/[^/]+/locations/[^/]+/clusters/[^/]+$", c))])
    error_message = "Give at least one cluster path projects/PROJECT/locations/LOCATION/clusters/NAME."
  }
}

locals {
  # The product names every cluster by location; IAM names a zonal one by zone. (split/join: a
  # replace() whose search string starts and ends with "/" would be taken for a regular expression.)
  names = distinct(flatten([for c in var.clusters : [c, join("/zones/", split("/locations/", c))]]))

  expression = join(" || ", concat(
    ["resource.type != \"container.googleapis.com/Cluster\""],
    flatten([for name in local.names : ["resource.name == \"${name}\"", "resource.name.startsWith(\"${name}/\")"]]),
  ))
}

output "expression" {
  description = "CEL expression of the condition (true except on a Cluster-typed resource other than the clusters)."
  value       = local.expression
}

output "names" {
  description = "The resource names the expression accepts for a Cluster-typed resource (both spellings of each)."
  value       = local.names
}
