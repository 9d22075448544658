# Cloud Monitoring as code: log-based metrics built from the functions' decision logs, one
# dashboard, and the alert policies an operator needs. infra/README.md ("Monitoring") explains each
# metric and what to do when an alert fires; tests/infra/test_monitoring.py checks that every event
# and field used here is one the code actually writes.
#
# Where the numbers come from: every decision is one JSON line on a service's stdout
# (shared/core/logs.py: `decision(logger, "<event>", message, **fields)`), which Cloud Logging
# stores as jsonPayload with a stable `event` field. Fields bound for the whole delivery
# (`function`, `message_id`, `pod`, `jobset`) are on every line written while handling it.
#
# What the code does not log yet, and what is used instead:
# * no refusal reason code: `reason` is cut out of the refusal message (the guardrail's wording);
# * no accelerator/topology on a stockout: stockouts are counted per JobSet and zone.

locals {
  # Log lines of this deployment's services only ("<prefix>-<function>"), as Cloud Run stores them.
  services_regex = "(${join("|", [for fn in module.function : fn.service_name])})"
  metric_scope   = "resource.type=\"cloud_run_revision\" AND resource.labels.service_name=~\"^${local.services_regex}$\""

  # Regex of the dead-letter pull subscriptions (modules/pubsub), for Monitoring filters.
  dead_letter_regex = "(${join("|", [for topics in module.pubsub : topics.dead_letter_subscription_name])})"

  # Text GKE puts into a node pool's status message when the zone has no capacity (GCE's
  # ZONE_RESOURCE_POOL_EXHAUSTED wording); reconcile logs it when it recycles the failed pool.
  stockout_text = "(jsonPayload.message:\"does not have enough resources\" OR jsonPayload.message:\"STOCKOUT\" OR jsonPayload.message:\"RESOURCE_POOL_EXHAUSTED\")"

  # Every metric also counts by fleet cluster (FLEET_CLUSTERS): each delivery's lines carry the
  # cluster its event named (shared/core/logs.py annotate); lines of no cluster count under "".
  cluster_label = {
    cluster = {
      description = "The fleet cluster the delivery was about, projects/P/locations/L/clusters/C."
      extractor   = "EXTRACT(jsonPayload.cluster)"
    }
  }

  # Every log-based metric: `filter` is ANDed with metric_scope; `labels` maps a label key to its
  # description and extractor; DISTRIBUTION metrics also have a value_extractor.
  # Metric type: logging.googleapis.com/user/<topic_prefix>/<key>.
  log_metrics = {
    # A function's role lacks a permission its code calls: a deployment error, alerted at once.
    permission_denials = {
      description     = "Deliveries refused by IAM (permission.denied), by function role and missing permission."
      filter          = "jsonPayload.event=\"permission.denied\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        role = {
          description = "The function whose role lacks the permission (its entry in infra/roles.json)."
          extractor   = "EXTRACT(jsonPayload.role)"
        }
        permission = {
          description = "The IAM permission GKE or Compute Engine asked for, e.g. container.nodes.update."
          extractor   = "EXTRACT(jsonPayload.permission)"
        }
      }
    }
    pools_requested = {
      description     = "Node-pool create requests sent to GKE (provision and reconcile), by shape."
      filter          = "jsonPayload.event=\"gke.create_node_pool\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        shape = {
          description = "Accelerator and topology of the slice, e.g. \"tpu-v5-lite-podslice 4x4\"."
          extractor   = "REGEXP_EXTRACT(jsonPayload.why, \"[(]([a-z0-9-]+ [0-9x]+), [0-9]+ chips[)]\")"
        }
      }
    }
    pools_created = {
      description     = "Node pools GKE accepted to create (provision.created), by shape."
      filter          = "jsonPayload.event=\"provision.created\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        shape = {
          description = "Accelerator and topology of the slice, e.g. \"tpu-v5-lite-podslice 4x4\"."
          extractor   = "REGEXP_EXTRACT(jsonPayload.message, \"[(]([a-z0-9-]+ [0-9x]+), [0-9]+ chips[)]\")"
        }
      }
    }
    pools_deleted = {
      description     = "Node pools whose delete GKE accepted (release.deleted, from release or reconcile)."
      filter          = "jsonPayload.event=\"release.deleted\""
      value_type      = "INT64"
      value_extractor = ""
      labels          = {}
    }
    # A pool a live JobSet runs on is adopted by it (relabelled) instead of deleted under it; a pool
    # kept idle for a queued JobSet is adopted by that JobSet at the latest at its own release.
    pools_handed_over = {
      description     = "Node pools handed over to the JobSet running on them, or that ran on them last (release.adopted)."
      filter          = "jsonPayload.event=\"release.adopted\""
      value_type      = "INT64"
      value_extractor = ""
      labels          = {}
    }
    provision_refusals = {
      description     = "Slices the guardrails refused (provision.refused), by reason."
      filter          = "jsonPayload.event=\"provision.refused\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        # The code writes no reason code; the keyword of each refusal message is the reason. Empty
        # means a refusal worded differently (a slice shape the catalog rejects, for instance).
        reason = {
          description = "Which guardrail refused: the setting or rule named in the refusal message."
          extractor   = "REGEXP_EXTRACT(jsonPayload.message, \"(drain mode|NAMESPACE_ALLOWLIST|ALLOWED_ACCELERATORS|MAX_CHIPS_PER_SLICE|chip budget|cannot label|workload policy|capacity policy|CAPACITY_POLICY|flex-start|Spot VMs|NODE_LOCATIONS|JobSet|TPU topology|TPU accelerator|machine type|google.com/tpu|nodeSelector|ownership labels)\")"
        }
      }
    }
    # The Kueue admission check's transitions (shared/provisioning/admission_check.py): how many
    # Workloads wait for their slices, get them all, are requeued after a stockout or rejected.
    admission_checks = {
      description     = "Kueue admission check transitions of Workloads (admission.pending|ready|retry|rejected), by state."
      filter          = "jsonPayload.event=(\"admission.pending\" OR \"admission.ready\" OR \"admission.retry\" OR \"admission.rejected\")"
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        state = {
          description = "The check state set: admission.pending, admission.ready, admission.retry or admission.rejected."
          extractor   = "EXTRACT(jsonPayload.event)"
        }
      }
    }
    gke_rejections = {
      description     = "Create or delete requests GKE refused for good (provision.failed, release.rejected)."
      filter          = "jsonPayload.event=(\"provision.failed\" OR \"release.rejected\")"
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        event = {
          description = "provision.failed (create refused) or release.rejected (delete refused)."
          extractor   = "EXTRACT(jsonPayload.event)"
        }
      }
    }
    # A pool GKE accepted but could not provision ends in status ERROR; the first function to see it
    # records the attempt on the JobSet and logs backoff.failed once per attempt, with the capacity
    # option it used and the one the capacity policy falls back to ("" = backing off).
    gke_stockouts = {
      description     = "Failed attempts for lack of capacity in the zone (one per attempt, whoever saw it)."
      filter          = "jsonPayload.event=\"backoff.failed\" AND ${local.stockout_text}"
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        jobset = {
          description = "JobSet (namespace/name) whose slice stocked out; stands in for the shape, which the line does not carry."
          extractor   = "EXTRACT(jsonPayload.jobset)"
        }
        zone = {
          description = "Zone of the failed attempt (from its capacity option, e.g. spot@us-east5-b)."
          extractor   = "REGEXP_EXTRACT(jsonPayload.option, \"@([a-z0-9-]+)\")"
        }
        capacity = {
          description = "Capacity type of the failed attempt: on-demand, spot, flex-start or reservation."
          extractor   = "REGEXP_EXTRACT(jsonPayload.option, \"^([a-z-]+)\")"
        }
      }
    }
    capacity_fallbacks = {
      description     = "Failed attempts the capacity policy moved to other capacity at once (no backoff)."
      filter          = "jsonPayload.event=\"backoff.failed\" AND jsonPayload.next:\"@\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        to = {
          description = "The option tried next, e.g. on-demand@us-east5-b."
          extractor   = "EXTRACT(jsonPayload.next)"
        }
      }
    }
    gke_quota_errors = {
      description     = "GKE answers about quota: refused creates, 429s that are redelivered, pools failed on quota."
      filter          = "(jsonPayload.event=(\"provision.failed\" OR \"delivery.retry\") OR (jsonPayload.event=\"release.deleted\" AND jsonPayload.message:\"GKE could not provision it\")) AND jsonPayload.message=~\"(?i)(quota.*exceeded|insufficient quota|QUOTA_EXCEEDED|RESOURCE_EXHAUSTED)\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        event = {
          description = "provision.failed, delivery.retry or release.deleted."
          extractor   = "EXTRACT(jsonPayload.event)"
        }
      }
    }
    # shared/app/entry.py logs delivery.retry (ERROR) and answers 503 whenever a TransientError
    # escapes: Pub/Sub redelivers the message with backoff. 500s (bugs) write no decision line; the
    # dashboard shows them as Cloud Run 5xx next to this metric.
    redeliveries = {
      description     = "Deliveries answered 503 so that Pub/Sub redelivers them (delivery.retry)."
      filter          = "jsonPayload.event=\"delivery.retry\""
      value_type      = "INT64"
      value_extractor = ""
      labels          = {}
    }
    reconcile_sweeps = {
      description     = "Completed reconcile sweeps (reconcile.summary); WARNING when part of a sweep must be retried."
      filter          = "jsonPayload.event=\"reconcile.summary\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        severity = {
          description = "INFO for a clean sweep, WARNING when part of it failed and will be retried."
          extractor   = "EXTRACT(severity)"
        }
      }
    }
    # The code logs no chips total of the managed pools; the pool count each sweep saw is the
    # closest gauge (`pools_seen` of reconcile.summary).
    managed_pools = {
      description     = "Managed node pools each reconcile sweep saw (reconcile.summary pools_seen)."
      filter          = "jsonPayload.event=\"reconcile.summary\""
      value_type      = "DISTRIBUTION"
      value_extractor = "EXTRACT(jsonPayload.pools_seen)"
      labels          = {}
    }
    managed_chips = {
      description     = "TPU chips in managed node pools, as each reconcile sweep counts them (reconcile.summary chips)."
      filter          = "jsonPayload.event=\"reconcile.summary\""
      value_type      = "DISTRIBUTION"
      value_extractor = "EXTRACT(jsonPayload.chips)"
      labels          = {}
    }
    pending_to_create_seconds = {
      description     = "Seconds from a slice's pod creation to its pool's create request (provision.created pending_seconds)."
      filter          = "jsonPayload.event=\"provision.created\""
      value_type      = "DISTRIBUTION"
      value_extractor = "EXTRACT(jsonPayload.pending_seconds)"
      labels          = {}
    }
    chips_requested = {
      description     = "Chips of each node pool requested from GKE (from the request's why: \"..., N chips)\")."
      filter          = "jsonPayload.event=\"gke.create_node_pool\""
      value_type      = "DISTRIBUTION"
      value_extractor = "REGEXP_EXTRACT(jsonPayload.why, \"([0-9]+) chips[)]\")"
      labels          = {}
    }
    # The leak detector: a healthy pool reconcile deleted because its JobSet is gone, over, replaced
    # or suspended too long. The release function should have done that from the JobSet's own event.
    reconcile_orphans = {
      description     = "Pools without a live owner that the reconcile sweep released (the event path missed them)."
      filter          = "jsonPayload.event=\"release.deleted\" AND jsonPayload.function=\"reconcile\" AND NOT jsonPayload.message:\"GKE could not provision it\""
      value_type      = "INT64"
      value_extractor = ""
      labels = {
        jobset = {
          description = "Owner of the released pool (namespace/name)."
          extractor   = "EXTRACT(jsonPayload.jobset)"
        }
        verdict = {
          description = "Why the owner is not live: no longer exists, is being deleted, was recreated, failed, completed, suspended."
          extractor   = "REGEXP_EXTRACT(jsonPayload.message, \"JobSet [^ ]+ (no longer exists|is being deleted|was recreated|failed|completed|suspended)\")"
        }
      }
    }
  }

  # Alert thresholds (see infra/README.md, "Monitoring").
  alert_error_ratio       = 0.25    # share of a function's requests answered 5xx over 15 minutes
  alert_stockouts         = 2       # more than this many stockouts of one JobSet within 30 minutes
  alert_reconcile_missing = "1200s" # no reconcile request or sweep for this long (4 ticks at */5)
}

