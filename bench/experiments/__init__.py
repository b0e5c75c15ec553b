"""Component benchmarks: one question each, run as ``python -m dataflow.bench.experiments.NAME``.

They answer questions the bench tool (``python -m dataflow.bench``) does not ask; their
results, with the commands that produced them, are in ``bench/RESULTS.md``.

* :mod:`.readers`: the data plane's shard readers beside pyarrow's and webdataset's.
* :mod:`.transport`: P1, server -> client throughput of large batches beside raw pyzmq.
* :mod:`.trainer_cpu`: P2, trainer-process CPU per batch beside torch's DataLoader, by thread.
* :mod:`.decode`: a JPEG decode + crop workload (:mod:`.jpeg`) in the server's transform
  beside torch's workers, and the offload case.
* :mod:`.cache`: the readers' decoded-sample cache on the JPEG workload: epochs, a sweep of
  jobs, LRU against Belady's rule.
* :mod:`.shuffle`: how the plan's shuffle modes mix (:mod:`.mixing`) and what they cost.
* :mod:`.s3start`: a server's start on S3, bytes fetched before ready (:mod:`.s3local`: S3 on
  loopback, also used by the integration tests).
* :mod:`.s3cache`: the remote block cache beside fsspec's caches; :mod:`.s3retry`: retries
  beside botocore's retry modes; :mod:`.probe`: the cost of a health probe process.

An experiment may use the tool's modules (``dataflow.bench.torch_datasets``,
``dataflow.bench.procs``); the tool never imports an experiment.
"""
