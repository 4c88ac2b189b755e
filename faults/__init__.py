"""The nemesis: fault kinds (process, Redis, network, client, failure paths, link faults through a
toxiproxy-API proxy), their selectors of nodes and network groups, Redis Cluster's view of itself as faults read it, and the runner
that plays a schedule."""
