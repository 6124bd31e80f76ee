"""Replicas: N independent copies of every served model inside one engine process.

`replicas` holds the replica set (add, drain, look up, readiness); `runtime` is what a
replica runs on (its core, its pacer, the queue state it announces); `startup` models how
long a replica takes to become ready. None knows gRPC, HTTP or Prometheus: the service
layer gives the fleet a factory that builds each runtime with its metrics.
"""
