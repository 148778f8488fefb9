"""nokvfs: the NoKV workspace schema on LMDB, an object store for artifact bytes, and a FUSE mount."""

__version__ = "0.1.0"
