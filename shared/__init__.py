"""tpu-provisioner shared library: exactly what the Cloud Run functions import, one subpackage per layer.

Layers, lowest first (enforced by the import-linter contracts in ``pyproject.toml``)::

    core                          errors, settings, logs, labels, names
    events | tpu                  event decoding; TPU catalog, slices, node-pool types, JobSet knowledge
    cloud                         ports and the GKE / Kubernetes adapters, retries
    provisioning | kueue | setup  the domain services
    app                           the Cloud Run face: entry point and handlers

Modules import heavy Google/Kubernetes client libraries lazily so that a function's cold
start only pays for what the event in hand needs. Nothing here imports ``tpuprov`` or ``sandbox``.
"""
