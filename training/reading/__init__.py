"""Reading stores for training: one read engine for every format, image decoding, and the Petastorm and
tf.data-service paths."""
