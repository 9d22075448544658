"""Cloud Logging stand-ins: LogEntry builders, the sink filter language, and the log router."""
