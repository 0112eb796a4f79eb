"""Object storage, both sides: the native client (Azure Blob, S3, GCS through obstore) behind
fsspec's interface, range reads with a connection budget, the disk cache that cannot be
stale, and uploads. Nothing in here imports the rest of trainfeed but its errors and redaction.

- ``clouds``: the registry of clouds (``cloud_for(scheme)``, ``register_cloud``), ``StorageOptions``
- ``azure``, ``s3``, ``gcs``: the built-in clouds (registered here, as the package is imported)
- ``config``: storage options in fsspec's names -> object_store's; every URL checked
- ``client``: the obstore library this process may call (a forked process loads its own copy)
- ``native``: ``NativeFileSystem``, object identity, conditional range reads
- ``filesystems``: which file system a path or URL opens
- ``fetch``: ``Fetcher``, ``Span``, ``RangeFile`` (what pyarrow and h5py read through)
- ``cache_writer``: ``CacheWriter`` (the disk cache's writer thread), ``flush_cache_writes``
- ``cache``: ``DiskCache`` (it owns its folder)
- ``upload``: parts uploaded while the writer goes on
"""
from trainfeed.converters.storage import azure, gcs, s3
from trainfeed.converters.storage.clouds import register_cloud

for _built_in in (azure.CLOUD, s3.CLOUD, gcs.CLOUD):
    register_cloud(_built_in)
