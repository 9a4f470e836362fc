"""Batch scoring: point-in-time features through the model's FeatureService (or, for a model without one,
the input's own columns named by its signature), predictions in bounded chunks (in process or on
Dask), output published atomically and idempotently per run id.

    input_check    the input's files, columns and types before any write; its values (Great Expectations)
                   before the publish
    model_columns  a model's own input columns (its signature) and the parquet types each accepts
    chunks         one chunk: its slice of the input, features, predictions, files
    engines        where chunks run: local, or Dask distributed
    output_layout  the output's layout, staging and the one-rename publish
    job            a run from start to publish (``score_dataset``)
"""

from serving.batch.engines import DaskOptions
from serving.batch.input_check import BatchInputError
from serving.batch.job import BatchResult, Progress, resolve_model, score_dataset

__all__ = ["BatchInputError", "BatchResult", "DaskOptions", "Progress", "resolve_model", "score_dataset"]
