"""tpu-provisioner shared library: everything the Cloud Run functions do lives here.

Modules import heavy Google/Kubernetes client libraries lazily so that a function's cold
start only pays for what the event in hand needs.
"""
