"""Where samples come from: listing a small-file dataset (local or any fsspec URL), decoding its
files, and their labels."""
