"""The projection model behind the report: measured inputs, projections, verdicts, advice and
remedies, instances and prices."""
