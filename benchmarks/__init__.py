"""trainfeed's measuring side: synthetic datasets, the storage A/B matrix, reports."""
