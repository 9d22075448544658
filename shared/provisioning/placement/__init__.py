"""Where in the fleet a job runs and buys: ``multikueue`` (one worker of Kueue's MultiKueue per job)."""
