"""Replicas: N independent copies of every served model inside one engine process.

`rules` are the fleet's rules over replica state, told the time (indices, readiness,
scaling, lookup, the rows /control/replicas shows): no event loop, pacer or RPC, so the
virtual-time lab (experiments.virtual) runs the same ones; `replicas` holds the replica
set on the loop's clock and orders each replica's lifecycle; `runtime` is what a
replica runs on (its core, its pacer, the queue state it announces); `startup` models how
long a replica takes to become ready. None knows gRPC, HTTP or Prometheus: the service
layer gives the fleet a factory that builds each runtime with its metrics.
"""
