"""The sandbox's ``tpuprov`` subcommands: ``demo``, ``sandbox {up,demo,doctor}`` and ``bench``.

They run the product on this machine (the real Kubernetes components, the emulators), so they belong
to the sandbox, not the CLI: ``tpuprov`` finds them through the ``tpuprov.commands`` entry-point group
(``pyproject.toml``) and never imports ``sandbox`` itself. An install without the sandbox simply has
no such subcommands.
"""
