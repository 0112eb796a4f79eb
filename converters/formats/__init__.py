"""Store formats: one module per format (Parquet, Delta Lake, HDF5, small files read in place, tables
other tools wrote), each with its reader and writer side by side and the object it registers;
``interface`` says what a format offers, ``registry`` names them."""
