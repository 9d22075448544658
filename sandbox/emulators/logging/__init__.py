"""Cloud Logging stand-ins: the sink filter language and the log router (the LogEntry builders are
``shared.events.entries``, which ``tpuprov publish`` uses too)."""
