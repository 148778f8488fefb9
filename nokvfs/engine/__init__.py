"""The logical shard: one LMDB environment implementing the NoKV workspace schema.

`Shard` (shard.py) owns the environment; `MetadataCommand` (command.py) is the only write path for
metadata families; `ReadView` (mvcc.py) reads at the current or any retained version; scan.py
holds the bounded delimiter and prefix scans.
"""
