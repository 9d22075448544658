"""The product end to end on the real Kubernetes components (``sandbox.realstack.core.RealStack``)."""
