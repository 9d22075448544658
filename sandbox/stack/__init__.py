"""The parts of a sandbox stack that do not depend on which cluster it runs on: its configuration,
the Pub/Sub wiring infra declares, the functions as processes, the timeline and the summary.
``sandbox.realstack`` assembles them with the real Kubernetes components into the running stack.
"""
