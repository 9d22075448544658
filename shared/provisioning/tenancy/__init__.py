"""Who may have what: a pod proven its JobSet's (``ownership``), what the operator allows a create to
be (``guardrails``) and who may spend how much (``spending``). See docs/trust.md.
"""
