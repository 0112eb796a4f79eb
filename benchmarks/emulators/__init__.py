"""Object-storage servers on loopback (Azurite, S3 API servers, a latency-shaped local server) for
the A/B and the tests."""