resource "google_logging_metric" "this" {
  for_each = local.log_metrics

  project     = var.project_id
  name        = "${var.topic_prefix}/${each.key}"
  description = "tpu-provisioner: ${each.value.description}"
  filter      = "${local.metric_scope} AND (${each.value.filter})"

  metric_descriptor {
    metric_kind  = "DELTA"
    value_type   = each.value.value_type
    unit         = "1"
    display_name = "tpu-provisioner ${replace(each.key, "_", " ")}"

    dynamic "labels" {
      for_each = merge(each.value.labels, local.cluster_label)
      content {
        key         = labels.key
        value_type  = "STRING"
        description = labels.value.description
      }
    }
  }

  label_extractors = { for key, label in merge(each.value.labels, local.cluster_label) : key => label.extractor }
  value_extractor  = each.value.value_extractor == "" ? null : each.value.value_extractor

  dynamic "bucket_options" {
    for_each = each.value.value_type == "DISTRIBUTION" ? [1] : []
    content {
      # 1, 2, 4 ... 8192: chips per slice and pools per cluster both fit.
      exponential_buckets {
        num_finite_buckets = 14
        growth_factor      = 2
        scale              = 1
      }
    }
  }

  depends_on = [google_project_service.apis]
}

resource "google_monitoring_dashboard" "operations" {
  project = var.project_id
  dashboard_json = templatefile("${path.module}/dashboard.json.tftpl", {
    title             = "tpu-provisioner (${var.topic_prefix})"
    metric_prefix     = "logging.googleapis.com/user/${var.topic_prefix}/"
    services_regex    = local.services_regex
    dead_letter_regex = local.dead_letter_regex
  })

  # The charts read the log-based metrics, which must exist first.
  depends_on = [google_logging_metric.this]
}

