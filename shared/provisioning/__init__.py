"""Domain services that create, release and reconcile TPU node pools over the cloud ports."""
