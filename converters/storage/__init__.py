"""Object storage, both sides: the native client (Azure Blob, S3, GCS through obstore) behind
fsspec's interface, range reads with a connection budget, the disk cache that cannot be
stale, and uploads. Nothing in here imports the rest of trainfeed but its errors and redaction.

- ``config``: storage options in fsspec's names -> object_store's (for obstore and delta-rs)
- ``client``: the obstore library this process may call (a forked process loads its own copy)
- ``native``: ``NativeFileSystem``, object identity, conditional range reads
- ``filesystems``: which file system a path or URL opens
- ``fetch``: ``Fetcher``, ``CacheWriter``, ``Span``, ``RangeFile`` (what pyarrow and h5py read through)
- ``cache``: ``DiskCache`` (it owns its folder)
- ``upload``: parts uploaded while the writer goes on
"""