# --- alert policies ------------------------------------------------------------------------------

resource "google_monitoring_alert_policy" "dead_letters" {
  project               = var.project_id
  display_name          = "tpu-provisioner (${var.topic_prefix}): dead letters waiting"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Undelivered messages on a dead-letter subscription"
    condition_threshold {
      filter          = "metric.type=\"pubsub.googleapis.com/subscription/num_undelivered_messages\" AND resource.type=\"pubsub_subscription\" AND resource.label.subscription_id=monitoring.regex.full_match(\"${local.dead_letter_regex}\")"
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_MAX"
        cross_series_reducer = "REDUCE_MAX"
        group_by_fields      = ["resource.label.subscription_id"]
      }
    }
  }

  alert_strategy {
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      A message failed `max_delivery_attempts` deliveries and was moved to a dead-letter topic: some
      event (a pending pod, a finished JobSet, a setup request) was never handled.

      What to do: pull it without acking (`gcloud pubsub subscriptions pull <subscription> --limit=10
      --format=json`), read it with `tpuprov decode`, and look up the function's `delivery.retry` and
      ERROR lines for its message id in Cloud Logging. Fix the cause, republish the message to the
      source topic, then ack it on the dead-letter subscription. See infra/README.md, "Dead letters".
    EOT
  }
}

