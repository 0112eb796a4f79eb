"""trainfeed's write side: small-file sources in, compacted Parquet / Delta / HDF5 stores out."""
__version__ = "0.1.0"
