"""trainfeed's read side: stores -> batches -> PyTorch / TensorFlow training with step accounting."""
