"""One module per task, each its pipeline (CPU steps, model steps and a per-photo finish) and options.

Imports `sapiens2.outputs`, `sapiens2.vision`, `sapiens2.models` and the base modules; never the registry
above it (`sapiens2.tasks`), which it sees through `pipelines.context.TaskSpec`."""
