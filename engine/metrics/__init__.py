"""The engine's metrics, below the service so that every driver of a core can keep them
(the served engine's pacer and service, the virtual-time lab):

  series      the table: names, types, help, labels, what turns a series on, buckets
  buckets     the histograms' boundaries (vLLM's plus a finer grid)
  updates     one replica's numbers and their update points (per step, per finish, ...)
  exposition  every replica's numbers as Prometheus text via prometheus-client
              (`MetricsRegistry`)

Imports the simulation core and common code only: no event loop, RPC or HTTP.
"""
