"""Replicas: N independent copies of every served model inside one engine process.

`replicas` holds the replica set (add, drain, look up, readiness); `startup` models how
long a replica takes to become ready. Neither knows gRPC, HTTP or Prometheus: the service
layer gives the fleet a factory for whatever a replica runs on.
"""
