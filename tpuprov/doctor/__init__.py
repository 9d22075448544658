"""``tpuprov doctor``: check a deployment as deployed (ports: ``views``; checks: ``checks``)."""