resource "google_monitoring_alert_policy" "orphaned_pools" {
  project               = var.project_id
  display_name          = "tpu-provisioner (${var.topic_prefix}): reconcile released orphaned pools"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "reconcile deleted a pool whose JobSet is gone or over"
    condition_threshold {
      filter          = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.this["reconcile_orphans"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        # One incident per fleet cluster: its metric label says which cluster leaked.
        group_by_fields = ["metric.label.cluster"]
      }
    }
  }

  alert_strategy {
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      The reconcile sweep found managed TPU node pools without a live owner (JobSet deleted, over,
      recreated or suspended too long) and deleted them. The release function should have done so
      when the JobSet finished: the pools were leaked, and billed, until the sweep.

      What to do: find the pools (`jsonPayload.event="release.deleted" jsonPayload.function="reconcile"`
      in Cloud Logging; `jsonPayload.jobset` names the owner). Check that the release function got the
      JobSet's event: the `jobset-lifecycle` sink and topic, the release dead-letter subscription, and
      `release.*` lines for that JobSet. Repeated leaks mean the sink misses an event kind.
    EOT
  }
}

resource "google_monitoring_alert_policy" "permission_denials" {
  project               = var.project_id
  display_name          = "tpu-provisioner (${var.topic_prefix}): a function's role lacks a permission"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "Any permission.denied line"
    condition_threshold {
      filter          = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.this["permission_denials"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = 0
      duration        = "0s"
      aggregations {
        alignment_period     = "60s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["metric.label.role", "metric.label.permission", "metric.label.cluster"]
      }
    }
  }

  alert_strategy {
    auto_close = "3600s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      A function was refused by IAM: its role lacks a permission its code calls, so the delivery is
      redelivered (nothing is lost) but nothing it was asked to do happens, and pools may be billing.
      This does not clear by itself and is alerted on the first refusal, not after the retries reach
      the dead-letter topic.

      What to do: add the permission named in the alert's labels to that function's list in
      `infra/roles.json` and apply Terraform (or run `tpuprov why` on the JobSet to see the line).
    EOT
  }
}

