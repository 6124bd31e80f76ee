"""Capacity experiments: reference concurrency controllers, a scripted scenario runner
that drives a server over HTTP, per-request records, an oracle from the offline simulator,
and a report with plots. `inference-lab experiment` is its command line.

Layering: under the CLI, beside the services; it talks to servers over HTTP only and uses
the engine's offline driver (inference_lab.engine.drivers.offline) for the oracle.
"""
