"""The local topology provider: Redis Cluster, Tansu and its S3 server as host processes under the run
directory (host_topology.py), their node classes (redis_processes.py, tansu.py), moto with its LIST cost
memoized (s3_stand_in.py), and the topology kept between seeds (keeper.py)."""
