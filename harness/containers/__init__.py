"""The containers topology provider: the local topology's parts as containers on the run's own Podman
(engine.py, sandbox.py), their images (images.py), node handles (node.py), the topology (topology.py) and an
external broker as a container (target.py)."""
