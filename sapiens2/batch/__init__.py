"""The batch engine the command line, videos and Ray share: inputs and their output places, the local run
and its report, videos frame by frame, and the same run on a Ray cluster (`batch.cluster`).

Imports `sapiens2.runtime` and everything below it."""