resource "google_monitoring_alert_policy" "stockouts" {
  project               = var.project_id
  display_name          = "tpu-provisioner (${var.topic_prefix}): repeated TPU stockouts"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "More than ${local.alert_stockouts} stockouts of one JobSet in 30 minutes"
    condition_threshold {
      filter          = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.this["gke_stockouts"].name}\" AND resource.type=\"cloud_run_revision\""
      comparison      = "COMPARISON_GT"
      threshold_value = local.alert_stockouts
      duration        = "0s"
      aggregations {
        alignment_period     = "1800s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        # A JobSet's namespace/name repeats across a fleet's clusters: the cluster tells them apart.
        group_by_fields = ["metric.label.jobset", "metric.label.zone", "metric.label.cluster"]
      }
    }
  }

  alert_strategy {
    auto_close = "3600s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      GKE keeps failing to provision this JobSet's slices because the zone has no capacity for the
      shape. Each failed pool is deleted by reconcile and requested again, so the job stays pending.

      What to do: tell the JobSet's owner. Options are a reservation (`cloud.google.com/reservation-name`),
      Spot capacity, another zone in `node_locations`, or a smaller or different shape. The pool's
      status message is in the reconcile `release.deleted` line ("GKE could not provision it: ...").
    EOT
  }
}

resource "google_monitoring_alert_policy" "errors" {
  project               = var.project_id
  display_name          = "tpu-provisioner (${var.topic_prefix}): function answering 5xx"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "More than ${local.alert_error_ratio * 100}% of a function's requests answered 5xx for 15 minutes"
    condition_threshold {
      filter             = "metric.type=\"run.googleapis.com/request_count\" AND resource.type=\"cloud_run_revision\" AND resource.label.service_name=monitoring.regex.full_match(\"${local.services_regex}\") AND metric.label.response_code_class=\"5xx\""
      denominator_filter = "metric.type=\"run.googleapis.com/request_count\" AND resource.type=\"cloud_run_revision\" AND resource.label.service_name=monitoring.regex.full_match(\"${local.services_regex}\")"
      comparison         = "COMPARISON_GT"
      threshold_value    = local.alert_error_ratio
      duration           = "900s"
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.service_name"]
      }
      denominator_aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.service_name"]
      }
    }
  }

  alert_strategy {
    auto_close = "1800s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      A function keeps failing its deliveries. 503 is the product asking Pub/Sub for a redelivery
      (a transient GKE or Kubernetes error: `delivery.retry` lines say which); 500 is a bug (the
      traceback is in the service's ERROR lines). Either way messages are piling up towards the
      dead-letter topic.

      What to do: open the service's logs at ERROR and above. For 503s check GKE's health, quotas and
      the cluster's operations (another operation in progress makes creates wait); for 500s, roll
      back to the previous image and file the traceback.
    EOT
  }
}

resource "google_monitoring_alert_policy" "reconcile_missing" {
  project               = var.project_id
  display_name          = "tpu-provisioner (${var.topic_prefix}): reconcile not running"
  combiner              = "OR"
  notification_channels = var.alert_notification_channels
  user_labels           = local.labels

  conditions {
    display_name = "No request to the reconcile service"
    condition_absent {
      filter   = "metric.type=\"run.googleapis.com/request_count\" AND resource.type=\"cloud_run_revision\" AND resource.label.service_name=\"${module.function["reconcile"].service_name}\""
      duration = local.alert_reconcile_missing
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
        group_by_fields      = ["resource.label.service_name"]
      }
    }
  }

  conditions {
    display_name = "No completed reconcile sweep"
    condition_absent {
      filter   = "metric.type=\"logging.googleapis.com/user/${google_logging_metric.this["reconcile_sweeps"].name}\" AND resource.type=\"cloud_run_revision\""
      duration = local.alert_reconcile_missing
      aggregations {
        alignment_period     = "300s"
        per_series_aligner   = "ALIGN_DELTA"
        cross_series_reducer = "REDUCE_SUM"
      }
    }
  }

  alert_strategy {
    auto_close = "3600s"
  }

  documentation {
    mime_type = "text/markdown"
    content   = <<-EOT
      The reconcile safety net has not run (no request) or not finished a sweep (no `reconcile.summary`
      line) for 20 minutes. Lost or failed events are then not repaired: leaked pools keep billing
      and missed slices are not requested.

      What to do: check the Cloud Scheduler job `<prefix>-reconcile` (paused? failing to publish?),
      the reconcile push subscription or trigger, and the reconcile service's ERROR lines (a crash
      before the summary). `gcloud scheduler jobs run <prefix>-reconcile --location=REGION` starts a
      sweep by hand.
    EOT
  }
}
